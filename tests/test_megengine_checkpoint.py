"""Reading MegEngine checkpoints: files written here by a tiny ``pickle.dump`` of what
``megengine.save`` writes (NumPy state_dicts, optimizer states, MegEngine Tensor/Parameter objects
rebuilt from ``__getnewargs__`` and ``{"qparams": None}``, and the 1.1/1.2 state format), loaded
with ``mg.load(path, format="megengine")`` and by detection; and crafted malicious pickles that must
be refused *without running* (a marker file must not appear)."""

from __future__ import annotations

import copyreg
import io
import os
import pickle
import sys
import types
from collections import OrderedDict

import numpy as np
import pytest

import minigrad as mg
import minigrad.module as M
from minigrad.megengine_checkpoint import RefusedPickleError, load_megengine
from minigrad.serialization import CheckpointError, UnsafeCheckpointError

PROTOCOLS = range(pickle.HIGHEST_PROTOCOL + 1)


@pytest.fixture
def fake_megengine(monkeypatch):
    """Classes that pickle exactly like MegEngine's Tensor and Parameter (module
    ``megengine.tensor``, ``__getnewargs__`` = (ndarray, dtype, device, is_const, no_cache, name,
    format), state ``{"qparams": None}``); the fake modules exist only while pickling."""
    mod = types.ModuleType("megengine.tensor")

    class Tensor:
        def __init__(self, data, device="cpu0:0"):
            self.data, self.device = np.asarray(data), device

        def __getnewargs__(self):
            return (self.data, self.data.dtype, self.device, False, False, None, "default")

        def __getstate__(self):
            return {"qparams": None}

    class Parameter(Tensor):
        pass

    class OldTensor:  # MegEngine 1.1/1.2: no __new__ arguments, the data in the state
        def __init__(self, data):
            self.data = np.asarray(data)

        def __reduce_ex__(self, protocol):
            state = {"data": self.data, "device": "cpu0:0", "dtype": self.data.dtype}
            return copyreg.__newobj__, (type(self),), state

    for cls in (Tensor, Parameter, OldTensor):
        cls.__module__ = "megengine.tensor"
        cls.__qualname__ = cls.__name__ = "Tensor" if cls is OldTensor else cls.__name__
    mod.Tensor, mod.Parameter = Tensor, Parameter
    monkeypatch.setitem(sys.modules, "megengine", types.ModuleType("megengine"))
    monkeypatch.setitem(sys.modules, "megengine.tensor", mod)

    def dumps_old(obj):  # an old MegEngine's Tensor class had the same name
        mod.Tensor = OldTensor
        try:
            return pickle.dumps(obj, protocol=2)
        finally:
            mod.Tensor = Tensor

    return types.SimpleNamespace(Tensor=Tensor, Parameter=Parameter, OldTensor=OldTensor,
                                 dumps_old=dumps_old)


def _state_dict():
    rng = np.random.default_rng(0)
    return OrderedDict([
        ("conv.weight", rng.standard_normal((2, 3, 1, 3, 3)).astype(np.float32)),
        ("bn.running_var", rng.random(6).astype(np.float32)),
        ("embed.idx", np.arange(5, dtype=np.int64)),
        ("mask", np.array([True, False])),
        ("half", np.ones((2, 2), np.float16)),
        ("scalar", np.array(3.5)),
        ("fortran", np.asfortranarray(np.arange(6.0).reshape(2, 3))),
        ("big_endian", np.arange(4, dtype=">i4")),
    ])


def _assert_same(got, want):
    assert type(got) is type(want)
    if isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            _assert_same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            _assert_same(a, b)
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    else:
        assert got == want


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_state_dict_and_optimizer_state_round_trip(protocol, tmp_path):
    """megengine.save(net.state_dict()) / opt.state_dict(): OrderedDicts of NumPy arrays, nested
    dicts with int keys, lists, floats, strings, NumPy scalars — back exactly, any protocol."""
    ckpt = {"epoch": 7, "name": "resnet", "state_dict": _state_dict(), "loss": np.float64(0.25),
            "opt": {"param_groups": [{"lr": 0.1, "momentum": 0.9, "params": [0, 1]}],
                    "state": {0: {"momentum_buffer": np.zeros(3, np.float32)}}},
            "flags": (True, None, b"\x00\xff")}
    path = tmp_path / "model.mge"
    path.write_bytes(pickle.dumps(ckpt, protocol=protocol))
    want = pickle.loads(path.read_bytes())  # exactly what an unrestricted unpickle rebuilds
    _assert_same(mg.load(path, format="megengine"), want)
    np.testing.assert_array_equal(want["state_dict"]["big_endian"], np.arange(4))
    if protocol >= 2:  # what megengine.save writes: detected without being told
        _assert_same(mg.load(path), want)


def test_megengine_tensors_become_minigrad_tensors(fake_megengine, tmp_path):
    """Pickled MegEngine Parameters/Tensors come back as minigrad Parameters/Tensors with the same
    values and dtype; a tensor shared twice stays one object; devices map like mg.load's."""
    fm = fake_megengine
    w = fm.Parameter(np.arange(6, dtype=np.float32).reshape(2, 3))
    obj = {"w": w, "again": w, "buf": fm.Tensor(np.array([1, 2], np.int32), "gpu0:0")}
    path, old_path = tmp_path / "tensors.mge", tmp_path / "old.mge"
    path.write_bytes(pickle.dumps(obj, protocol=4))
    old_path.write_bytes(fm.dumps_old([fm.OldTensor(np.array([1.5, 2.5]))]))
    del sys.modules["megengine.tensor"], sys.modules["megengine"]  # the reader must not import
    out = mg.load(path, format="megengine", map_location="cpu0")
    out["old"] = mg.load(old_path)[0]
    assert isinstance(out["w"], mg.Parameter) and out["again"] is out["w"]
    assert type(out["buf"]) is mg.Tensor and out["buf"].dtype == np.int32
    assert out["buf"].device == "cpu0" and out["old"].dtype == np.float64
    np.testing.assert_array_equal(out["w"].numpy(), np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(out["old"].numpy(), [1.5, 2.5])
    if mg.get_device_count("gpu") == 0:  # without map_location a GPU tensor needs a GPU
        with pytest.raises(RuntimeError, match="saved on gpu0:0.*pass map_location"):
            mg.load(path, format="megengine")


def test_megengine_state_dict_loads_into_a_model(tmp_path):
    """The end-to-end use: a MegEngine Linear + BatchNorm1d state_dict (BN tensors as (C,))."""
    rng = np.random.default_rng(1)
    sd = OrderedDict([("fc.weight", rng.standard_normal((4, 3)).astype(np.float32)),
                      ("fc.bias", rng.standard_normal(4).astype(np.float32)),
                      ("bn.weight", np.ones(4, np.float32)), ("bn.bias", np.zeros(4, np.float32)),
                      ("bn.running_mean", rng.standard_normal(4).astype(np.float32)),
                      ("bn.running_var", np.ones(4, np.float32))])
    (tmp_path / "net.mge").write_bytes(pickle.dumps(sd))

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.bn = M.Linear(3, 4), M.BatchNorm1d(4)

    net = Net().load_state_dict(mg.load(tmp_path / "net.mge"))
    np.testing.assert_array_equal(net.fc.weight.numpy(), sd["fc.weight"])
    np.testing.assert_array_equal(net.bn.running_mean.numpy().ravel(), sd["bn.running_mean"])


# -- malicious files: refused, and nothing runs --------------------------------------------------


class _System:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class _Eval:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return eval, (f"open({self.marker!r}, 'w').close()",)


class _Plain:  # protocols 0/1 rebuild plain objects through copyreg._reconstructor
    def __init__(self, marker):
        self.marker = marker


class _PersistentPickler(pickle.Pickler):
    def persistent_id(self, obj):
        return "weights" if isinstance(obj, np.ndarray) else None


def _payloads(marker):
    """(name, bytes) of files that try to run code (or to build non-data objects)."""
    out = []
    for protocol in PROTOCOLS:
        out.append((f"os.system-p{protocol}", pickle.dumps(_System(marker), protocol=protocol)))
        out.append((f"eval-p{protocol}", pickle.dumps({"w": _Eval(marker)}, protocol=protocol)))
    nested = OrderedDict(w=np.zeros(2), extra=[1, (2, {"deep": _System(marker)})])
    out.append(("nested", pickle.dumps({"state_dict": nested}, protocol=4)))
    out.append(("object-array", pickle.dumps(np.array([_Eval(marker)], dtype=object))))
    out.append(("ndarray-subclass", pickle.dumps(np.rec.fromrecords([(1, 2.0)]))))
    out.append(("reconstructor-p0", pickle.dumps(_Plain(marker), protocol=0)))
    buf = io.BytesIO()
    _PersistentPickler(buf, protocol=2).dump({"w": np.zeros(2)})
    out.append(("persistent-id", buf.getvalue()))
    # STACK_GLOBAL with a dotted name, reaching through an allowed module to a builtin
    dotted = (b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x05numpy\x94"
              b"\x8c\x0fdtype.__class__\x94\x93\x94.")
    out.append(("dotted-name", dotted))
    return out


@pytest.mark.parametrize("case", range(len(_payloads("x"))), ids=[n for n, _ in _payloads("x")])
def test_malicious_pickles_are_refused_without_running(case, tmp_path):
    """Every global outside the allowlist (os.system, builtins.eval, copyreg._reconstructor, an
    ndarray subclass, a dotted attribute path), object arrays and persistent ids are refused — at
    any protocol, however deeply nested — before anything is called."""
    marker = tmp_path / "pwned"
    name, payload = _payloads(str(marker))[case]
    path = tmp_path / "evil.mge"
    path.write_bytes(payload)
    with pytest.raises(UnsafeCheckpointError, match="not a plain MegEngine checkpoint"):
        mg.load(path, format="megengine")
    with pytest.raises(RefusedPickleError, match="refused before anything was called"):
        load_megengine(payload)
    if payload.startswith(b"\x80"):  # detected as a pickle without format=
        with pytest.raises(UnsafeCheckpointError, match="allow_pickle=True"):
            mg.load(path)
    assert not marker.exists(), f"{name}: code ran"


def test_the_exploits_are_real(tmp_path):
    """Sanity for the test above: an unrestricted unpickle of the same bytes does run code."""
    marker = tmp_path / "pwned"
    pickle.loads(pickle.dumps({"w": _Eval(str(marker))}))
    assert marker.exists()


def test_not_a_checkpoint(tmp_path):
    """Truncated or foreign bytes are a CheckpointError naming the file, not a crash."""
    good = pickle.dumps(_state_dict(), protocol=4)
    path = tmp_path / "cut.mge"
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match="cut.mge.*not a readable MegEngine checkpoint"):
        mg.load(path, format="megengine")
    path.write_bytes(b"just some text")
    with pytest.raises(CheckpointError, match="not a readable MegEngine checkpoint"):
        mg.load(path, format="megengine")
    with pytest.raises(ValueError, match="mg.load: format must be None, 'minigrad' or 'megengine'"):
        mg.load(path, format="torch")


def _megengine_1_1_tensor_pickle(monkeypatch, qdict):
    """What MegEngine 1.1/1.2 wrote for ``mge.save(tensor)``: the state holds the data, the device,
    the dtype as NumPy's scalar type (``numpy.int8``) and a ``qdict`` of quantisation fields."""
    mod = types.ModuleType("megengine.tensor")

    class Tensor:
        def __reduce_ex__(self, protocol):
            state = {"data": np.array([1, 2, 3], np.int8), "device": "cpu0:0",
                     "dtype": np.int8, "qdict": qdict}
            return copyreg.__newobj__, (type(self),), state

    Tensor.__module__, Tensor.__qualname__ = "megengine.tensor", "Tensor"
    mod.Tensor = Tensor
    monkeypatch.setitem(sys.modules, "megengine", types.ModuleType("megengine"))
    monkeypatch.setitem(sys.modules, "megengine.tensor", mod)
    return pickle.dumps(Tensor(), protocol=4)


def test_megengine_1_1_tensor_with_scalar_type_dtype_and_empty_qdict_loads(monkeypatch, tmp_path):
    path = tmp_path / "tensor_v1_1.mge"
    path.write_bytes(_megengine_1_1_tensor_pickle(
        monkeypatch, {"mode": None, "scale": None, "zero_point": None}))
    t = mg.load(str(path))
    assert isinstance(t, mg.Tensor) and t.dtype == np.int8
    np.testing.assert_array_equal(t.numpy(), [1, 2, 3])
    quantised = tmp_path / "q.mge"
    quantised.write_bytes(_megengine_1_1_tensor_pickle(
        monkeypatch, {"mode": "symmetric", "scale": 0.5, "zero_point": None}))
    with pytest.raises(UnsafeCheckpointError, match="quantisation parameters"):
        mg.load(str(quantised))
