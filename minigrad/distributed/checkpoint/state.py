"""What a run's state is made of, in checkpoint terms: logical tensors (as this rank's
:class:`~.pieces.Shard` of each) and plain values.

``state`` is a dict (PyTorch DCP's "state dict"); each entry is one of:

* a :class:`~minigrad.module.Module`: every parameter and buffer, named ``"<key>/<name>"``
  with the single-device names; tensor-parallel layers give their blocks of the full tensors
  (their :class:`ShardSpec`), global tensors their SBP piece, pipeline stages their own layers;
* an :class:`~minigrad.optimizer.Optimizer`: each parameter's state (Adam's moments) is a logical
  tensor sharded exactly like the parameter (``"<key>/state/<param name>/exp_avg"``), the step
  counts and hyper-parameters are plain values per parameter, so a checkpoint taken with one
  grouping or layout (a pipeline stage's parameters) loads into another (the whole model). A
  sharded optimizer (ZeRO-1, ``dist.ZeroRedundancyOptimizer``) whose state arrays hold a range
  of each flattened parameter says so with ``state_shard(param) -> (start, stop)`` (and gives
  and takes that local state with ``sharded_state_dict``/``load_sharded_state_dict`` when its
  ``state_dict`` means the full state): its state is then a flat shard of the same logical
  tensor, and loads into any other sharding (or none). Its replicated parameters are written by
  the rank that owns each range (every rank writes its share), and loaded whole;
* a module wrapped by ``dist.fully_shard`` (ZeRO-2/3) holds 1-D pieces of its parameters: each
  is saved as its flat range of the full parameter, under the unsharded module's name and
  shape, and so is an optimizer's state of it; both load into any world size, into plain data
  parallelism or into one process (and the reverse);
* any other object with ``state_dict``/``load_state_dict`` ("stateful": an LR scheduler, a
  GradScaler, a DataLoader): its state dict, arrays in it stored as replicated tensors;
* a Tensor or NumPy array (loaded in place), or a plain value (replaced in ``state``);
* a nested dict of the above.

Every rank's CPU random generator is saved too (``"__rng__/rank<r>"``), and each GPU generator it
has drawn from (``"__rng__/rank<r>/gpu<i>"``): a resumed rank continues the same streams. With
another world size, rank ``r`` takes saved rank ``r % saved_world_size``'s.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from minigrad.autodiff.tensor import Tensor
from minigrad.backend.device import get_device_count
from minigrad.backend.dtypes import is_bfloat16
from minigrad.backend.rng import get_state as get_rng_state
from minigrad.backend.rng import gpu_generators_made
from minigrad.backend.rng import set_state as set_rng_state
from minigrad.backend.xp import to_numpy
from minigrad.distributed.checkpoint.pieces import Shard, full_index
from minigrad.distributed.checkpoint.values import from_json, to_json
from minigrad.distributed.comm.group import get_rank
from minigrad.distributed.data_parallel.fully_shard import flat_shard
from minigrad.distributed.global_tensor.sbp import broadcast, local_slices
from minigrad.distributed.tensor_parallel.sharding import ParallelModule
from minigrad.module import Module
from minigrad.optimizer.optimizer import Optimizer

__all__ = ["RNG_KEY", "StateItems", "collect", "dtype_name"]

RNG_KEY = "__rng__"


def dtype_name(dtype) -> str:
    """The index's name of a dtype (``float32``, ``bfloat16``)."""
    return "bfloat16" if is_bfloat16(dtype) else np.dtype(dtype).name


class StateItems:
    """The state as this rank sees it: ``shards`` (logical tensors), ``objects`` (plain values,
    key -> JSON, for saving) and, for loading, ``finishers`` run once every shard is written
    (``finisher(objects, arrays)``)."""

    def __init__(self, loading: bool, index: dict | None = None):
        self.loading = loading
        self.index = index or {"tensors": {}, "objects": {}}
        self.shards: list[Shard] = []
        self.objects: dict[str, Any] = {}
        self.finishers: list[Callable[[dict, dict], None]] = []
        self.loaded: dict[str, np.ndarray] = {}  # key -> local array read (replicated values)

    # -- helpers ----------------------------------------------------------------------------------
    def add_array(self, key: str, value) -> None:
        """A replicated array (or local tensor) stored whole; loaded into ``self.loaded``."""
        arr = to_numpy(value.data) if isinstance(value, Tensor) else np.asarray(value)
        arr = np.ascontiguousarray(arr)

        def write(new, key=key):
            self.loaded[key] = new

        self.shards.append(Shard(key, tuple(arr.shape), arr.dtype, full_index(arr.shape),
                                 lambda a=arr: a, write))

    def add_value(self, key: str, value, rebuild: Callable[[Any], None]) -> None:
        """A plain value (possibly holding arrays); ``rebuild(value)`` restores it on load."""
        if not self.loading:
            self.objects[key] = to_json(value, key, self.add_array)
            return
        node = self.index["objects"].get(key)
        if node is None:
            raise KeyError(f"dist.checkpoint.load: {key!r} is not in the checkpoint")
        self._want_arrays(node)
        self.finishers.append(lambda objects, arrays: rebuild(from_json(node, arrays.__getitem__)))

    def _want_arrays(self, node) -> None:
        """Register the replicated arrays a stored value refers to, to be read on load."""
        if isinstance(node, list):
            for v in node:
                self._want_arrays(v)
        elif isinstance(node, dict):
            if "__tensor__" in node:
                key = node["__tensor__"]
                meta = self.index["tensors"].get(key)
                if meta is None:
                    raise KeyError(f"dist.checkpoint.load: tensor {key!r} is not in the index")
                shape = tuple(meta["shape"])
                self.shards.append(Shard(key, shape, meta["dtype"], full_index(shape),
                                         lambda: None, self._setter(key)))
                return
            for v in node.values():
                self._want_arrays(v)

    def _setter(self, key):
        def write(new):
            self.loaded[key] = new
        return write


def tensor_shard(key: str, t: Tensor, spec_owner=None) -> Shard | None:
    """This rank's shard of ``t``: a global tensor's SBP piece, a tensor-parallel layer's block
    (``spec_owner = (layer, ShardSpec)``), else the whole tensor. None: not on this rank."""
    if t.is_global:
        placement = t.placement
        if get_rank() not in placement:
            return None
        if any(s.kind == "P" for s in t.sbp):  # a sum of pieces: save its value, load it whole
            whole = t.to_global(sbp=[broadcast] * len(t.sbp))
            return Shard(key, tuple(t.shape), whole.data.dtype, full_index(t.shape),
                         lambda: to_numpy(whole.data), t.set_value)
        slices = local_slices(t.shape, t.sbp, placement.mesh_shape, placement.coord(get_rank()))
        index = tuple(np.arange(s.start, s.stop) for s in slices)
        return Shard(key, tuple(t.shape), t.data.dtype, index, lambda: to_numpy(t.data),
                     t.set_value)
    pieced = flat_shard(t)
    if pieced is not None:  # a fully_shard piece: a flat range of the full parameter
        shape, flat = pieced
        return Shard(key, tuple(shape), t.data.dtype, None, lambda: to_numpy(t.data),
                     t.set_value, flat=flat)
    if spec_owner is not None:
        layer, spec = spec_owner
        index = spec.indices(layer.ctx.coord, layer.ctx)
        return Shard(key, tuple(spec.full_shape), t.data.dtype, index,
                     lambda: to_numpy(t.data), t.set_value)
    return Shard(key, tuple(t.shape), t.data.dtype, full_index(t.shape),
                 lambda: to_numpy(t.data), t.set_value)


def _specs(model: Module) -> dict[str, tuple]:
    """Tensor name -> (tensor-parallel layer, its ShardSpec) for every sharded tensor."""
    out = {}
    for prefix, module in model.named_modules():
        if isinstance(module, ParallelModule):
            for name, spec in module.shard_specs.items():
                out[(prefix + "." if prefix else "") + name] = (module, spec)
    return out


def _modules(state: dict, prefix: str = "") -> list[tuple[str, Module]]:
    out = []
    for key, value in state.items():
        if isinstance(value, Module):
            out.append((prefix + key, value))
        elif isinstance(value, dict):
            out.extend(_modules(value, f"{prefix}{key}/"))
    return out


class _ParamNames:
    """Parameter -> (checkpoint name, its shard) through the modules of the state."""

    def __init__(self, state: dict):
        self.by_id: dict[int, tuple[str, Module, str, tuple | None]] = {}
        for key, model in _modules(state):
            specs = _specs(model)
            for name, t in model.named_tensors():
                self.by_id.setdefault(id(t), (f"{key}/{name}", model, name, specs.get(name)))
        # parameter -> the flat range whose optimizer state this rank keeps (ZeRO-1): the rank
        # writes that range of the (replicated) parameter, so every rank writes its share
        self.owned: dict[int, tuple[int, int]] = {}
        for opt in _optimizers(state):
            for g in opt.param_groups:
                for p in g["params"]:
                    flat = _flat_range(opt, p)
                    if flat is not None and not p.is_global and flat_shard(p) is None and \
                            self.by_id.get(id(p), (None,) * 4)[3] is None:
                        self.owned.setdefault(id(p), flat)

    def name(self, p, position: int) -> str:
        entry = self.by_id.get(id(p))
        return entry[0] if entry else f"param{position}"

    def shard(self, key: str, p, value_of: Callable[[], np.ndarray], write) -> Shard | None:
        entry = self.by_id.get(id(p))
        base = tensor_shard(key, p, entry[3] if entry else None)
        if base is None:
            return None
        base.read, base.write = value_of, write
        return base


def _module(items: StateItems, key: str, model: Module, names: _ParamNames) -> None:
    specs = _specs(model)
    for name, t in model.named_tensors():
        owned = None if items.loading else names.owned.get(id(t))
        if owned is not None:  # a replica whose range a sharded optimizer keeps on this rank
            items.shards.append(Shard(
                f"{key}/{name}", tuple(t.shape), t.data.dtype, None,
                lambda t=t, a=owned[0], b=owned[1]: to_numpy(t.data).reshape(-1)[a:b],
                t.set_value, flat=owned))
            continue
        shard = tensor_shard(f"{key}/{name}", t, specs.get(name))
        if shard is not None:
            items.shards.append(shard)


def _optimizer(items: StateItems, key: str, opt: Optimizer, names: _ParamNames) -> None:
    params = [p for g in opt.param_groups for p in g["params"]]
    group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
    if not items.loading:
        local_state = getattr(opt, "sharded_state_dict", None)
        saved = opt.state_dict() if local_state is None else local_state()
        for i, p in enumerate(params):
            pname = names.name(p, i)
            hyper = {k: v for k, v in group_of[id(p)].items() if k != "params"}
            items.objects[f"{key}/param_groups/{pname}"] = to_json(hyper, key, _no_arrays)
            flat = _checked_flat_range(opt, p, pname, names)
            for sname, value in saved["state"].get(i, {}).items():
                skey = f"{key}/state/{pname}/{sname}"
                if flat is not None and np.ndim(value) == 1 and \
                        len(value) == flat[1] - flat[0]:
                    arr = np.ascontiguousarray(to_numpy(value))
                    items.shards.append(Shard(skey, _logical_shape(p, names), arr.dtype, None,
                                              lambda a=arr: a, None, flat=flat))
                elif _is_param_shaped(value, p):
                    arr = np.ascontiguousarray(to_numpy(value))
                    shard = names.shard(skey, p, lambda a=arr: a, None)
                    if shard is not None:
                        shard.dtype = arr.dtype
                        items.shards.append(shard)
                else:
                    items.objects[skey] = to_json(value, skey, items.add_array)
        return
    tensors, objects = items.index["tensors"], items.index["objects"]
    restored: dict[int, dict] = {}
    for i, p in enumerate(params):
        pname = names.name(p, i)
        prefix = f"{key}/state/{pname}/"
        for skey in [k for k in tensors if k.startswith(prefix)] + \
                [k for k in objects if k.startswith(prefix)]:
            sname = skey[len(prefix):]
            if skey in tensors and tuple(tensors[skey]["shape"]) == _logical_shape(p, names):
                def write(arr, i=i, sname=sname):
                    restored.setdefault(i, {})[sname] = arr
                flat = _checked_flat_range(opt, p, pname, names)
                if flat is not None:
                    shard = Shard(skey, _logical_shape(p, names), tensors[skey]["dtype"], None,
                                  lambda: None, write, flat=flat)
                else:
                    shard = names.shard(skey, p, lambda: None, write)
                if shard is not None:
                    items.shards.append(shard)
            elif skey in objects:
                items._want_arrays(objects[skey])
                restored.setdefault(i, {})[sname] = ("__object__", skey)

    position = {id(p): i for i, p in enumerate(params)}

    def finish(objs, arrays):
        groups = []
        for g in opt.param_groups:
            hyper = None
            for p in g["params"]:
                pos = position[id(p)]
                node = objs.get(f"{key}/param_groups/{names.name(p, pos)}")
                if node is not None:
                    hyper = from_json(node, arrays.__getitem__)
                    break
            hyper = dict(hyper) if hyper is not None else {
                k: v for k, v in g.items() if k != "params"}
            hyper["params"] = [position[id(p)] for p in g["params"]]
            groups.append(hyper)
        state = {}
        for i, st in restored.items():
            state[i] = {
                n: from_json(objs[v[1]], arrays.__getitem__) if isinstance(v, tuple) else v
                for n, v in st.items()}
        load = getattr(opt, "load_sharded_state_dict", None) or opt.load_state_dict
        load({"param_groups": groups, "state": state})

    items.finishers.append(finish)


def _optimizers(state: dict) -> list[Optimizer]:
    out = []
    for value in state.values():
        if isinstance(value, Optimizer):
            out.append(value)
        elif isinstance(value, dict):
            out.extend(_optimizers(value))
    return out


def _checked_flat_range(opt, p, pname: str, names: _ParamNames) -> tuple[int, int] | None:
    """:func:`_flat_range`, refused where the flat range is not one of the logical tensor (a
    sharded optimizer over tensor-parallel blocks or global tensors' pieces)."""
    flat = _flat_range(opt, p)
    if flat is not None and (p.is_global or flat_shard(p) is not None or
                             names.by_id.get(id(p), (None,) * 4)[3] is not None):
        raise TypeError(
            f"dist.checkpoint: {type(opt).__name__} keeps a flat range of {pname!r}, which is "
            "itself a shard (a tensor-parallel block, a global tensor's piece or a fully_shard "
            "piece); checkpoints of a sharded optimizer over sharded parameters are not "
            "supported: use a plain optimizer there")
    return flat


def _flat_range(opt, p) -> tuple[int, int] | None:
    """The range of ``p``'s flattened logical elements whose state ``opt`` keeps on this rank,
    for a sharded optimizer (ZeRO) that says so with ``state_shard(param) -> (start, stop)``;
    None: the state has the parameter's own shape."""
    state_shard = getattr(opt, "state_shard", None)
    if state_shard is None:
        return None
    got = state_shard(p)
    return None if got is None else (int(got[0]), int(got[1]))


def _logical_shape(p, names: _ParamNames) -> tuple:
    pieced = flat_shard(p)
    if pieced is not None:
        return tuple(pieced[0])
    entry = names.by_id.get(id(p))
    if entry and entry[3] is not None:
        return tuple(entry[3][1].full_shape)
    return tuple(p.shape)


def _is_param_shaped(value, p) -> bool:
    return hasattr(value, "shape") and np.ndim(value) > 0 and \
        tuple(value.shape) == tuple(p.data.shape)


def _no_arrays(path, value):
    raise TypeError(f"dist.checkpoint.save: unexpected array in optimizer hyper-parameter {path}")


def _stateful(value) -> bool:
    return callable(getattr(value, "state_dict", None)) and \
        callable(getattr(value, "load_state_dict", None))


def collect(state: dict, loading: bool = False, index: dict | None = None,
            rng: bool = True, saved_world_size: int | None = None) -> StateItems:
    """The shards and values of ``state`` on this rank (see the module docstring). Loading needs
    the checkpoint's ``index`` (to know which optimizer states and values it has)."""
    if not isinstance(state, dict):
        raise TypeError(
            f"dist.checkpoint: state must be a dict (e.g. {{'model': net, 'optim': opt}}), got "
            f"{type(state).__name__}")
    items = StateItems(loading, index)
    names = _ParamNames(state)
    _walk(items, state, "", names)
    if rng:
        _random_generators(items, loading, saved_world_size)
    return items


def _random_generators(items: StateItems, loading: bool, saved_world_size: int | None) -> None:
    """This rank's CPU generator (``"__rng__/rank<r>"``) and the GPU generators it has drawn
    from (``"__rng__/rank<r>/gpu<i>"``, the state array in CuPy's own layout); on load, those of
    saved rank ``r % saved_world_size``, each GPU's into the same GPU index here."""
    rank = get_rank()
    if not loading:
        items.objects[f"{RNG_KEY}/rank{rank}"] = to_json(
            get_rng_state("cpu0"), RNG_KEY, _no_arrays)
        for i in gpu_generators_made():
            key = f"{RNG_KEY}/rank{rank}/gpu{i}"
            items.objects[key] = to_json(get_rng_state(f"gpu{i}"), key, items.add_array)
        return
    source = f"{RNG_KEY}/rank{rank % (saved_world_size or 1)}"
    objects = items.index["objects"]
    if source in objects:
        node = objects[source]
        items.finishers.append(lambda objs, arrays, node=node: set_rng_state(
            "cpu0", from_json(node, arrays.__getitem__)))
    gpus = get_device_count("gpu") if any(k.startswith(source + "/gpu") for k in objects) else 0
    for i in range(gpus):
        key = f"{source}/gpu{i}"
        if key in objects:
            items.add_value(key, None, lambda state, i=i: set_rng_state(f"gpu{i}", state))


def _walk(items: StateItems, state: dict, prefix: str, names: _ParamNames) -> None:
    for k, value in state.items():
        if not isinstance(k, str) or "/" in k:
            raise ValueError(
                f"dist.checkpoint: state keys must be strings without '/', got {k!r}")
        key = prefix + k
        if isinstance(value, Module):
            _module(items, key, value, names)
        elif isinstance(value, Optimizer):
            _optimizer(items, key, value, names)
        elif isinstance(value, dict):
            _walk(items, value, key + "/", names)
        elif isinstance(value, Tensor) and value.is_global:
            shard = tensor_shard(key, value)
            if shard is not None:
                items.shards.append(shard)
        elif isinstance(value, (Tensor, np.ndarray)):
            _array_entry(items, key, value)
        elif _stateful(value):
            items.add_value(key, None if items.loading else value.state_dict(),
                            value.load_state_dict)
        else:
            items.add_value(key, value, lambda v, state=state, k=k: state.__setitem__(k, v))


def _array_entry(items: StateItems, key: str, value) -> None:
    """A replicated tensor or array, loaded in place."""
    arr = np.ascontiguousarray(to_numpy(value.data) if isinstance(value, Tensor) else value)

    def write(new, value=value):
        if isinstance(value, Tensor):
            value.set_value(new)
        else:
            value[...] = new

    items.shards.append(Shard(key, tuple(arr.shape), arr.dtype, full_index(arr.shape),
                              lambda: arr, write))
