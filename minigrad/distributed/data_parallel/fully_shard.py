"""``fully_shard``: ZeRO stages 3 and 2 (FSDP2's name), parameters kept as shards between forwards.

``fully_shard(module)`` lays the module's parameters (those not already managed by a wrapped
sub-module) out back to back, one flat layout per (dtype, device), padded to a multiple of the
group size ``n`` (:mod:`minigrad.distributed.comm.flat_buffer`). Rank ``r`` keeps only the
*pieces* of the parameters that fall in shard ``r``: each parameter attribute of the module is
replaced by a 1-D Parameter holding that flat element range (empty where the rank holds none of
it). ``module.parameters()`` then lists the pieces, so an optimizer built *after* ``fully_shard``
holds state for the pieces only, and a GradManager attached to them gets their gradients.

Forward: a pre-hook all-gathers the pieces into the full parameters (one collective per layout,
all started before any is waited for) through :class:`GatherParams`, a differentiable op whose
backward reduce-scatters (``ReduceOp.AVG``) the full gradients back to the pieces, and points
the module's attributes at the full tensors for the duration of ``forward``. With
``reshard_after_forward=True`` (ZeRO-3) a post-hook frees the gathered arrays (the tensors keep
their shape over a zero-byte placeholder) and wraps the outputs in :class:`RegatherForBackward`,
an identity whose backward gathers them again just before the module's own backward needs them.
With ``False`` (ZeRO-2) the gathered parameters stay until backward is done with them.

Prefetch: the outermost wrapped module records the order of the wrapped forwards; from the second
pass on, each wrapped forward first starts the all-gather of the module that ran next last time,
so that transfer overlaps this module's compute (unused prefetches are finished and dropped when
the outermost forward ends). :func:`no_sync` accumulates full gradients locally for gradient
accumulation with one reduce-scatter per step. ``dist.checkpoint.save``/``load`` handle
wrapped modules natively (:func:`flat_shard` says which slice of which parameter a piece is:
each rank writes its own slices); :func:`full_state_dict` and
:func:`full_optimizer_state_dict` give checkpoints in the unsharded module's names and shapes,
loadable at any world size (:func:`load_full_state_dict`, :func:`load_full_optimizer_state_dict`)
or into the module without sharding. The global-tensor machinery (SBP ``split(0)``) is not used:
it splits along an axis of each parameter, while ZeRO needs flat shards across parameters
(equal-size collectives for any shapes, one per layout) and must keep plain Parameters that every
optimizer updates as they are.

Why bitwise equal to data parallelism: the cpu backend's reduce-scatter and all-reduce both sum
the ranks' contributions in rank order, AVG divides by ``n`` the same way, and the optimizers
update element by element; so each piece gets exactly the bits DDP's parameter gets there.

Example::

    for block in net.blocks:
        dist.fully_shard(block)
    dist.fully_shard(net)
    opt = optim.Adam(net.parameters(), lr=1e-3)     # the pieces
    gm = ad.GradManager().attach(net.parameters())
"""

from __future__ import annotations

import contextlib
import itertools
import weakref

import numpy as np

from minigrad.autodiff import is_recording
from minigrad.autodiff.function import Function
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.backend.dtypes import is_bfloat16, is_floating
from minigrad.backend.xp import get_array_module, to_numpy
from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.comm.collectives import all_gather_object
from minigrad.distributed.comm.flat_buffer import ScratchPool, group_by_layout
from minigrad.distributed.comm.group import WORLD, resolve_group
from minigrad.distributed.comm.providers.base import CollectiveMismatchError
from minigrad.distributed.data_parallel.helper import bcast_list_
from minigrad.distributed.data_parallel.mixed_precision import (
    FULL_PRECISION,
    MixedPrecisionPolicy,
)
from minigrad.distributed.data_parallel.zero import (
    ShardedBucket,
    ShardNormReducer,
    check_same_models,
    grad_array,
    group_size_and_rank,
)
from minigrad.module.module import Module


class _ByIdentity:
    """A mapping keyed by the identity of tensors (whose ``==`` is elementwise), forgetting a key
    when its tensor is collected."""

    def __init__(self):
        self._items: dict = {}

    def __setitem__(self, key, value) -> None:
        ident = id(key)
        ref = weakref.ref(key, lambda _r: self._items.pop(ident, None))
        self._items[ident] = (ref, value)

    def get(self, key, default=None):
        entry = self._items.get(id(key))
        return entry[1] if entry is not None and entry[0]() is key else default


#: piece Parameter -> the FullyShardState that owns it
PIECE_OWNER = _ByIdentity()
#: replaced original Parameter -> the FullyShardState that replaced it
REPLACED = _ByIdentity()


def _placeholder(a):
    """A zero-byte read-only stand-in of ``a``'s shape and dtype (the memory is released)."""
    xp = get_array_module(a)
    return xp.broadcast_to(xp.zeros((), a.dtype), a.shape)


class _Slot:
    """Where a parameter lives: ``container[key]`` (a module attribute, list item or dict value)."""

    def __init__(self, container, key):
        self.container, self.key = container, key

    def set(self, value) -> None:
        if isinstance(self.container, Module):
            object.__setattr__(self.container, self.key, value)
        else:
            self.container[self.key] = value


def _find_slots(module: Module, param) -> list[_Slot]:
    """Every place under ``module`` (not inside tuples) that holds ``param``."""
    found = []

    def visit(container, key, value, seen):
        if value is param:
            found.append(_Slot(container, key))
        elif isinstance(value, Module):
            if id(value) in seen:
                return
            seen.add(id(value))
            for k, v in vars(value).items():
                if k not in ("_forward_pre_hooks", "_forward_hooks", "_fully_shard"):
                    visit(value, k, v, seen)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                visit(value, i, v, seen)
        elif isinstance(value, dict):
            for k, v in value.items():
                visit(value, k, v, seen)
        elif isinstance(value, tuple) and any(v is param for v in value):
            raise TypeError(
                f"fully_shard: a parameter of shape {tuple(param.shape)} is held in a tuple "
                f"({key!r}); keep parameters in module attributes, lists or dicts"
            )

    seen = {id(module)}
    for k, v in vars(module).items():
        if k not in ("_forward_pre_hooks", "_forward_hooks", "_fully_shard"):
            visit(module, k, v, seen)
    return found


#: host scratch buffers in shared memory, per group: each wrapped module's shard packed for its
#: all-gather and its full gradients packed for its reduce-scatter, which read them in place on
#: one host; a prefetch in flight and the gather being waited for use two of them
_HOST_SCRATCH = ScratchPool(comm.shared_empty)


class FullyShardState:
    """What ``fully_shard`` keeps for one wrapped module: the managed parameters' names, shapes
    and slots, one :class:`ShardedBucket` per (dtype, device) layout, and the pieces."""

    def __init__(self, module: Module, names: list, params: list, group, reshard: bool,
                 policy: MixedPrecisionPolicy = FULL_PRECISION):
        self.policy = policy
        self.module_ref = weakref.ref(module)
        self.module_name = type(module).__name__
        self.names = names
        self.shapes = [tuple(p.shape) for p in params]
        self.group = group
        self.n, self.rank = group_size_and_rank(group)
        self.reshard = reshard
        self.sync = True  # False inside no_sync(): full gradients accumulate locally
        self.prefetched: list | None = None  # an all-gather started ahead of this forward
        self.prefetch_hits = 0
        self.order: list = []  # as the outermost wrapped module: wrapped forwards of last pass
        self.this_pass: list | None = None
        self.unsynced: list | None = None  # those local full gradients
        self.slots = [_find_slots(module, p) for p in params]
        self.reducer = ShardNormReducer.of(group, self.n)
        # what each layout's all-gather carries, as its ``check``: the same on every rank (the
        # modules are wrapped in the same order everywhere)
        self.gather_names = [
            f"the parameters of fully_shard({self.module_name}) #{next(_GATHER_COUNTER)}"
            for _ in group_by_layout(params)]
        index = {id(p): i for i, p in enumerate(params)}
        self.layouts = []  # (param indices, ShardedBucket)
        for same in group_by_layout(params).values():
            idx = [index[id(p)] for p in same]
            self.layouts.append((idx, ShardedBucket(same, self.n, self.rank)))
        ranges = {}
        for idx, bucket in self.layouts:
            for j, a, b in bucket.segments:
                ranges[idx[j]] = (a, b)
        self.pieces = []
        for i, p in enumerate(params):
            a, b = ranges.get(i, (0, 0))
            piece = Parameter(p.data.reshape(-1)[a:b].copy(), device=p.device,
                              name=names[i])
            piece.shard_reducer = self.reducer  # global norms: clip_grad_norm, LAMB
            self.pieces.append(piece)
            PIECE_OWNER[piece] = self
            REPLACED[p] = self
            p.replaced_by = f"a shard of fully_shard({self.module_name}) ({names[i]})"
        self.set_params(self.pieces)

    def set_params(self, values) -> None:
        """Point every slot of every managed parameter at ``values[i]``."""
        for slots, value in zip(self.slots, values):
            for slot in slots:
                slot.set(value)

    def start_gather(self, compute: bool = False) -> list:
        """Start the all-gathers of the pieces (one per layout, asynchronous); the handles.
        ``compute``: in the policy's ``param_dtype`` (each shard cast as it is packed). On the
        host, shards and results lie in shared memory, which the all-gather reads in place."""
        works = []
        for k, (idx, bucket) in enumerate(self.layouts):
            dtype = self.pieces[idx[0]].dtype
            dtype = self.policy.compute_dtype(dtype) if compute else dtype
            xp = get_array_module(self.pieces[idx[0]].data)
            m = bucket.shard_size
            shard = bucket.pack_shard(
                [self.pieces[i].data for i in idx],
                _HOST_SCRATCH.get(self.group, m, dtype) if xp is np and self.n > 1
                else xp.empty(m, dtype))
            if self.n == 1:
                works.append((idx, bucket, None, shard))
                continue
            full = xp.empty(self.n * m, dtype)
            # the collectives carry no bfloat16: its bytes
            send, into = ((shard.view(np.uint8), full.view(np.uint8)) if is_bfloat16(dtype)
                          else (shard, full))
            work = comm.all_gather_into(into, send, self.group, async_op=True,
                                        check=self.gather_names[k])
            works.append((idx, bucket, work, full))
        return works

    def prefetch(self) -> None:
        """Start gathering now, for the coming forward (which then only waits)."""
        if self.prefetched is None:
            self.prefetched = self.start_gather(compute=True)

    def discard_prefetch(self) -> None:
        """Finish and drop a prefetch nobody used (every rank started it, so every rank waits)."""
        if self.prefetched is not None:
            for _, _, work, _ in self.prefetched:
                if work is not None:
                    work.wait()
            self.prefetched = None

    def gather(self, use_prefetch: bool = False, compute: bool = False) -> list:
        """All-gather the pieces: the full parameter arrays (views of one array per layout).
        ``compute``: in the policy's ``param_dtype`` (for the forward and backward; checkpoints
        gather the pieces' own dtype). ``use_prefetch``: finish the gather :meth:`prefetch`
        started (a compute gather), if any."""
        works = None
        if use_prefetch and self.prefetched is not None:
            works, self.prefetched = self.prefetched, None
            self.prefetch_hits += 1
        if works is None:
            works = self.start_gather(compute)
        full = [None] * len(self.pieces)
        self.gathered = []  # weak references to the gathered arrays: tests check they are freed
        for k, (idx, bucket, work, flat) in enumerate(works):
            if work is not None:
                self._wait_gather(k, work)
            self.gathered.append(weakref.ref(flat))
            offset = 0
            for i, size in zip(idx, bucket.sizes):
                full[i] = flat[offset : offset + size].reshape(self.shapes[i])
                offset += size
        return full

    def _wait_gather(self, k: int, work) -> None:
        """Wait for the all-gather of layout ``k``. Each gather's ``check`` names what it
        gathers, so ranks gathering different modules (a rank that skipped a backward, or ran
        the wrapped modules in another order; sizes may even agree) fail on every rank, here
        with both modules named, instead of mixing their parameters."""
        try:
            work.wait()
        except CollectiveMismatchError as exc:
            mine = self.gather_names[k]
            others = [(r, call) for r, call in zip(exc.ranks, exc.calls)
                      if call.get("check") != mine]
            if not others or any(call.get("op") != "all_gather_into" for _, call in others):
                raise
            got = "; ".join(f"rank {r} sent {call.get('check')}" for r, call in others)
            raise RuntimeError(
                f"fully_shard({self.module_name}): the ranks' all-gathers do not match: rank "
                f"{self.group.ranks[self.rank]} gathered {mine}, but {got} (a rank skipped "
                "a backward or ran the wrapped modules in another order)"
            ) from exc

    def to_reduce_dtype(self, grads: list) -> list:
        """The full gradients (arrays or None) in their layout's reduce dtype."""
        out = list(grads)
        for idx, _ in self.layouts:
            dtype = self.policy.gradient_reduce_dtype(self.pieces[idx[0]].dtype)
            for i in idx:
                if out[i] is not None and out[i].dtype != dtype:
                    out[i] = out[i].astype(dtype)
        return out

    def reduce_scatter(self, grads: list) -> list:
        """The pieces' gradients: the full gradients (None where a parameter got none) averaged
        over the group (in the policy's reduce dtype) and cut to this rank's shard (None for
        parameters that got none), in the pieces' dtype."""
        out = [None] * len(self.pieces)
        works = []
        for idx, bucket in self.layouts:
            if all(grads[i] is None for i in idx):
                continue
            p0 = self.pieces[idx[0]]
            xp = get_array_module(p0.data)
            size, dtype = bucket.shard_size * self.n, self.policy.gradient_reduce_dtype(p0.dtype)
            flat = (_HOST_SCRATCH.get(self.group, size, dtype) if xp is np
                    else xp.empty(size, dtype))
            offset = 0
            for i, size in zip(idx, bucket.sizes):
                if grads[i] is None:  # no gradient: zeros
                    flat[offset : offset + size] = 0
                else:
                    flat[offset : offset + size] = grads[i].reshape(-1)
                offset += size
            flat[offset:] = 0  # the padding
            m = bucket.shard_size
            if self.n == 1:
                works.append((idx, bucket, None, flat.copy()))  # the scratch is reused
                continue
            chunks = [flat[r * m : (r + 1) * m] for r in range(self.n)]
            works.append((idx, bucket, comm.reduce_scatter(chunks, "avg", self.group,
                                                            async_op=True), None))
        for idx, bucket, work, mine in works:
            mine = mine if work is None else work.wait()
            dtype = self.pieces[idx[0]].dtype
            if mine.dtype != dtype:  # the shard's gradient in float32 for the optimizer
                mine = mine.astype(dtype)
            ranges = {idx[j]: (a, b) for j, a, b in bucket.segments}
            pos = 0
            for i in idx:
                if grads[i] is None:
                    pos += ranges[i][1] - ranges[i][0] if i in ranges else 0
                    continue
                a, b = ranges.get(i, (0, 0))
                out[i] = mine[pos : pos + b - a]
                pos += b - a
        return out


class GatherParams(Function):
    """Forward: the pieces all-gathered into the full parameters (one output each). Backward:
    the full gradients reduce-scattered (averaged) back to the pieces."""

    def forward(self, state, *pieces):
        self.state = state
        return tuple(state.gather(use_prefetch=True, compute=True))

    def backward(self, *grads):
        state = self.state
        arrays = state.to_reduce_dtype(
            [None if g is None else (g.data if isinstance(g, Tensor) else g) for g in grads])
        if state.unsynced is not None:  # fold in what accumulated under no_sync(), like DDP
            arrays = [a if u is None else u if a is None else a + u
                      for a, u in zip(arrays, state.unsynced)]
        if not state.sync:
            state.unsynced = arrays
            return (None,) * (len(arrays) + 1)
        state.unsynced = None
        return (None, *state.reduce_scatter(arrays))


class RegatherForBackward(Function):
    """Identity on the module's outputs whose backward gathers the freed parameters again,
    before the module's own backward reads them (ZeRO-3)."""

    def forward(self, state, fulls, *outs):
        self.state, self.fulls = state, fulls
        return tuple(o.data for o in outs)

    def backward(self, *grads):
        for t, value in zip(self.fulls, self.state.gather(compute=True)):
            t.set_(value)
        self.fulls = None
        return (None, None, *grads)


@contextlib.contextmanager
def no_sync(module: Module):
    """Inside, backward passes through ``module``'s wrapped modules skip the reduce-scatter: each
    rank accumulates its full (unsharded) gradients locally, and the first backward after the
    block reduce-scatters their sum (gradient accumulation with one collective per step, as
    ``DistributedDataParallel.no_sync``; it holds full gradients meanwhile).

    Example::

        with dist.no_sync(net):
            for x, y in micro_batches[:-1]:
                with gm:
                    gm.backward(loss_fn(net(x), y))
        with gm:
            gm.backward(loss_fn(net(micro_batches[-1][0]), micro_batches[-1][1]))
    """
    states = [fs for _, fs in _sharded_modules(module)]
    if not states:
        raise ValueError(f"no_sync: {type(module).__name__} has no fully sharded module")
    previous = [s.sync for s in states]
    for s in states:
        s.sync = False
    try:
        yield
    finally:
        for s, flag in zip(states, previous):
            s.sync = flag


_GATHER_COUNTER = itertools.count(1)

#: the outermost wrapped module whose forward is running (its state), or None
_ACTIVE_ROOT: list = [None]


def _pre_forward(module, args):
    state = module._fully_shard
    root = _ACTIVE_ROOT[0]
    # the outermost wrapped forward keeps the order of the wrapped forwards (a root seen again
    # means its last forward raised before its post-hook: start afresh)
    if root is None or root is state:
        root = _ACTIVE_ROOT[0] = state
        state.this_pass = []
    position = len(root.this_pass)
    root.this_pass.append(state)
    # prefetch: the wrapped module that ran next in the previous pass starts gathering now, so
    # its transfer overlaps this module's forward (same order on every rank: same code)
    if root.order[: position + 1] == root.this_pass and position + 1 < len(root.order):
        root.order[position + 1].prefetch()
    fulls = GatherParams()(state, *state.pieces)
    state.live = list(fulls)
    state.set_params(state.live)
    policy = state.policy
    if policy.cast_forward_inputs and policy.param_dtype is not None:
        return _cast_floats(args, policy.param_dtype)
    return None


def _cast_floats(values: tuple, dtype) -> tuple | None:
    """``values`` with each floating Tensor cast to ``dtype`` (differentiably); None when no value
    changes (the module keeps its arguments)."""
    out = tuple(v.astype(dtype) if isinstance(v, Tensor) and is_floating(v.dtype)
                and v.dtype != dtype else v for v in values)
    return None if all(a is b for a, b in zip(out, values)) else out


def _post_forward(module, args, out):
    new = _reshard(module, out)
    dtype = module._fully_shard.policy.output_dtype
    if dtype is None:
        return new
    value = out if new is None else new
    flat = value if isinstance(value, (tuple, list)) else (value,)
    cast = _cast_floats(tuple(flat), dtype)
    if cast is None:
        return new
    if isinstance(value, (tuple, list)):
        return type(value)(cast)
    return cast[0]


def _reshard(module, out):
    """After the wrapped forward: point the module at its pieces again; under ZeRO-3 free the
    gathered parameters and wrap the outputs in :class:`RegatherForBackward` (the new outputs,
    or None when they stay as they are)."""
    state = module._fully_shard
    fulls, state.live = state.live, None
    state.set_params(state.pieces)
    if _ACTIVE_ROOT[0] is state:
        _ACTIVE_ROOT[0] = None
        state.order, state.this_pass = state.this_pass, None
        for other in state.order:
            other.discard_prefetch()
    if not state.reshard or not is_recording():
        return None
    for t in fulls:
        t.set_(_placeholder(t.data))
    flat_outs = out if isinstance(out, (tuple, list)) else (out,)
    wrap = [i for i, o in enumerate(flat_outs) if isinstance(o, Tensor) and is_floating(o.dtype)]
    if not wrap:
        return None
    new = RegatherForBackward()(state, fulls, *[flat_outs[i] for i in wrap])
    result = list(flat_outs)
    for i, t in zip(wrap, new):
        result[i] = t
    if isinstance(out, tuple):
        return tuple(result)
    if isinstance(out, list):
        return result
    return result[0]


def _managed_params(module: Module) -> tuple[list, list]:
    """``(names, params)`` of the parameters ``fully_shard(module)`` takes over: the module's,
    minus the pieces of wrapped sub-modules; refuses parameters of another wrapped module."""
    descendants = {id(m) for m in module.modules()}
    names, params = [], []
    for name, p in module.named_parameters():
        owner = PIECE_OWNER.get(p)
        if owner is not None:
            owner_module = owner.module_ref()
            if owner_module is not None and id(owner_module) in descendants:
                continue  # managed by a wrapped sub-module
            raise ValueError(
                f"fully_shard({type(module).__name__}): parameter {name!r} (shape "
                f"{tuple(p.shape)}) already belongs to fully_shard({owner.module_name}), "
                "which is not inside this module; wrap each parameter once, sub-modules first"
            )
        if REPLACED.get(p) is not None:
            raise ValueError(
                f"fully_shard({type(module).__name__}): parameter {name!r} (shape "
                f"{tuple(p.shape)}) was already replaced by shards of "
                f"fully_shard({REPLACED.get(p).module_name}) (a parameter shared with another "
                "wrapped module); wrap the module that holds both"
            )
        names.append(name)
        params.append(p)
    return names, params


def fully_shard(module: Module, reshard_after_forward: bool = True, group=None,
                mp_policy: MixedPrecisionPolicy | None = None) -> Module:
    """Shard ``module``'s parameters over ``group`` (None: WORLD); returns the module.

    Call it on sub-modules first (each gathers only its own parameters around its forward),
    then on the root. ``reshard_after_forward=True``: ZeRO-3 (parameters freed after forward
    and gathered again for backward); False: ZeRO-2 (kept gathered until backward is done).
    Build the optimizer and attach the GradManager *after* this call: they must see the pieces.
    Every rank must call it in the same order on modules of the same structure; the initial
    values are taken from the group's first rank (like ``DistributedDataParallel``).
    ``mp_policy``: a :class:`MixedPrecisionPolicy` (gather and compute in ``param_dtype``,
    reduce in ``reduce_dtype``; the shards stay the float32 master weights); pass it to every
    ``fully_shard`` call that should use it (sub-modules do not inherit it).
    """
    if not isinstance(module, Module):
        raise TypeError(f"fully_shard: expected a Module, got {type(module).__name__}")
    if "_fully_shard" in vars(module):
        raise ValueError(f"fully_shard: {type(module).__name__} is already fully sharded")
    group = resolve_group(WORLD if group is None else group)
    n, _ = group_size_and_rank(group)
    names, params = _managed_params(module)
    where = f"fully_shard({type(module).__name__})"
    check_same_models(where, names, params, group, n)
    if n > 1 and params:
        bcast_list_(params, group)
    if mp_policy is None:
        mp_policy = FULL_PRECISION
    if not isinstance(mp_policy, MixedPrecisionPolicy):
        raise TypeError(f"fully_shard: mp_policy must be a MixedPrecisionPolicy, got "
                        f"{type(mp_policy).__name__}")
    state = FullyShardState(module, names, params, group, bool(reshard_after_forward),
                            mp_policy)
    object.__setattr__(module, "_fully_shard", state)
    if params:
        module.register_forward_pre_hook(_pre_forward)
        module.register_forward_hook(_post_forward)
    return module


# ------------------------------------------------------------------------------------------------
# Checkpoints: full state dicts (the unsharded module's names and shapes), loadable at any
# world size and into a module that is not sharded
# ------------------------------------------------------------------------------------------------
def _owner_and_index(piece):
    """``(FullyShardState, parameter index)`` of a piece, or ``(None, None)``."""
    owner = PIECE_OWNER.get(piece)
    if owner is None:
        return None, None
    return owner, next(i for i, q in enumerate(owner.pieces) if q is piece)


def _ranges(owner: FullyShardState, i: int) -> list[tuple[int, int]]:
    """Every rank's ``(start, stop)`` flat range of parameter ``i`` of ``owner``, group order."""
    for idx, bucket in owner.layouts:
        if i in idx:
            j = idx.index(i)
            out = []
            for segs in bucket.all_segments():
                found = [(a, b) for jj, a, b in segs if jj == j]
                out.append(found[0] if found else (0, 0))
            return out
    raise KeyError(i)


def flat_shard(tensor) -> tuple[tuple[int, ...], tuple[int, int]] | None:
    """For a piece that :func:`fully_shard` made: ``(full shape, (start, stop))``, the shape of
    the parameter it stands for and the range of that parameter's flattened elements it holds
    on this rank; None for any other tensor. Distributed checkpoints save a piece (and an
    optimizer's state of it) as this slice of the full parameter, so it loads at any world size
    or into the unsharded module. No communication."""
    owner, i = _owner_and_index(tensor)
    if owner is None:
        return None
    return owner.shapes[i], _ranges(owner, i)[owner.rank]


def _sharded_modules(module: Module):
    """``(name prefix, FullyShardState)`` of every module under ``module`` (itself included)
    that ``fully_shard`` wrapped; the prefix is ``"path."`` (empty for ``module``)."""
    for prefix, sub in module.named_modules():
        fs = vars(sub).get("_fully_shard")
        if fs is not None:
            yield (f"{prefix}." if prefix else ""), fs


def full_state_dict(module: Module) -> dict:
    """The module's state with every sharded parameter gathered to its full shape, under the
    names the unsharded module uses (``module.state_dict()`` would give the pieces). Collective:
    every rank of the wrapped modules' groups calls it; every rank gets the whole dict.

    Example::

        state = dist.full_state_dict(net)
        if dist.get_rank() == 0:
            mg.save(state, "model.mgc")    # loads into the unsharded model, or any world size
    """
    state = dict(module.state_dict())
    for lead, fs in _sharded_modules(module):
        for name, value in zip(fs.names, fs.gather()):
            state[lead + name] = np.array(to_numpy(value), copy=True)
    return state


def load_full_state_dict(module: Module, state: dict) -> Module:
    """Load a full state (from :func:`full_state_dict` or from an unsharded module's
    ``state_dict()``): each rank keeps its pieces of the sharded parameters. No communication."""
    pieces = {}
    for lead, fs in _sharded_modules(module):
        for i, name in enumerate(fs.names):
            key = lead + name
            if key not in state:
                raise KeyError(f"load_full_state_dict: the state has no {key!r}")
            full = np.asarray(to_numpy(state[key]))
            if tuple(full.shape) != fs.shapes[i]:
                raise ValueError(
                    f"load_full_state_dict: {key!r} has shape {tuple(full.shape)}, the module's "
                    f"parameter has {fs.shapes[i]}"
                )
            a, b = _ranges(fs, i)[fs.rank]
            pieces[key] = full.reshape(-1)[a:b]
    module.load_state_dict({**state, **pieces})
    return module


def full_optimizer_state_dict(module: Module, optimizer) -> dict:
    """``optimizer.state_dict()`` as the same optimizer over the unsharded module would give it:
    each sharded parameter's state arrays gathered from every rank to the full shape. The
    optimizer must have been built on ``module.parameters()``. Collective (every rank gets it)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    local = optimizer.state_dict()
    owners = [o for o, _ in map(_owner_and_index, params) if o is not None]
    if not owners:
        return local
    group, n = owners[0].group, owners[0].n
    sent = {str(k): v for k, v in local["state"].items()}
    everyone = [sent]
    if n > 1:
        everyone = [None] * n
        all_gather_object(everyone, sent, group)
    state = {}
    for k, p in enumerate(params):
        owner, i = _owner_and_index(p)
        if owner is None:
            if k in local["state"]:
                state[k] = local["state"][k]
            continue
        parts = [everyone[r].get(str(k)) for r in range(n)]
        if any(part is None for part in parts):
            continue  # never stepped
        full = {}
        for name, value in parts[0].items():
            if getattr(value, "ndim", 0) > 0:
                full[name] = np.concatenate([np.asarray(part[name]).reshape(-1) for part in parts]
                                            ).reshape(owner.shapes[i])
            else:
                full[name] = value
        state[k] = full
    return {"param_groups": local["param_groups"], "state": state}


def load_full_optimizer_state_dict(module: Module, optimizer, state: dict):
    """Load a full optimizer state (from :func:`full_optimizer_state_dict` or an unsharded
    optimizer's ``state_dict()``) into an optimizer over the pieces: each rank slices its own."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    local = {}
    for key, st in state["state"].items():
        k = int(key)
        owner, i = _owner_and_index(params[k])
        if owner is None:
            local[k] = st
            continue
        a, b = _ranges(owner, i)[owner.rank]
        local[k] = {
            name: (np.asarray(to_numpy(v)).reshape(-1)[a:b].copy()
                   if getattr(v, "ndim", 0) > 0 else v)
            for name, v in st.items()
        }
    return optimizer.load_state_dict({"param_groups": state["param_groups"], "state": local})


# ------------------------------------------------------------------------------------------------
# Gradients in the unsharded shape: for checks (compare_layouts) and reductions of one's own
# (deterministic data parallelism)
# ------------------------------------------------------------------------------------------------
def piece_range(piece) -> tuple[tuple, int, int] | None:
    """``(full shape, start, stop)`` of a piece made by :func:`fully_shard`: the flat element
    range of its full parameter it holds on this rank; None for a parameter that is no piece.
    Lets code that reduces full gradients itself keep this rank's part of the result."""
    owner, i = _owner_and_index(piece)
    if owner is None:
        return None
    a, b = _ranges(owner, i)[owner.rank]
    return owner.shapes[i], a, b


@contextlib.contextmanager
def unsharded_gradients(pieces: list):
    """Inside, backward passes through the wrapped modules that own ``pieces`` skip the
    reduce-scatter (as :func:`no_sync`) and the pieces get no gradient; the yielded ``take()``
    returns, for each piece, the full local gradient of its parameter accumulated since the last
    ``take()`` (None where none arrived) and forgets them. For reductions of one's own, such as
    the deterministic block tree (:mod:`.deterministic`), which then keep this rank's part
    (:func:`piece_range`).

    Example::

        with dist.unsharded_gradients(pieces) as take:
            with gm:
                gm.backward(loss)
            full = take()          # full-shape local gradients, one per piece
    """
    owners = [_owner_and_index(p) for p in pieces]
    states = list({id(s): s for s, _ in owners if s is not None}.values())
    previous = [s.sync for s in states]
    for s in states:
        s.sync, s.unsynced = False, None

    def take() -> list:
        out = [None if s is None or s.unsynced is None else s.unsynced[i] for s, i in owners]
        for s in states:
            s.unsynced = None
        return out

    try:
        yield take
    finally:
        for s, flag in zip(states, previous):
            s.sync, s.unsynced = flag, None


def full_gradients(module: Module) -> dict:
    """``{name: full gradient}`` of the sharded parameters of ``module`` that have one: the
    pieces' gradients all-gathered to the unsharded names and shapes (NumPy arrays). Collective:
    every rank of the wrapped modules' groups calls it (the ranks' pieces have gradients for the
    same parameters, so the collectives match)."""
    out = {}
    for lead, fs in _sharded_modules(module):
        for idx, bucket in fs.layouts:
            has = [fs.pieces[i].grad is not None for i in idx]
            if not any(has):
                continue
            xp = get_array_module(fs.pieces[idx[0]].data)
            flat_grads = [grad_array(fs.pieces[i]).reshape(-1) if h
                          else xp.zeros(fs.pieces[i].size, fs.pieces[i].dtype)
                          for i, h in zip(idx, has)]
            shard = bucket.pack_shard(flat_grads)
            flat = shard
            if fs.n > 1:
                flat = xp.empty(fs.n * shard.size, shard.dtype)
                comm.all_gather_into(flat, shard, fs.group)
            flat = to_numpy(flat)
            offset = 0
            for i, size, h in zip(idx, bucket.sizes, has):
                if h:
                    out[lead + fs.names[i]] = np.array(flat[offset:offset + size]).reshape(
                        fs.shapes[i])
                offset += size
    return out
