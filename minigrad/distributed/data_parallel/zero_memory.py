"""``estimate_zero_memory``: bytes of model state per rank for data parallelism and ZeRO 1–3.

What each stage keeps on a rank of ``n`` (``P`` = parameter bytes, ``k`` = optimizer-state arrays
per parameter element: 2 for Adam/AdamW/LAMB/Adadelta, 1 for SGD with momentum and Adagrad):

======= ====================== ============= ===================================================
stage   parameters (at rest)   gradients     optimizer state
======= ====================== ============= ===================================================
0 (DDP) P                      P             k P
1       P                      P             k P / n   (``ZeroRedundancyOptimizer``)
2       P / n                  P / n         k P / n   (``fully_shard(reshard_after_forward=
                                                       False)``: the whole model is gathered
                                                       from forward until backward ends)
3       P / n                  P / n         k P / n   (``fully_shard``: one wrapped module's
                                                       parameters gathered at a time)
======= ====================== ============= ===================================================

Shards are padded to a multiple of ``n`` per layout, so a rank may hold up to ``n - 1`` elements
more per wrapped module; the estimate leaves that out (it is below 1% for real models). The
working set (parameters gathered during forward/backward) is reported separately: all of ``P``
for stages 0–2, the largest wrapped module's parameters for stage 3 (by default the largest
direct sub-module). Activations depend on the batch and the model's code and are not included.

:class:`ModelStateMeter` measures instead of estimating: the peak of the live model-state bytes of
a rank during the steps of a fully-sharded module, counted from the arrays themselves.
"""

from __future__ import annotations

import weakref

from minigrad.distributed.data_parallel.fully_shard import PIECE_OWNER
from minigrad.module.module import Module

#: optimizer-state arrays of the parameter's size that each optimizer keeps per parameter
STATE_ARRAYS = {
    "adam": 2, "adamw": 2, "lamb": 2, "adadelta": 2, "adagrad": 1, "sgd": 1, "sgd_momentum": 1,
    "sgd_plain": 0,
}


def _param_bytes(module: Module) -> int:
    return int(sum(p.size * p.dtype.itemsize for p in module.parameters()))


def estimate_zero_memory(model: Module, stage: int, world_size: int, optimizer: str = "adam",
                         largest_module_bytes: int | None = None, verbose: bool = True) -> dict:
    """Bytes per rank of parameters, gradients and optimizer state for ZeRO ``stage`` (0 = plain
    data parallelism) on ``world_size`` ranks, for ``model`` before it is sharded; prints them
    (``verbose``) and returns ``{"params", "grads", "optimizer_state", "total",
    "working_set"}``. ``optimizer``: a name of :data:`STATE_ARRAYS` ("sgd" means with momentum).
    ``largest_module_bytes``: the parameter bytes of the largest wrapped module (stage 3's
    working set; default: the largest direct sub-module of ``model``). Activations are left out.

    Example::

        dist.estimate_zero_memory(net, stage=3, world_size=8)
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"estimate_zero_memory: stage must be 0, 1, 2 or 3, got {stage!r}")
    if world_size < 1:
        raise ValueError(f"estimate_zero_memory: world_size must be >= 1, got {world_size}")
    name = str(optimizer).lower()
    if name not in STATE_ARRAYS:
        raise ValueError(
            f"estimate_zero_memory: unknown optimizer {optimizer!r}, expected one of "
            f"{sorted(STATE_ARRAYS)}"
        )
    p = _param_bytes(model)
    n, k = world_size, STATE_ARRAYS[name]
    params = p if stage < 2 else p / n
    grads = p if stage < 2 else p / n
    state = k * p if stage == 0 else k * p / n
    if stage < 3:
        working = p
    elif largest_module_bytes is not None:
        working = largest_module_bytes
    else:
        children = [_param_bytes(c) for c in model.children()]
        working = max(children) if children else p
    out = {"params": int(params), "grads": int(grads), "optimizer_state": int(state),
           "total": int(params + grads + state), "working_set": int(working)}
    if verbose:
        print(
            f"ZeRO stage {stage}, {n} rank(s), {name}: per rank params {out['params']:,} B, "
            f"grads {out['grads']:,} B, optimizer state {out['optimizer_state']:,} B, total "
            f"{out['total']:,} B; gathered working set {out['working_set']:,} B; activations "
            "not included"
        )
    return out


class ModelStateMeter:
    """Peak live model-state bytes of one rank while ``fully_shard`` modules train (ZeRO-2/3),
    counted from the arrays: inside the ``with`` block, every all-gather of a wrapped module's
    parameters (forward, and the backward's gather again at stage 3) and every reduce-scatter of
    its full gradients takes a sample of

    * the pieces (``module.parameters()``) and their gradients (also those reduce-scattered and
      not yet handed to ``.grad``),
    * the optimizer state (as it is at the end of the block: an upper bound for the first step),
    * every gathered parameter array still alive (weak references: freed ones count nothing),
    * the full gradients being reduce-scattered.

    ``peak`` is the largest sample, ``samples`` all of them; ``live_gathered()`` the bytes of
    gathered arrays alive now (0 once every wrapped module has freed its working set). Activations
    and the collectives' own buffers (a prefetched all-gather still in flight) are not counted.

    Example::

        with dist.ModelStateMeter(net, opt) as meter:
            train_step()
        print(meter.peak, meter.live_gathered())
    """

    def __init__(self, module: Module, optimizer=None):
        self.module, self.optimizer = module, optimizer
        self.states = [vars(m)["_fully_shard"] for m in module.modules()
                       if "_fully_shard" in vars(m)]
        if not self.states:
            raise ValueError(f"ModelStateMeter: {type(module).__name__} has no fully sharded "
                             "module (call dist.fully_shard first)")
        self.samples: list[int] = []
        self._raw: list[int] = []  # samples without the optimizer state
        self._gathered: dict = {}  # id -> weak reference of a gathered flat array
        self._scattered: list = []  # weak references of the pieces' reduce-scattered gradients
        self._state_bytes = 0

    def __enter__(self) -> "ModelStateMeter":
        self._state_bytes = self.optimizer_state_bytes()
        for state in self.states:
            state.gather = self._gather_of(state)
            state.reduce_scatter = self._reduce_scatter_of(state)
        return self

    def __exit__(self, *exc) -> None:
        for state in self.states:
            del state.gather, state.reduce_scatter  # the class's methods again
        # the state as it is after the steps, added to every sample (an upper bound for the
        # samples of a first step, taken before the optimizer created its state)
        self._state_bytes = self.optimizer_state_bytes()
        self.samples = [s + self._state_bytes for s in self._raw]

    def _gather_of(self, state):
        original = type(state).gather.__get__(state)

        def gather(*args, **kwargs):
            full = original(*args, **kwargs)
            for ref in state.gathered:
                self._gathered[id(ref)] = ref
            self._sample(0)
            return full

        return gather

    def _reduce_scatter_of(self, state):
        original = type(state).reduce_scatter.__get__(state)

        def reduce_scatter(grads):
            self._sample(sum(int(g.nbytes) for g in grads if g is not None))
            out = original(grads)
            self._scattered += [weakref.ref(g) for g in out if g is not None]
            return out

        return reduce_scatter

    def _sample(self, transient: int) -> None:
        pieces = [p for p in self.module.parameters() if PIECE_OWNER.get(p) is not None]
        held = sum(int(p.data.nbytes) for p in pieces)
        # gradients: the pieces' ones, and those reduce-scattered but not yet in .grad (the
        # backward pass hands them over at its end), each array once
        self._scattered = [r for r in self._scattered if r() is not None]
        grads = {id(a): a for a in (r() for r in self._scattered) if a is not None}
        grads.update({id(p.grad.data): p.grad.data for p in pieces if p.grad is not None})
        held += sum(int(a.nbytes) for a in grads.values())
        held += self.live_gathered() + transient
        self._raw.append(held)
        self.samples.append(held + self._state_bytes)

    def live_gathered(self) -> int:
        """Bytes of the gathered parameter arrays alive now (forgets the dead ones)."""
        total = 0
        for key, ref in list(self._gathered.items()):
            a = ref()
            if a is None:
                del self._gathered[key]
            else:
                total += int(a.nbytes)
        return total

    def optimizer_state_bytes(self) -> int:
        """Bytes of the optimizer's state arrays now (0 without an optimizer)."""
        if self.optimizer is None:
            return 0
        return int(sum(v.nbytes for st in self.optimizer.state_dict()["state"].values()
                       for v in st.values() if getattr(v, "ndim", 0) > 0))

    @property
    def peak(self) -> int:
        """The largest sample (bytes)."""
        return max(self.samples, default=0)

