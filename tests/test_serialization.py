"""Checkpoints: round trips of every value kind, resume, safety against pickles, corruption,
atomic writes and device mapping."""

import io
import math
import os
import pickle
from collections import OrderedDict

import numpy as np
import pytest
from minigrad.tensor import Parameter, Tensor
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

import minigrad as mg
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad import serialization
from minigrad.serialization import CheckpointError, UnsafeCheckpointError, load, save


def _same(a, b):
    """Deep equality that also checks types, dtypes and devices."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and str(a.device) == str(b.device)
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a == b
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b and (not isinstance(a, float) or math.copysign(1, a) == math.copysign(1, b))


def test_round_trip_every_value_kind(tmp_path):
    rng = np.random.default_rng(0)
    big_endian = np.arange(6, dtype=">i4").reshape(2, 3)
    obj = {
        "tensor": mg.tensor(rng.standard_normal((2, 3)).astype(np.float32)),
        "int_tensor": mg.tensor(np.arange(5, dtype=np.int32)),
        "bool_tensor": mg.tensor(np.array([True, False])),
        "param": Parameter(rng.standard_normal(4).astype(np.float64)),
        "arrays": [np.zeros((0, 3), np.float32), np.float16(1.5) * np.ones(3, np.float16),
                   np.array(7, np.int64), rng.standard_normal((4, 5))[:, ::2], big_endian,
                   np.array([1 + 2j], np.complex64), np.uint8(200) * np.ones(2, np.uint8)],
        "np_scalars": (np.float32(0.25), np.int64(-3), np.bool_(True)),
        "ints": [0, -1, 2**62, 2**80, -(2**70)],
        "floats": [0.1, -0.0, float("inf"), float("-inf"), float("nan"), 1e-320],
        "misc": [True, False, None, "ünïcode ✓", "", b"\x00\xffbytes"],
        "tuple": (1, (2, "three"), []),
        "nested": {"a": {"b": [{"c": None}]}},
        "ordered": OrderedDict([("z", 1), ("a", 2)]),
        "int_keys": {3: "three", 1.5: "float", None: "none", (1, 2): "tuple"},
        "empty": {},
    }
    path = tmp_path / "ckpt.mgc"
    save(obj, path)
    back = load(path)
    expect = dict(obj)
    expect["arrays"] = [a.astype(a.dtype.newbyteorder("=")) for a in obj["arrays"]]
    _same(expect, back)
    assert back["arrays"][4].dtype.isnative
    assert isinstance(back["param"], Parameter) and not isinstance(back["tensor"], Parameter)
    assert back["tensor"]._data.flags.writeable and back["arrays"][0].flags.writeable


def test_shared_tensors_stay_shared_and_file_objects_work():
    t = mg.tensor(np.ones(3, np.float32))
    buf = io.BytesIO()
    save({"a": t, "b": [t]}, buf)
    buf.seek(0)
    back = load(buf)
    assert back["a"] is back["b"][0]
    _same(back["a"], t)


def _mlp():
    return M.Sequential(M.Linear(4, 16), M.ReLU(), M.Linear(16, 3))


def _train(net, opt, steps, rng_seed):
    rng = np.random.default_rng(rng_seed)
    gm = mg.GradManager().attach(net.parameters())
    for _ in range(steps):
        x = mg.tensor(rng.standard_normal((8, 4)).astype(np.float32))
        y = mg.tensor(rng.integers(0, 3, 8).astype(np.int32))
        with gm:
            gm.backward(F.nn.cross_entropy(net(x), y))
        opt.step().clear_grad()


def test_model_and_optimizer_resume_is_bit_identical(tmp_path):
    mg.random.seed(0)
    straight = _mlp()
    opt = optim.Adam(straight.parameters(), lr=1e-2)
    _train(straight, opt, 4, rng_seed=1)
    path = tmp_path / "resume.mgc"
    save({"net": straight.state_dict(), "opt": opt.state_dict(), "epoch": 3, "acc": 0.97}, path)
    _train(straight, opt, 4, rng_seed=2)

    mg.random.seed(123)  # a different initialisation, fully overwritten by the checkpoint
    resumed = _mlp()
    opt2 = optim.Adam(resumed.parameters(), lr=0.5)
    ckpt = load(path)
    assert ckpt["epoch"] == 3 and ckpt["acc"] == 0.97
    assert isinstance(ckpt["net"], OrderedDict)
    resumed.load_state_dict(ckpt["net"])
    opt2.load_state_dict(ckpt["opt"])
    _train(resumed, opt2, 4, rng_seed=2)
    for (n, a), (_, b) in zip(straight.named_tensors(), resumed.named_tensors(), strict=True):
        assert np.array_equal(a.numpy(), b.numpy()), n


class _Custom:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, _Custom) and other.v == self.v


def test_arbitrary_objects_need_explicit_opt_in(tmp_path):
    path = tmp_path / "obj.mgc"
    with pytest.raises(TypeError, match=r"_Custom at \['extra'\]\[1\].*pickle=True"):
        save({"extra": [1, _Custom(2)]}, path)
    assert not path.exists()
    save({"extra": [1, _Custom(2)], "w": mg.tensor([1.0])}, path, pickle=True)
    with pytest.raises(UnsafeCheckpointError, match="allow_pickle=True"):
        load(path)
    back = load(path, allow_pickle=True)
    assert back["extra"] == [1, _Custom(2)]


class _Exploit:
    """Unpickling this creates a marker file: proof that code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_malicious_pickle_is_never_executed(tmp_path):
    marker = str(tmp_path / "pwned")
    raw = tmp_path / "evil.pkl"
    raw.write_bytes(pickle.dumps({"net": _Exploit(marker)}))
    with pytest.raises(UnsafeCheckpointError, match="pickle"):
        load(raw)
    assert not os.path.exists(marker)
    # the same payload smuggled inside a well-formed minigrad checkpoint
    evil = tmp_path / "evil.mgc"
    save({"x": _Exploit(marker)}, evil, pickle=True)
    assert not os.path.exists(marker)
    with pytest.raises(UnsafeCheckpointError, match="arbitrary code"):
        load(evil)
    assert not os.path.exists(marker)
    # sanity: the exploit is real, so the test above could fail
    load(raw, allow_pickle=True)
    assert os.path.exists(marker)


def test_truncated_or_corrupt_files_raise_clear_errors(tmp_path):
    path = tmp_path / "good.mgc"
    save({"w": mg.tensor(np.arange(64, dtype=np.float32)), "epoch": 1}, path)
    data = path.read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    for cut in [0, 4, 8, 8 + header_len // 2, 8 + header_len + 10, len(data) - 1]:
        bad = tmp_path / f"cut{cut}.mgc"
        bad.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=f"cut{cut}.mgc"):
            load(bad)
    flipped = bytearray(data)
    flipped[-3] ^= 0xFF
    bad = tmp_path / "flipped.mgc"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load(bad)
    garbage = tmp_path / "garbage.mgc"
    garbage.write_bytes(os.urandom(256).replace(b"\x80", b"\x00"))
    with pytest.raises(CheckpointError, match="garbage.mgc"):
        load(garbage)
    foreign = tmp_path / "foreign.safetensors"
    foreign.write_bytes(st_save({"x": np.ones(2, np.float32)}))
    with pytest.raises(CheckpointError, match="not a minigrad checkpoint"):
        load(foreign)
    with pytest.raises(FileNotFoundError, match="missing.mgc"):
        load(tmp_path / "missing.mgc")


@pytest.mark.parametrize("fail_at", ["fsync", "replace"])
def test_crash_during_save_keeps_previous_checkpoint(tmp_path, monkeypatch, fail_at):
    path = tmp_path / "ckpt.mgc"
    save({"epoch": 1, "w": mg.tensor(np.ones(3, np.float32))}, path)
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("simulated crash")

    monkeypatch.setattr(serialization.os, fail_at, crash)
    with pytest.raises(OSError, match="simulated crash"):
        save({"epoch": 2, "w": mg.tensor(np.zeros(3, np.float32))}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert load(path)["epoch"] == 1
    assert sorted(os.listdir(tmp_path)) == ["ckpt.mgc"]  # no temporary file left behind


def _fake_gpu_checkpoint(src, dst):
    """Rewrite a CPU checkpoint as if its tensors had been saved on gpu0."""
    data = src.read_bytes()
    meta = serialization._read_metadata(data)
    meta["structure"] = meta["structure"].replace('"cpu0"', '"gpu0"')
    dst.write_bytes(st_save(st_load(data), metadata=meta))


def test_map_location_forms(tmp_path):
    src = tmp_path / "cpu.mgc"
    save({"w": mg.tensor(np.arange(3, dtype=np.float32)), "n": np.ones(2)}, src)
    gpu = tmp_path / "gpu.mgc"
    _fake_gpu_checkpoint(src, gpu)
    seen = []
    for loc in ["cpu0", {"gpu0": "cpu0"}, {"gpu": "cpu"},
                lambda name: seen.append(name) or "cpu0"]:
        back = load(gpu, map_location=loc)
        assert str(back["w"].device) == "cpu0"
        np.testing.assert_array_equal(back["w"].numpy(), [0, 1, 2])
    assert seen == ["gpu0"]
    assert str(load(src, map_location={"gpu0": "cpu0"})["w"].device) == "cpu0"
    if not mg.is_cuda_available():
        with pytest.raises(RuntimeError, match="saved on gpu0.*map_location"):
            load(gpu)


@pytest.mark.gpu
def test_gpu_checkpoint_loads_on_cpu(tmp_path):
    if not mg.is_cuda_available():
        pytest.skip("needs CUDA")
    w = mg.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device="gpu0")
    p = Parameter(np.ones(3, np.float32), device="gpu0")
    path = tmp_path / "gpu.mgc"
    save({"w": w, "p": p}, path)
    same = load(path)
    assert str(same["w"].device) == "gpu0" and isinstance(same["p"], Parameter)
    cpu = load(path, map_location="cpu0")
    assert str(cpu["w"].device) == "cpu0" and str(cpu["p"].device) == "cpu0"
    np.testing.assert_array_equal(cpu["w"].numpy(), w.numpy())
    back = load(path, map_location={"gpu0": "cpu0"})
    np.testing.assert_array_equal(back["p"].numpy(), 1.0)
