"""``ZeroRedundancyOptimizer``: ZeRO stage 1, optimizer state sharded over a data-parallel group.

With plain data parallelism every rank holds the whole optimizer state (Adam: two moments, 8 bytes
per float32 parameter) and runs the same update. Here the parameters of each bucket (one dtype and
device, about ``bucket_cap_mb``) are laid out back to back in a flat buffer padded to a multiple
of the group size ``n`` (:mod:`minigrad.distributed.comm.flat_buffer`); rank ``r`` owns the r-th of
``n`` equal parts. What a rank owns of each parameter is a *piece* (a flat element range), and the
wrapped optimizer (any ``optimizer_class``) runs on those pieces only, so its state is about 1/n
of the full state and padding is never part of it. After the local step each bucket's updated
shards are all-gathered into every rank's parameters.

The update rules of SGD, Adam and friends act element by element, so updating a piece gives the
very bits the full update gives: training is bitwise equal to data parallelism with
``make_allreduce_cb("mean")`` (or ``DistributedDataParallel``) and a plain optimizer. Gradients
must already be averaged over the group (attach the all-reduce callback, or wrap in DDP). Rules
that need a norm over a whole parameter (LAMB's trust ratio) get it through each piece's
``shard_reducer`` (:class:`ShardNormReducer`), which sums the ranks' partial norms.

Checkpoints: ``opt.consolidate_state_dict(to=r)`` then ``state_dict()`` gives PyTorch's full state
on one rank; ``dist.checkpoint.save``/``load`` instead take each rank's own slices
(:meth:`~ZeroRedundancyOptimizer.state_shard`, ``sharded_state_dict``), without gathering, and
reshard them to any group size, to plain data parallelism or to one process.

Example::

    gm = GradManager().attach(net.parameters(), callbacks=[dist.make_allreduce_cb("mean")])
    opt = dist.ZeroRedundancyOptimizer(net.parameters(), optimizer_class=optim.Adam, lr=1e-3)
    with gm:
        gm.backward(loss_fn(net(x), y))
    opt.step().clear_grad()
    opt.consolidate_state_dict(to=0)
    if dist.get_rank() == 0:
        mg.save(opt.state_dict(), "opt.mgc")   # loads into a plain Adam too
"""

from __future__ import annotations

import weakref

import numpy as np

from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.backend.xp import get_array_module, to_numpy
from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.comm.collectives import all_gather_object
from minigrad.distributed.comm.flat_buffer import layout_key, shard_segments
from minigrad.distributed.comm.group import WORLD, is_distributed, resolve_group
from minigrad.distributed.data_parallel.helper import DEFAULT_BUCKET_MB
from minigrad.optimizer.optimizer import Optimizer


def group_size_and_rank(group) -> tuple[int, int]:
    """``(n, r)``: the group's size and this rank's index in it; ``(1, 0)`` when not distributed."""
    if not is_distributed():
        return 1, 0
    return group.size, group.rank


def param_name(params: list, i: int) -> str:
    """How errors name parameter ``i``: its name if it has one, its index and shape."""
    p = params[i]
    name = getattr(p, "name", None)
    return f"parameter {i}{f' {name!r}' if name else ''} (shape {tuple(p.shape)})"


class ShardNormReducer:
    """Combines per-rank partial results of a parameter split into shards over ``group``.

    Every shard (piece) of such a parameter carries one as ``shard_reducer``; the optimizer layer
    (``optim.clip_grad_norm``, LAMB) calls :meth:`all_reduce` on it to get norms over whole
    parameters without importing the distributed package. Every rank of the group must call it
    at the same point (they do: each holds a piece of every sharded parameter)."""

    _by_group: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Group -> reducer

    def __init__(self, group, n: int):
        self.group, self.n = group, n

    @classmethod
    def of(cls, group, n: int) -> ShardNormReducer:
        """The one reducer of ``group``: all its pieces share it, so ``clip_grad_norm`` makes one
        collective per group, not one per wrapped module."""
        found = cls._by_group.get(group)
        if found is None or found.n != n:
            found = cls._by_group[group] = cls(group, n)
        return found

    def all_reduce(self, values, op: str = "sum"):
        """``values`` (floats) reduced element-wise over the group (``"sum"`` or ``"max"``), as a
        float64 NumPy array."""
        x = np.array(values, dtype=np.float64)
        if self.n > 1:
            comm.all_reduce(x, op, self.group)
        return x


class ShardedBucket:
    """Parameters of one dtype and device, back to back in a flat layout padded to a multiple of
    ``n``; rank ``r`` owns shard ``r``: ``segments`` are ``(param index in the bucket, start,
    stop)`` flat element ranges of the parameters that fall in it."""

    def __init__(self, params: list, n: int, rank: int):
        self.params = params
        self.n, self.rank = n, rank
        self.sizes = [int(p.size) for p in params]
        self.total = sum(self.sizes)
        self.shard_size = -(-self.total // n) if n > 1 else self.total
        self.segments = shard_segments(self.sizes, rank, n)
        self._all_segments = None

    def all_segments(self) -> list[list[tuple[int, int, int]]]:
        """Every rank's segments, in group order (computed once)."""
        if self._all_segments is None:
            self._all_segments = [shard_segments(self.sizes, r, self.n) for r in range(self.n)]
        return self._all_segments

    def pack_shard(self, pieces: list, out=None):
        """This rank's shard: ``pieces`` (flat arrays, one per segment) then zero padding,
        written into ``out`` (``shard_size`` elements, cast to its dtype) when given, else into
        a new array of the parameters' dtype."""
        if out is None:
            xp = get_array_module(self.params[0].data)
            out = xp.empty(self.shard_size, self.params[0].dtype)
        pos = 0
        for piece in pieces:
            out[pos : pos + piece.size] = piece
            pos += piece.size
        out[pos:] = 0
        return out

    def write_gathered(self, shards: list) -> None:
        """Write the all-gathered shards (group order) into the parameters, padding dropped:
        each rank's segments straight into the parameters' arrays (no full-size copy), or
        through one concatenation for a parameter that is read-only or not contiguous."""
        direct = all(getattr(p.data.flags, "writeable", True) and p.data.flags.c_contiguous
                     for p in self.params)
        if not direct:
            xp = get_array_module(shards[0])
            flat = xp.concatenate(shards)
            offset = 0
            for p, size in zip(self.params, self.sizes):
                p.set_value(flat[offset : offset + size].reshape(p.shape))
                offset += size
            return
        for shard, segments in zip(shards, self.all_segments()):
            pos = 0
            for i, a, b in segments:
                self.params[i].data.reshape(-1)[a:b] = shard[pos : pos + b - a]
                pos += b - a


class ZeroRedundancyOptimizer(Optimizer):
    """Wrap ``optimizer_class`` so that each rank of ``group`` keeps only its shard's optimizer
    state (ZeRO-1; PyTorch's name and signature, MegEngine-style ``group=``, None = WORLD).

    ``params``: Parameters or param-group dicts, as for any optimizer; ``**defaults``: the
    wrapped optimizer's hyper-parameters (``lr=...``). ``param_groups`` are the user's groups
    (LR schedulers change them; the wrapped optimizer follows at each step). ``optim`` is the
    local optimizer over this rank's pieces.

    Example::

        opt = dist.ZeroRedundancyOptimizer(net.parameters(), optimizer_class=optim.SGD,
                                           lr=0.1, momentum=0.9)
    """

    def __init__(self, params, optimizer_class=None, group=None,
                 bucket_cap_mb: float = DEFAULT_BUCKET_MB, **defaults):
        if optimizer_class is None or not (
            isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)
        ):
            raise TypeError(
                "ZeroRedundancyOptimizer: optimizer_class must be an Optimizer subclass such as "
                f"optim.Adam, got {optimizer_class!r}"
            )
        self.group = resolve_group(WORLD if group is None else group)
        self.n, self.rank = group_size_and_rank(self.group)
        if isinstance(params, Tensor):
            params = [params]
        params = list(params)
        groups = params if params and isinstance(params[0], dict) else [{"params": params}]
        groups = [dict(g, params=list(g["params"])) for g in groups]
        if not any(g["params"] for g in groups):
            raise ValueError("ZeroRedundancyOptimizer: got an empty parameter list")
        # a plain optimizer over the full parameters checks the arguments and fills in defaults;
        # it allocates no state (state appears at the first step)
        all_params = [p for g in groups for p in g["params"]]
        names = [getattr(p, "name", None) or f"parameter {k}" for k, p in enumerate(all_params)]
        check_same_models("ZeroRedundancyOptimizer", names, all_params, self.group, self.n)
        checked = optimizer_class(groups, **defaults)
        self._defaults = dict(checked._defaults)
        self.param_groups = checked.param_groups
        self._state: dict = {}
        self._buckets = self._make_buckets(int(bucket_cap_mb * 1024 * 1024))
        self._reducer = ShardNormReducer.of(self.group, self.n)
        self._pieces: list = []  # (bucket, segment, piece Parameter) in the local optimizer's order
        piece_groups = []
        for gi, g in enumerate(self.param_groups):
            pieces = []
            for gj, bucket in self._buckets:
                if gj != gi:
                    continue
                # a piece of every parameter on every rank (empty where this rank owns none of
                # it): collectives made per piece (LAMB's norms) then match across ranks
                owned = {i: (a, b) for i, a, b in bucket.segments}
                for i, p in enumerate(bucket.params):
                    a, b = owned.get(i, (0, 0))
                    seg = (i, a, b)
                    piece = Parameter(to_flat(p.data)[a:b].copy(), device=p.device)
                    piece.shard_reducer = self._reducer
                    pieces.append(piece)
                    self._pieces.append((bucket, seg, piece))
            piece_groups.append(dict({k: v for k, v in g.items() if k != "params"},
                                     params=pieces))
        self.optim = optimizer_class(piece_groups, **defaults)
        self._consolidated: dict | None = None

    def _make_buckets(self, cap: int) -> list:
        """``[(param group index, ShardedBucket)]``: each group's parameters split by (dtype,
        device), a new bucket once one holds ``cap`` bytes; every rank builds the same list."""
        out = []
        for gi, g in enumerate(self.param_groups):
            open_: dict = {}
            for p in g["params"]:
                key = layout_key(p)
                items = open_.setdefault(key, [])
                items.append(p)
                if sum(q.data.nbytes for q in items) >= cap:
                    out.append((gi, ShardedBucket(open_.pop(key), self.n, self.rank)))
            out.extend((gi, ShardedBucket(items, self.n, self.rank)) for items in open_.values())
        return out

    def add_param_group(self, param_group: dict):
        """Not supported after construction (the shards are laid out once)."""
        raise NotImplementedError(
            "ZeroRedundancyOptimizer.add_param_group: pass every param group to the constructor"
        )

    # -- the step ---------------------------------------------------------------------------------
    def step(self) -> ZeroRedundancyOptimizer:
        """Update this rank's pieces with the wrapped optimizer, then all-gather every bucket's
        updated shards into the parameters of all ranks; returns self."""
        params = self._params()
        has_grad = np.array([p.grad is not None for p in params], np.uint8)
        check_same_on_all_ranks(
            "ZeroRedundancyOptimizer.step", has_grad, params, self.group, self.n,
            "has a gradient on ranks {yes} but none on ranks {no} (a rank stepped without "
            "backward, or computed a different graph)",
        )
        for own, local in zip(self.param_groups, self.optim.param_groups, strict=True):
            for k, v in own.items():
                if k != "params":
                    local[k] = v
        for bucket, (i, a, b), piece in self._pieces:
            p = bucket.params[i]
            piece.data[...] = to_flat(p.data)[a:b]  # the parameter may have been reloaded
            piece.grad = None if p.grad is None else to_flat(grad_array(p))[a:b]
        self.optim.step()
        for *_, piece in self._pieces:
            piece.grad = None
        self._all_gather_shards()
        return self

    def _all_gather_shards(self) -> None:
        by_bucket: dict = {id(b): [] for _, b in self._buckets}
        for bucket, _, piece in self._pieces:
            by_bucket[id(bucket)].append(piece.data)
        works = []
        for _, bucket in self._buckets:  # all started, then all waited: transfers overlap
            shard = bucket.pack_shard(by_bucket[id(bucket)])
            if self.n == 1:
                bucket.write_gathered([shard])
            else:
                works.append((bucket, comm.all_gather(shard, self.group, async_op=True)))
        for bucket, work in works:
            bucket.write_gathered(work.wait())

    # -- state ------------------------------------------------------------------------------------
    def local_state_bytes(self) -> int:
        """Bytes of the optimizer-state arrays this rank holds (about 1/n of the full state)."""
        return sum(
            int(v.nbytes) for st in self.optim.state_dict()["state"].values() for v in st.values()
            if getattr(v, "ndim", 0) > 0
        )

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Collect every rank's shard of the optimizer state on global rank ``to`` (every rank
        must call it); then ``state_dict()`` on that rank returns the full state, in the format of
        the plain optimizer (it loads into one)."""
        params = self._params()
        index = {id(p): k for k, p in enumerate(params)}
        mine = []
        local = self.optim.state_dict()["state"]
        for j, (bucket, (i, a, b), _) in enumerate(self._pieces):
            if j in local and b > a:
                mine.append([index[id(bucket.params[i])], a, b, local[j]])
        if self.n == 1:
            everyone = [mine]
        else:
            everyone = [None] * self.n
            all_gather_object(everyone, mine, self.group)
        my_global = self.group.ranks[self.rank] if is_distributed() else 0
        if my_global != to:
            self._consolidated = None
            return
        pieces: dict = {}
        for rank_pieces in everyone:
            for k, a, b, st in rank_pieces:
                pieces.setdefault(k, []).append((a, b, st))
        state = {}
        for k, parts in pieces.items():
            parts.sort(key=lambda t: t[0])
            p = params[k]
            covered = sum(b - a for a, b, _ in parts)
            if covered != p.size:
                continue  # some ranks' pieces never stepped: no full state to report
            full = {}
            for name, value in parts[0][2].items():
                if hasattr(value, "shape") and getattr(value, "ndim", 0) > 0:
                    full[name] = np.concatenate([st[name] for _, _, st in parts]).reshape(p.shape)
                else:
                    full[name] = value
            state[k] = full
        groups = []
        for g in self.param_groups:
            hyper = {k: v for k, v in g.items() if k != "params"}
            hyper["params"] = [index[id(p)] for p in g["params"]]
            groups.append(hyper)
        self._consolidated = {"param_groups": groups, "state": state}

    def state_dict(self) -> dict:
        """The full optimizer state gathered by :meth:`consolidate_state_dict` on this rank."""
        if self._consolidated is None:
            raise RuntimeError(
                "ZeroRedundancyOptimizer.state_dict: call consolidate_state_dict(to=r) on every "
                "rank first; state_dict() then works on rank r only"
            )
        return self._consolidated

    def state_shard(self, p) -> tuple[int, int] | None:
        """``(start, stop)``: the range of ``p``'s flattened elements whose optimizer state this
        rank holds (empty where it holds none of ``p``); None for a tensor this optimizer does
        not manage. Distributed checkpoints save the state as these slices of the logical
        tensors, so it loads into any number of ranks, or into a plain optimizer."""
        j = self._piece_of().get(id(p))
        if j is None:
            return None
        _, (_, a, b), _ = self._pieces[j]
        return a, b

    def _piece_of(self) -> dict:
        """id(full parameter) -> position of its piece in the local optimizer."""
        return {id(bucket.params[i]): j for j, (bucket, (i, _, _), _) in enumerate(self._pieces)}

    def _local_groups(self) -> list:
        """The local optimizer's param groups as a state dict names them (piece positions),
        with the user's current hyper-parameters."""
        groups, start = [], 0
        for own, g in zip(self.param_groups, self.optim.param_groups, strict=True):
            hyper = {k: v for k, v in own.items() if k != "params"}
            hyper["params"] = list(range(start, start + len(g["params"])))
            start += len(g["params"])
            groups.append(hyper)
        return groups

    def sharded_state_dict(self) -> dict:
        """This rank's part of the state, without communication: the plain optimizer's format
        over the full parameters (``param_groups`` and state keys as in :meth:`state_dict`), each
        state array being the 1-D slice :meth:`state_shard` names. What distributed checkpoints
        save; :meth:`load_sharded_state_dict` takes it back."""
        local = self.optim.state_dict()["state"]
        index = {id(p): k for k, p in enumerate(self._params())}
        state = {}
        for j, (bucket, (i, _, _), _) in enumerate(self._pieces):
            if local.get(j):
                state[index[id(bucket.params[i])]] = local[j]
        groups = []
        for g in self.param_groups:
            hyper = {k: v for k, v in g.items() if k != "params"}
            hyper["params"] = [index[id(p)] for p in g["params"]]
            groups.append(hyper)
        return {"param_groups": groups, "state": state}

    def load_sharded_state_dict(self, state_dict: dict) -> ZeroRedundancyOptimizer:
        """Load this rank's part of the state (the format of :meth:`sharded_state_dict`: arrays
        are the slices :meth:`state_shard` names, for this rank and this group size)."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"ZeroRedundancyOptimizer.load_sharded_state_dict: the state has "
                f"{len(saved_groups)} param group(s), this optimizer has {len(self.param_groups)}")
        for own, saved in zip(self.param_groups, saved_groups, strict=True):
            own.update({k: v for k, v in saved.items() if k != "params"})
        params = self._params()
        piece_of = self._piece_of()
        local = {}
        for key, st in state_dict["state"].items():
            k = int(key)
            if not 0 <= k < len(params):
                raise ValueError(
                    f"ZeroRedundancyOptimizer.load_sharded_state_dict: state for parameter {k}, "
                    f"but there are only {len(params)} parameters")
            local[piece_of[id(params[k])]] = st
        self.optim.load_state_dict({"param_groups": self._local_groups(), "state": local})
        return self

    def load_state_dict(self, state_dict: dict) -> ZeroRedundancyOptimizer:
        """Load a full state (from :meth:`state_dict` or from a plain optimizer): each rank keeps
        the slice of its pieces."""
        # the wrapped class over the full parameters checks the state against them (counts,
        # shapes) and restores it; it lives only until each piece has its slice
        full = type(self.optim)([dict(g) for g in self.param_groups]).load_state_dict(state_dict)
        checked = full.state_dict()
        for own, saved in zip(self.param_groups, checked["param_groups"], strict=True):
            own.update({k: v for k, v in saved.items() if k != "params"})
        index = {id(p): k for k, p in enumerate(self._params())}
        local = {}
        for j, (bucket, (i, a, b), _) in enumerate(self._pieces):
            st = checked["state"].get(index[id(bucket.params[i])])
            if st:
                local[j] = {name: (v.reshape(-1)[a:b].copy() if getattr(v, "ndim", 0) > 0 else v)
                            for name, v in st.items()}
        self.optim.load_state_dict({"param_groups": self._local_groups(), "state": local})
        return self


def to_flat(a):
    """``a`` as a flat view (parameters and gradients are contiguous)."""
    return a.reshape(-1)


def grad_array(p):
    """The parameter's gradient as a backend array."""
    return p.grad.data if isinstance(p.grad, Tensor) else p.grad


def check_same_on_all_ranks(where: str, flags, params: list, group, n: int, what: str) -> None:
    """All-gather a small per-parameter flag array and raise on every rank, naming the first
    parameter and the ranks, when the ranks disagree (before a collective could hang)."""
    if n == 1:
        return
    rows = comm.all_gather(np.ascontiguousarray(flags), group)
    ranks = group.ranks
    table = np.stack([to_numpy(r) for r in rows])
    differs = np.nonzero((table != table[0]).any(axis=0))[0]
    if len(differs):
        k = int(differs[0])
        yes = [ranks[r] for r in range(n) if table[r, k]]
        no = [ranks[r] for r in range(n) if not table[r, k]]
        raise RuntimeError(f"{where}: {param_name(params, k)} " + what.format(yes=yes, no=no))


def check_same_models(where: str, names: list, params: list, group, n: int) -> None:
    """Raise on every rank when the ranks' modules differ in parameter names, shapes or dtypes,
    naming the first parameter that differs and the ranks (one object all-gather)."""
    if n == 1:
        return
    mine = [[name, list(p.shape), p.dtype.name] for name, p in zip(names, params)]
    everyone = [None] * n
    all_gather_object(everyone, mine, group)
    ranks = group.ranks
    for r, theirs in enumerate(everyone):
        if theirs == everyone[0]:
            continue
        for k in range(max(len(theirs), len(everyone[0]))):
            a = everyone[0][k] if k < len(everyone[0]) else None
            b = theirs[k] if k < len(theirs) else None
            if a != b:
                raise ValueError(
                    f"{where}: the ranks' modules differ at parameter {k}: rank {ranks[0]} has "
                    f"{_describe(a)}, rank {ranks[r]} has {_describe(b)}"
                )


def _describe(entry) -> str:
    if entry is None:
        return "no parameter"
    name, shape, dtype = entry
    return f"{name!r} of shape {tuple(shape)} {dtype}"
