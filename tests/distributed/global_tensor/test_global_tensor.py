"""Placement, SBP and global tensors: construction (to_global from local pieces, creation
functions), their OneFlow semantics (uneven splits, broadcast overwrites, check_meta), the
tensor API, Module.to_global, and the errors. Multi-rank cases run in one job per world size."""

import pickle

import numpy as np
import pytest
from global_tensor_helpers import CallCounter, assemble, sbp_of

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
from minigrad.distributed.global_tensor import sbp as sbp_module
from minigrad.distributed.global_tensor.boxing import plan_steps
from minigrad.testing.distributed import run_workers

B, S, PS = mg.sbp.broadcast, mg.sbp.split, mg.sbp.partial_sum


# -- one process -----------------------------------------------------------------------------------


def test_sbp_values():
    assert repr(S(1)) == "split(dim=1)" and repr(B) == "broadcast" and repr(PS) == "partial_sum"
    assert S(0) == S(0) and S(0) != S(1) and B != PS and hash(S(2)) == hash(S(2))
    assert pickle.loads(pickle.dumps(S(1))) == S(1) and pickle.loads(pickle.dumps(B)) is B
    with pytest.raises(ValueError, match="non-negative int"):
        S(-1)
    assert sbp_module.balanced_sizes(10, 4) == [3, 3, 2, 2]  # OneFlow: the first n % k get one more
    assert sbp_module.balanced_sizes(2, 3) == [1, 1, 0]
    # nested splits of one axis: mesh dim 0 cuts 10 rows 5/5, mesh dim 1 cuts each half 3/2
    sl = sbp_module.local_slices((10, 4), (S(0), S(0)), (2, 2), (1, 1))
    assert sl == (slice(8, 10), slice(0, 4))
    with pytest.raises(ValueError, match="needs 2 entries, got 1"):
        sbp_module.as_nd_sbp((S(0),), 2)
    with pytest.raises(ValueError, match="out of range for a tensor of rank 2"):
        sbp_module.as_nd_sbp(S(2), 1, 2)


def test_boxing_plans_reach_the_destination_with_valid_steps():
    kinds = [S(0), S(1), B, PS]
    for n in (2, 3):
        for src in np.ndindex(*(4,) * n):
            for dst in np.ndindex(*(4,) * n):
                src_sbp, dst_sbp = tuple(kinds[i] for i in src), tuple(kinds[i] for i in dst)
                state = src_sbp
                for d, frm, to, before in plan_steps(src_sbp, dst_sbp):
                    assert before == state and state[d] == frm
                    axes = {s.dim for s in (frm, to) if s.kind == "S"}
                    assert not any(s.kind == "S" and s.dim in axes for s in state[d + 1:])
                    state = state[:d] + (to,) + state[d + 1:]
                assert state == dst_sbp


def test_placement_in_one_process():
    p = mg.placement("cpu", [0])
    assert repr(p) == 'placement(type="cpu", ranks=[0])' and p.mesh_shape == (1,)
    assert p == mg.placement("cpu", ranks=[0]) and p != mg.placement("cuda", [0])
    assert mg.placement("gpu", [0]).type == "cuda"
    with pytest.raises(ValueError, match=r"distinct and in \[0, 1\) \(the job has 1 rank"):
        mg.placement("cpu", [0, 1])
    with pytest.raises(ValueError, match="type must be 'cpu' or 'cuda'"):
        mg.placement("tpu", [0])
    with pytest.raises(RuntimeError, match="must have placement and sbp parameters"):
        mg.tensor([1.0]).to_global(p)
    with pytest.raises(RuntimeError, match="creating a global tensor needs both placement and sbp"):
        mg.zeros((2,), placement=p)
    with pytest.raises(RuntimeError, match="expected a global tensor but got a local tensor"):
        mg.tensor([1.0]).to_local()
    x = mg.arange(6, placement=p, sbp=B).reshape(2, 3)
    assert x.is_global and x.sbp == (B,) and x.placement == p and x.shape == (2, 3)
    assert x.to_global(sbp=B) is x and x.to_global(sbp=B, copy=True) is not x
    assert "placement=placement(type=\"cpu\", ranks=[0])" in repr(x)


# -- several ranks ---------------------------------------------------------------------------------


def _creation():
    rank = dist.get_rank()
    P = mg.placement("cpu", [0, 1, 2, 3])
    mesh = mg.placement("cpu", [[0, 1], [2, 3]])
    out = {"shapes": mg.randn(10, 3, placement=P, sbp=S(0)).to_local().shape}
    for name in ("S0", "S1", "B", "P"):
        mg.random.seed(0)
        out[name] = mg.randn(10, 3, placement=P, sbp=sbp_of(name)).to_local().numpy()
    mg.random.seed(0)
    out["mesh"] = mg.randn(10, 3, placement=mesh, sbp=(S(0), S(1))).to_local().numpy()
    mg.random.seed(0)
    out["rand"] = mg.rand(10, 3, placement=P, sbp=S(1)).to_local().numpy()
    mg.random.seed(0)
    out["randint"] = mg.randint(0, 9, (10,), placement=P, sbp=S(0)).to_local().numpy()
    out["arange"] = mg.arange(10, placement=P, sbp=S(0)).to_local().numpy()
    out["full"] = mg.full((5, 2), 7.0, placement=P, sbp=S(0)).to_local().numpy()
    out["tensor"] = mg.tensor([[1.0, 2.0]] * 5, placement=P, sbp=S(0)).to_local().numpy()
    z = mg.zeros_like(mg.ones((5, 3), placement=mesh, sbp=(B, S(1))))
    out["zeros_like"] = (z.is_global, z.sbp, z.to_local().shape)
    return rank, out


def test_creation_functions_and_seeded_values_independent_of_the_sbp():
    res = dict(run_workers(_creation, 4))
    assert [res[r]["shapes"] for r in range(4)] == [(3, 3), (3, 3), (2, 3), (2, 3)]
    mg.random.seed(0)
    ref = mg.randn(10, 3).numpy()
    for name in ("S0", "S1", "B", "P"):
        got = assemble({r: res[r][name] for r in res}, (name,), [0, 1, 2, 3], ref.shape)
        np.testing.assert_array_equal(got, ref, err_msg=name)
    mesh = [[0, 1], [2, 3]]
    np.testing.assert_array_equal(assemble({r: res[r]["mesh"] for r in res}, ("S0", "S1"), mesh,
                                           ref.shape), ref)
    mg.random.seed(0)
    np.testing.assert_array_equal(assemble({r: res[r]["rand"] for r in res}, ("S1",), [0, 1, 2, 3],
                                           (10, 3)), mg.rand(10, 3).numpy())
    mg.random.seed(0)
    np.testing.assert_array_equal(
        assemble({r: res[r]["randint"] for r in res}, ("S0",), [0, 1, 2, 3], (10,)),
        mg.randint(0, 9, (10,)).numpy())
    for key, want in (("arange", np.arange(10)), ("full", np.full((5, 2), 7.0)),
                      ("tensor", np.array([[1.0, 2.0]] * 5))):
        got = assemble({r: res[r][key] for r in res}, ("S0",), [0, 1, 2, 3], want.shape)
        np.testing.assert_array_equal(got, want, err_msg=key)
    assert res[3]["zeros_like"] == (True, (B, S(1)), (5, 1))


def _local_to_global():
    rank = dist.get_rank()
    P = mg.placement("cpu", [0, 1])
    out = {}
    s = mg.tensor([0.0, 1.0]).to_global(P, S(0))  # OneFlow's docstring example
    out["split"] = (s.shape, s.numpy().tolist())
    mine = mg.tensor([0.0, 1.0] if rank == 0 else [5.0, 6.0])
    b = mine.to_global(P, B)
    out["broadcast"] = (b.to_local().tolist(), mine.tolist())  # rank 1's local is overwritten
    kept = mg.tensor([0.0, 1.0] if rank == 0 else [5.0, 6.0])
    kept.to_global(P, B, copy=True)
    out["copy"] = kept.tolist()
    part = mg.tensor([0.0, 1.0] if rank == 0 else [5.0, 6.0])
    out["partial"] = part.to_global(P, PS, check_meta=False).numpy().tolist()
    uneven = mg.tensor(np.ones((3 - rank, 2))).to_global(P, S(0))  # pieces of 3 and 2 rows
    out["uneven"] = uneven.shape
    errors = {}
    for name, fn in {
        "dtype": lambda: mg.tensor([1, 2] if rank else [1.0, 2.0]).to_global(P, B),
        "unbalanced": lambda: mg.tensor(np.ones((1 + 2 * rank, 2))).to_global(P, S(0)),
        "mixed": lambda: s + mg.tensor([1.0, 1.0, 1.0, 1.0]),
        "placements": lambda: s + mg.tensor([1.0] * 4, placement=mg.placement("cpu", [1, 0]),
                                            sbp=B),
        "nd sbp": lambda: mg.tensor([1.0]).to_global(mg.placement("cpu", [[0, 1]]), B),
    }.items():
        try:
            fn()
        except (ValueError, RuntimeError) as exc:
            errors[name] = str(exc)
    out["errors"] = errors
    return rank, out


def test_to_global_from_local_pieces():
    res = dict(run_workers(_local_to_global, 2))
    for rank in (0, 1):
        out = res[rank]
        assert out["split"] == ((4,), [0.0, 1.0, 0.0, 1.0])
        assert out["broadcast"] == ([0.0, 1.0], [0.0, 1.0])  # the first rank's data wins
        assert out["partial"] == [5.0, 7.0]
        assert out["uneven"] == (5, 2)
        e = out["errors"]
        assert "rank 1 passes a tensor of shape (2,) and dtype int32, rank 0 one of shape (2,) " \
               "and dtype float32" in e["dtype"]
        assert "rank 0's piece has shape (1, 2), but a logical shape (4, 2)" in e["unbalanced"]
        assert "Add: input 1 is a local tensor" in e["mixed"]
        assert "inputs are on different placements" in e["placements"]
        assert "mesh has 2 dimension(s), so the sbp needs 2 entries" in e["nd sbp"]
    assert res[0]["copy"] == [0.0, 1.0] and res[1]["copy"] == [5.0, 6.0]


class _Net(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(3, 4)
        self.bn = M.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(self.fc(x))


def _module_and_autodiff():
    rank = dist.get_rank()
    P = mg.placement("cpu", [0, 1])
    mg.random.seed(rank)  # different local weights: rank 0's win
    net = _Net()
    weight = net.fc.weight
    net.to_global(P, B)
    out = {"same object": net.fc.weight is weight,
           "all global": all(t.is_global for t in net.tensors()),
           "parameter": isinstance(net.fc.weight, mg.Parameter),
           "weight": net.fc.weight.numpy()}
    x = mg.tensor(np.arange(12.0).reshape(4, 3), dtype="float32", placement=P, sbp=S(0))
    gm = ad.GradManager().attach(net.parameters())
    with gm:
        loss = (F.relu(net.fc(x)) ** 2).mean()
        loss.backward()  # OneFlow style, while the manager records
    out["loss"] = loss.numpy()
    out["grad"] = (net.fc.weight.grad.sbp, net.fc.weight.grad.numpy())
    return rank, out


def test_module_to_global_and_backward():
    res = dict(run_workers(_module_and_autodiff, 2))
    for rank in (0, 1):
        out = res[rank]
        assert out["same object"] and out["all global"] and out["parameter"]
    mg.random.seed(0)
    ref = _Net()
    np.testing.assert_array_equal(res[1]["weight"], ref.fc.weight.numpy())
    x = mg.tensor(np.arange(12.0).reshape(4, 3), dtype="float32")
    gm = ad.GradManager().attach(ref.parameters())
    with gm:
        loss = (F.relu(ref.fc(x)) ** 2).mean()
        gm.backward(loss)
    for rank in (0, 1):
        np.testing.assert_allclose(res[rank]["loss"], loss.numpy(), rtol=1e-6)
        assert res[rank]["grad"][0] == (B,)
        np.testing.assert_allclose(res[rank]["grad"][1], ref.fc.weight.grad.numpy(), rtol=1e-5)


def _grad_sbp_and_skipping():
    rank = dist.get_rank()
    P = mg.placement("cpu", [0, 1])
    out = {}
    # global -> global with grad_sbp: the gradient is routed through broadcast (an all-reduce
    # instead of the adjoint's reduce-scatter); its value does not change
    x = mg.tensor(np.arange(6.0).reshape(3, 2), dtype="float64", placement=P, sbp=S(0))
    gm = ad.GradManager().attach([x])
    with gm:
        y = x.to_global(sbp=B, grad_sbp=B)
        loss = (y * y).sum()
        mg.distributed.global_tensor.set_lockstep_check(False)
        with CallCounter() as calls:
            gm.backward(loss)
        mg.distributed.global_tensor.set_lockstep_check(True)
    out["calls"] = calls.take()
    out["grad"] = x.grad.numpy()
    # local -> global: the local gradient is the piece in grad_sbp (default: sbp)
    for grad_sbp in (None, PS):
        local = mg.tensor([1.0, 2.0], dtype="float64")
        gm = ad.GradManager().attach([local])
        with gm:
            g = local.to_global(P, B, grad_sbp=grad_sbp)
            gm.backward((g * 3.0).sum())
        out[str(grad_sbp)] = local.grad.tolist()
    # ranks outside an op's placement skip its computation (at most the dtype of an op is found
    # on one-element stand-ins)
    P0 = mg.placement("cpu", [0])
    a = mg.randn(4, 4, placement=P0, sbp=B)
    sizes = []
    patched = [F.linalg.MatMul, F.elementwise.Exp]
    originals = [cls.forward for cls in patched]

    def counting(original):
        def forward(self, *args):
            sizes.append(max(x.size for x in args if isinstance(x, mg.Tensor)))
            return original(self, *args)
        return forward

    for cls, original in zip(patched, originals):
        cls.forward = counting(original)
    try:
        b = F.exp(a @ a)
    finally:
        for cls, original in zip(patched, originals):
            cls.forward = original
    out["sizes"], out["shape"], out["piece"] = sizes, b.shape, b.to_local().shape
    return rank, out


def test_grad_sbp_and_ranks_outside_the_placement():
    res = dict(run_workers(_grad_sbp_and_skipping, 2))
    want = 2 * np.arange(6.0).reshape(3, 2)
    for rank in (0, 1):
        out = res[rank]
        assert out["calls"] == {"all_reduce_sum": 1}, out["calls"]
        np.testing.assert_array_equal(out["grad"], want)
        assert out["None"] == [3.0, 3.0]  # OneFlow: every rank's local gets the gradient
        assert out["partial_sum"] == ([3.0, 3.0] if rank == 0 else [0.0, 0.0])
        assert out["shape"] == (4, 4)
    assert res[0]["sizes"] == [16, 16] and res[0]["piece"] == (4, 4)
    assert res[1]["sizes"] in ([], [1]) and res[1]["piece"] == (0,)


def test_random_factories_in_one_process():
    mg.random.seed(3)
    a = mg.randn(2, 3)
    mg.random.seed(3)
    b = mg.randn((2, 3), dtype="float64")
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    assert a.dtype == np.float32 and b.dtype == np.float64
    r = mg.randint(2, 5, (1000,))
    assert r.dtype == np.int32 and r.numpy().min() == 2 and r.numpy().max() == 4
    assert mg.randint(3, size=(4,)).numpy().max() < 3
    u = mg.rand(100)
    assert 0.0 <= u.numpy().min() and u.numpy().max() < 1.0
    with pytest.raises(ValueError, match=r"randint: high \(1\) must be greater than low \(1\)"):
        mg.randint(1, 1, (2,))


def test_cuda_placement_without_gpus_runs_on_the_cpu_with_one_warning(monkeypatch):
    """OneFlow programs say placement("cuda", ...); on a machine without GPUs they run on the
    CPU, with one warning per process (as the launcher does for ranks)."""
    import importlib
    import warnings

    placement_module = importlib.import_module("minigrad.distributed.global_tensor.placement")

    monkeypatch.setattr(placement_module, "is_cuda_available", lambda: False)
    monkeypatch.setattr(placement_module, "_NO_GPU_NOTED", [False])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = mg.placement("cuda", [0])
        mg.placement("gpu", [0])
        mg.placement("cpu", [0])
    notes = [w for w in caught if "no usable CUDA device" in str(w.message)]
    assert len(notes) == 1 and notes[0].filename == __file__  # points at the user's line
    x = mg.randn(4, 2, placement=p, sbp=mg.sbp.broadcast)
    assert x.to_local().device == "cpu0" and x.placement == p
    monkeypatch.setattr(placement_module, "is_cuda_available", lambda: True)
    monkeypatch.setattr(placement_module, "_NO_GPU_NOTED", [False])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mg.placement("cuda", [0])
    assert not [w for w in caught if "CUDA" in str(w.message)]


def _to_local_gradients():
    rank = dist.get_rank()
    P = mg.placement("cpu", [0, 1])
    out = {}
    for case in ("grad_sbp", "grad_placements", "replicated loss", "default"):
        y = mg.tensor(np.ones(3), dtype="float64", placement=P, sbp=B)
        gm = ad.GradManager().attach([y])
        weight = 2.0 if case == "replicated loss" else 1.0 + rank  # W_0 = 1, W_1 = 2
        try:
            with gm:
                if case in ("grad_sbp", "grad_placements"):
                    local = y.to_local(**{case: PS})
                else:
                    local = y.to_local()
                gm.backward((local * weight).sum())
            out[case] = y.grad.to_local().tolist()
        except RuntimeError as exc:
            out[case] = str(exc)
    return out


def test_to_local_gradient_layout_and_disagreeing_ranks():
    """2 ranks, loss = sum(W_r * y.to_local()) with W_0 = 1, W_1 = 2: the contributions sum with
    grad_sbp (or DTensor's grad_placements) = partial_sum; by default the backward raises on every
    rank instead of keeping rank 0's gradient; a replicated loss keeps working by default."""
    for out in run_workers(_to_local_gradients, 2):
        assert out["grad_sbp"] == [3.0, 3.0, 3.0]
        assert out["grad_placements"] == [3.0, 3.0, 3.0]
        assert out["replicated loss"] == [2.0, 2.0, 2.0]
        message = out["default"]
        assert isinstance(message, str), message
        assert "ranks [0, 1] computed different gradients for the broadcast tensor of shape (3,)" \
            in message
        assert "to_local(grad_sbp=mg.sbp.partial_sum)" in message
