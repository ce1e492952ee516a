"""minigrad's GPU code paths: device placement, copies between devices, a generator per GPU, pinned
copies on a copy stream, index checks and training steps that never wait for the GPU.

Every test runs on the fake CuPy (``tests/fakes/fake_cupy.py``, two devices, no GPU needed) and,
marked ``gpu``, on the real one; tests that read the fake's event log run on the fake only.
Device 0 stays current throughout, so an op that launched a kernel anywhere but on its tensors'
GPU would fail (the fake refuses like CuPy without peer access; on real GPUs CuPy's peer-access
warning is turned into an error).
"""

from __future__ import annotations

import contextlib
import sys
import warnings

import numpy as np
import pytest
from fakes import fake_cupy

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.backend import device as device_mod
from minigrad.backend import device_checks
from minigrad.backend.device import as_device
from minigrad.backend.rng import get_rng
from minigrad.backend.transfer import is_pinned, pin_memory
from minigrad.data import DataLoader, SequentialSampler
from minigrad.data.dataset import ArrayDataset


@pytest.fixture(params=["fake", pytest.param("cuda", marks=pytest.mark.gpu)])
def cp(request):
    """The CuPy module under test, with device 0 current; the fake has two devices."""
    if request.param == "fake":
        with fake_cupy.installed(2) as fake:
            yield fake
        return
    import cupy  # noqa: PLC0415  (only on GPU machines)

    with warnings.catch_warnings():
        warnings.simplefilter("error", cupy._util.PerformanceWarning)  # peer access = wrong GPU
        warnings.simplefilter("ignore", FutureWarning)  # cupyx.allow_synchronize is deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        with cupy.cuda.Device(0):
            yield cupy


@pytest.fixture
def two_gpus(cp):
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    return cp


def _device_of(t: mg.Tensor) -> int:
    return t.data.device.id


def _mlp_loss(x, y, params):
    w1, b1, w2, b2 = params
    return F.nn.cross_entropy(F.matmul(F.relu(F.matmul(x, w1) + b1), w2) + b2, y)


def test_ops_forward_and_backward_run_on_their_gpu(two_gpus):
    cp = two_gpus
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in [(4, 5), (5,), (5, 3), (3,)]]
    x, y = rng.standard_normal((6, 4)), np.array([0, 2, 1, 1, 0, 2], np.int32)

    def grads(device):
        params = [mg.Parameter(a, dtype="float64", device=device) for a in arrays]
        gm = ad.GradManager().attach(params)
        with gm:
            loss = _mlp_loss(mg.tensor(x, device=device), mg.tensor(y, device=device), params)
            gm.backward(loss)
        return loss, [p.grad for p in params]

    loss, got = grads("gpu1")
    assert cp.cuda.runtime.getDevice() == 0  # ops made gpu1 current only while they ran
    assert loss.device == "gpu1" and _device_of(loss) == 1
    assert all(g.device == "gpu1" and _device_of(g) == 1 for g in got)
    ref_loss, ref = grads("cpu0")
    np.testing.assert_allclose(loss.item(), ref_loss.item(), rtol=1e-12)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-12)


def test_to_copies_between_cpu_and_gpus_with_the_right_device(cp):
    x = mg.tensor([1.0, 2.0], device="cpu0")
    gm = ad.GradManager().attach([x])
    with gm:
        g = x.to("gpu0")  # the copy op's output is on the target device (it used to be cpu0)
        assert g.device == "gpu0" and isinstance(g.data, cp.ndarray) and _device_of(g) == 0
        back = (g * 3).to("cpu0")
        assert back.device == "cpu0" and type(back.data) is np.ndarray
        gm.backward(back.sum())
    assert x.grad.device == "cpu0" and x.grad.numpy().tolist() == [3.0, 3.0]
    assert mg.tensor(cp.ones(2)).device == "gpu0"  # a CuPy array says where it lives


def test_to_copies_from_one_gpu_to_another(two_gpus):
    a = mg.tensor(np.arange(3.0), device="gpu1")
    b = a.to("gpu0")
    assert b.device == "gpu0" and _device_of(b) == 0 and b.numpy().tolist() == [0.0, 1.0, 2.0]
    c = (b + 1).to("gpu1")
    assert c.device == "gpu1" and _device_of(c) == 1


def test_factories_and_random_draws_land_on_the_requested_gpu(two_gpus):
    assert _device_of(mg.zeros((2, 3), device="gpu1")) == 1
    assert _device_of(F.arange(4, device="gpu1")) == 1
    assert _device_of(mg.random.normal(size=(3,), device="gpu1")) == 1
    assert _device_of(F.nn.dropout(mg.ones((8,), device="gpu1"), 0.5)) == 1
    assert _device_of(mg.random.permutation(5, device="gpu1")) == 1


def test_each_gpu_has_its_own_generator_seeded_alike(two_gpus):
    def draws():
        mg.random.seed(3)
        out = []
        for name in ("gpu0", "gpu1", "gpu0"):
            with as_device(name).context():
                out.append(get_rng(name).standard_normal(4).get())
        return out

    first, second = draws(), draws()
    assert get_rng("gpu0") is not get_rng("gpu1")
    np.testing.assert_array_equal(first[0], first[1])  # one seed for every GPU (torch's rule)
    assert not np.array_equal(first[0], first[2])  # gpu0's stream went on
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


def test_index_checks_on_a_gpu_wait_for_the_next_read(cp):
    w = mg.tensor(np.ones((5, 2)), device="gpu0")
    bad = mg.tensor(np.array([0, 7], np.int32), device="gpu0")
    logits = mg.tensor(np.zeros((2, 5)), device="gpu0")
    with _allow_sync(cp, False):
        out = F.embedding(bad, w)  # no wait for the GPU here
        F.nn.cross_entropy(logits, bad)
    with pytest.raises(IndexError, match=r"embedding: indices must be in \[0, 5\), got min 0 "
                                         r"max 7") as caught:
        out.numpy()  # the first failure is raised, the later ones of that read are dropped
    assert "found on gpu0 when its values were next read" in str(caught.value)
    out.numpy()  # nothing left
    with _allow_sync(cp, False):
        F.nn.cross_entropy(logits, bad)
    with pytest.raises(ValueError, match=r"cross_entropy: labels must be in \[0, 5\)"):
        mg.backend.synchronize("gpu0")


def test_unread_checks_are_read_after_max_pending(cp, monkeypatch):
    monkeypatch.setattr(device_checks, "MAX_PENDING", 3)
    ids = mg.tensor(np.array([1, 2], np.int32), device="gpu0")
    for _ in range(2):
        F.one_hot(ids, 3)
    with pytest.raises(ValueError, match="one_hot: values must be in"):
        F.one_hot(ids, 2)  # the third pending check triggers the read


def test_a_training_step_never_waits_for_the_gpu(cp):
    """Embedding, dropout, batch norm, cross entropy, clipping and LAMB: no host
    synchronisation until the loss is read."""
    mg.random.seed(0)
    with _default_device("gpu0"):
        model = M.Sequential(M.Embedding(10, 8), M.Flatten(), M.Linear(24, 16),
                             M.BatchNorm1d(16), M.ReLU(), M.Dropout(0.1), M.Linear(16, 5))
    assert all(p.device == "gpu0" for p in model.parameters())
    opt = optim.LAMB(model.parameters(), lr=1e-2, weight_decay=0.01)
    gm = ad.GradManager().attach(model.parameters())
    rng = np.random.default_rng(0)
    ids = mg.tensor(rng.integers(0, 10, (6, 3)).astype(np.int32), device="gpu0")
    labels = mg.tensor(rng.integers(0, 5, 6).astype(np.int32), device="gpu0")
    losses = []
    with _allow_sync(cp, False):
        for _ in range(3):
            with gm:
                loss = F.nn.cross_entropy(model(ids), labels)
                gm.backward(loss)
            optim.clip_grad_norm(model.parameters(), max_norm=0.5)
            opt.step().clear_grad()
            losses.append(loss)
    values = [v.item() for v in losses]
    assert np.isfinite(values).all() and len(set(values)) == 3  # it trained


def test_a_scaled_step_waits_for_the_gpu_once(cp, monkeypatch):
    """A GradScaler's step (PyTorch's spelling) reads one array for all gradients' overflow
    check: forward and backward never wait, ``scaler.step`` waits once (counted on the fake),
    and an inf in one gradient still skips the step and names that parameter."""
    import minigrad.amp as amp  # noqa: PLC0415

    with _default_device("gpu0"):
        model = M.Sequential(M.Linear(6, 8), M.ReLU(), M.Linear(8, 8), M.ReLU(), M.Linear(8, 2))
    opt = optim.SGD(model.parameters(), lr=0.1)
    gm = ad.GradManager().attach(model.parameters())
    scaler = amp.GradScaler(init_scale=2.0**8, module=model)
    x = mg.tensor(np.random.default_rng(0).standard_normal((4, 6)), "float32", device="gpu0")
    for poison in (False, False, True):
        with _allow_sync(cp, False):
            with gm:
                loss = (model(x) ** 2).mean()
                gm.backward(scaler.scale(loss))
        if poison:
            g = model[2].weight.grad
            g.data[0, 0] = float("inf")
        before = [p.numpy() for p in model.parameters()]
        if hasattr(cp, "syncs"):
            cp.syncs.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", amp.OverflowWarning)
            scaler.step(opt)
            scaler.update()
        if hasattr(cp, "syncs"):
            assert len(cp.syncs) == 1, cp.syncs
        moved = [not np.array_equal(b, p.numpy()) for b, p in zip(before, model.parameters())]
        assert all(moved) != poison and any(moved) != poison
        opt.clear_grad()
    assert scaler.last_overflow.tensors == {0: ["2.weight"]}
    assert scaler.get_scale() == 2.0**7


def test_clipping_and_lamb_on_a_gpu_match_the_cpu(cp):
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((4, 3)), rng.standard_normal(3)]
    results = {}
    for device in ("cpu0", "gpu0"):
        params = [mg.Parameter(a, dtype="float64", device=device) for a in arrays]
        for p in params:
            p.grad = mg.tensor(np.full(p.shape, 2.0), device=device)
        total = optim.clip_grad_norm(params, max_norm=1.0)
        optim.LAMB(params, lr=0.1, weight_decay=0.1).step()
        results[device] = [total.numpy()] + [p.numpy() for p in params]
    for a, b in zip(results["cpu0"], results["gpu0"]):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def _allow_sync(cp, allow: bool):
    """``cupyx.allow_synchronize`` of the CuPy under test."""
    if hasattr(cp, "cupyx"):  # the fake
        return cp.cupyx.allow_synchronize(allow)
    import cupyx  # noqa: PLC0415  (only on GPU machines)

    return cupyx.allow_synchronize(allow)


# -- pinned memory and the copy stream (the fake's event log) -------------------------------------


@pytest.fixture
def fake():
    with fake_cupy.installed(2) as cp:
        yield cp


def test_a_pinned_batch_travels_on_the_copy_stream_before_it_is_used(fake):
    batch = pin_memory({"x": np.arange(6.0).reshape(2, 3), "names": ["a", "b"]})
    assert is_pinned(batch["x"]) and batch["names"] == ["a", "b"]
    fake.clear()
    y = mg.tensor(batch["x"], device="gpu0") * 2
    events = fake.events
    copy = next(i for i, e in enumerate(events) if e.startswith("h2d pinned on gpu0:s"))
    stream = events[copy].split()[-1]
    record = next(i for i, e in enumerate(events) if e.startswith("record") and stream in e)
    event = events[record].split()[1]
    wait = events.index(f"gpu0:null waits {event}")
    launch = events.index("launch multiply on gpu0:null")
    assert copy < record < wait < launch  # copy, then the compute stream waits, then it computes
    assert fake.syncs == [] and y.numpy().tolist() == [[0, 2, 4], [6, 8, 10]]
    fake.clear()
    mg.tensor(np.ones(3), device="gpu0")  # pageable memory: plain asarray on the current stream
    assert fake.events == ["h2d pageable on gpu0:null"]



def test_a_pinned_copy_never_overwrites_memory_the_compute_stream_may_still_read(fake):
    x = mg.tensor(np.ones(1000), device="gpu0")
    y = x * 2  # queued on the compute stream: it reads x's block
    del x  # the block returns to the compute stream's pool arena, the kernel may still run
    batch = pin_memory(np.arange(1000.0))
    reused = len(fake.pool.reused)
    # the batch's device memory is that block again; the copy stream must not write it before the
    # compute stream is past the kernel (the fake raises UnorderedAccess otherwise)
    z = mg.tensor(batch, device="gpu0")
    assert len(fake.pool.reused) == reused + 1 and z.data._block is fake.pool.reused[-1]
    assert (z.numpy() == batch).all() and (y.numpy() == 2).all()


def test_a_pinned_batch_stays_alive_until_its_copy_is_done():
    import weakref  # noqa: PLC0415

    with fake_cupy.installed(1, manual_completion=True) as fake:
        batch = pin_memory(np.arange(4.0))
        alive = weakref.ref(batch)
        first = mg.tensor(batch, device="gpu0")
        del batch
        mg.tensor(pin_memory(np.ones(4)), device="gpu0")
        assert alive() is not None  # the copy engine may still read it: not back in the pool
        fake.release()  # the GPU finishes
        mg.tensor(pin_memory(np.ones(4)), device="gpu0")
        assert alive() is None
        assert first.numpy().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_dataloader_pins_batches(fake):
    data = ArrayDataset(np.arange(12.0).reshape(6, 2), np.arange(6))
    loader = DataLoader(data, SequentialSampler(data, batch_size=4), pin_memory=True)
    batches = list(loader)
    assert "pin_memory=True" in repr(loader)
    assert all(is_pinned(a) for batch in batches for a in batch)
    np.testing.assert_array_equal(batches[1][0], [[8.0, 9.0], [10.0, 11.0]])


def test_dataloader_pin_memory_without_a_gpu_warns_once(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, even on a GPU machine
    monkeypatch.setattr(device_mod, "_probe", None)
    data = ArrayDataset(np.arange(4.0))
    with pytest.warns(RuntimeWarning, match="pin_memory=True but no GPU is usable"):
        loader = DataLoader(data, pin_memory=True)
    assert not any(is_pinned(b[0]) for b in loader)


@contextlib.contextmanager
def _default_device(name: str):
    """New tensors (a model's parameters) go to ``name`` inside the block."""
    mg.set_default_device(name)
    try:
        yield
    finally:
        mg.set_default_device("cpu0")


class _TwoEqualRanks(M.normalization.StatsReducer):
    """A two-rank world whose other rank holds the same batch: sums double."""

    def world_size(self, group) -> int:
        return 2

    def sum(self, tensor, group):
        return tensor * 2


def test_sync_batch_norm_keeps_its_count_on_the_gpu(cp):
    x = np.random.default_rng(2).standard_normal((4, 3, 2))
    results = {}
    for device in ("cpu0", "gpu0"):
        with _default_device(device):
            bn = M.SyncBatchNorm(3)
        previous = M.normalization.set_stats_reducer(_TwoEqualRanks())
        try:
            with _allow_sync(cp, False):
                y = bn(mg.tensor(x, dtype="float32", device=device))
        finally:
            M.normalization.set_stats_reducer(previous)
        results[device] = [y.numpy(), bn.running_var.numpy()]
    for a, b in zip(results["cpu0"], results["gpu0"]):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    n = 2 * 4 * 2  # both ranks' values per channel: the unbiased variance uses n / (n - 1)
    var = x.transpose(1, 0, 2).reshape(3, -1).var(axis=1)
    np.testing.assert_allclose(results["gpu0"][1].reshape(-1), 0.9 + 0.1 * var * n / (n - 1),
                               rtol=1e-5)


def test_cupy_array_recognised_before_minigrad_loads_cupy(monkeypatch):
    """A program that imports CuPy itself and hands ``cupy.asarray(...)`` to a collective before
    minigrad ever asked for CuPy (a fresh rank of ``gpu_jobs.cupy_collectives``): the array is
    still a CuPy array, not "expected a NumPy or CuPy array, got ndarray"."""
    from minigrad.backend import xp  # noqa: PLC0415
    from minigrad.distributed.comm.arrays import check_array  # noqa: PLC0415

    with fake_cupy.installed(1) as fake:
        x = fake.ones(3, dtype=fake.float32)
    monkeypatch.setattr(xp, "_cupy", None)
    monkeypatch.setattr(xp, "_cupy_checked", False)  # minigrad has not asked for CuPy yet
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert xp.is_cupy_array(x)
    check_array("all_gather", x)  # accepted
    monkeypatch.delitem(sys.modules, "cupy")
    assert not xp.is_cupy_array(x)
    with pytest.raises(TypeError, match="all_gather: expected a NumPy or CuPy array"):
        check_array("all_gather", x)


def test_a_transformer_step_launches_no_avoidable_kernels(fake):
    """One training step of a pre-norm Transformer block (the GPU benchmark's model, small) on the
    fake: the kernels a GPU step launches, counted, since host-side cost per launch bounds such a
    step on a GPU. No per-part copies of the head gradients (``setitem``), no negation of a
    label's gradient nobody wants, one kernel each way for the loss, one optimizer launch for
    the twelve parameters; the attention's copies are the split, k^T and the merge forward and
    the merge, v^T and the head gradients backward."""
    d, heads, seq, batch, hidden = 8, 2, 4, 2, 16
    rng = np.random.default_rng(0)

    def param(*shape, scale=0.3):
        return mg.Parameter((rng.standard_normal(shape) * scale).astype(np.float32),
                            device="gpu0")

    p = {"w_qkv": param(3 * d, d), "b_qkv": param(3 * d), "w_o": param(d, d), "b_o": param(d),
         "w_fc1": param(hidden, d), "b_fc1": param(hidden), "w_fc2": param(d, hidden),
         "b_fc2": param(d), "g1": param(d), "b1": param(d), "g2": param(d), "b2": param(d)}
    x = mg.tensor(rng.standard_normal((batch, seq, d)).astype(np.float32), device="gpu0")
    y = mg.tensor(rng.standard_normal((batch, seq, d)).astype(np.float32), device="gpu0")
    gm = ad.GradManager().attach(list(p.values()))
    opt = optim.SGD(list(p.values()), lr=0.01, momentum=0.9)

    def step():
        with gm:
            h = F.layer_norm(x, d, True, p["g1"], p["b1"])
            h = x + F.multi_head_attention(h, h, h, heads, p["w_qkv"], p["b_qkv"], p["w_o"],
                                           p["b_o"], is_causal=True)
            f = F.gelu(F.linear(F.layer_norm(h, d, True, p["g2"], p["b2"]), p["w_fc1"],
                                p["b_fc1"]))
            loss = F.square_loss(h + F.linear(f, p["w_fc2"], p["b_fc2"]), y)
            gm.backward(loss)
        opt.step().clear_grad()

    step()  # momentum buffers are made on the first step
    fake.clear()
    step()
    launches = [e.split(" on ")[0].removeprefix("launch ") for e in fake.events
                if e.startswith("launch ")]
    counts = {k: launches.count(k) for k in set(launches)}
    assert fake.syncs == []
    assert "setitem" not in counts and "negative" not in counts, counts
    assert counts["ascontiguousarray"] == 6, counts
    assert "multiply" not in counts and counts["add"] == 7 and "sum" not in counts, counts
    assert counts["kernel column_sums"] == 4, counts  # the linear layers' bias gradients
    assert counts["kernel squared_error_sum"] == counts["kernel squared_error_grad"] == 1, counts
    assert counts["kernel sgd_steps"] == 1 and counts["matmul"] == 18, counts  # 12 parameters
    assert len(launches) == 54, counts
