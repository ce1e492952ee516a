"""``GradScaler``: dynamic loss scaling, with MegEngine's and PyTorch's spellings on one object.

float16 gradients underflow: most of a network's gradients are smaller than float16's smallest
normal (6e-5). The loss is multiplied by a large *scale* before backward, so the gradients are
large enough; they are divided by it again (*unscaled*) before the optimizer sees them. When a
scaled gradient overflows (inf or NaN), the step is skipped and the scale halves (``backoff``);
after ``growth_interval`` steps in a row without overflow it doubles (``growth``).

Two spellings, one state::

    # MegEngine
    with gm:
        loss = ...
        scaler.backward(gm, loss)      # scale, backward, unscale, check, update the scale
    opt.step().clear_grad()            # overflow: every gradient is None, nothing moves

    # PyTorch
    with gm:
        gm.backward(scaler.scale(loss))
    scaler.step(opt)                   # unscale_ (unless done), then opt.step() unless overflow
    scaler.update()
    opt.clear_grad()

The overflow report: every rank learns which parameters overflowed on which rank (their module
path when the scaler knows the model, ``GradScaler(module=net)``), the scale before and after and
how many steps were skipped in a row; it is :attr:`GradScaler.last_overflow` and a
:class:`OverflowWarning`. After ``max_consecutive_skips`` skipped steps in a row the scaler raises
:class:`LossScaleCollapse` instead of training nothing.

Distributed: whether any gradient overflowed is summed over ``group`` (default: every rank of
the job, which covers the data, tensor and pipeline groups at once), so every rank skips the same
steps and keeps the same scale. The pipeline engine drives a scaler itself:
``PipelineEngine(..., scaler=GradScaler(module=net))`` (``docs/amp.md``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings

import numpy as np

from minigrad import seams
from minigrad.amp.master_weights import MasterWeights
from minigrad.autodiff.tensor import Tensor
from minigrad.backend import kernels
from minigrad.backend.dtypes import is_floating
from minigrad.backend.xp import to_numpy
from minigrad.distributed.comm.arrays import all_reduce as all_reduce_array
from minigrad.distributed.comm.collectives import all_gather_object
from minigrad.distributed.comm.group import get_rank, get_world_size, is_distributed
from minigrad.module.module import Module


class OverflowWarning(UserWarning):
    """A step was skipped because a gradient held inf or NaN (the message names it)."""


class LossScaleCollapse(RuntimeError):
    """Too many steps in a row were skipped for overflowing gradients."""


@dataclasses.dataclass
class OverflowReport:
    """One skipped step: ``tensors`` maps each rank that found a non-finite gradient to the names
    of those parameters; ``scale_before``/``scale_after`` the loss scale around the backoff;
    ``consecutive`` how many steps in a row have been skipped (this one included)."""

    tensors: dict[int, list[str]]
    scale_before: float
    scale_after: float | None = None
    consecutive: int = 1
    #: with ``GradScaler(debug=True)``: per rank, the first module whose forward output held
    #: inf/nan in this iteration (ranks whose forward stayed finite are left out)
    first_forward: dict[int, str] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        where = "; ".join(f"rank {r}: {', '.join(names)}" for r, names in sorted(
            self.tensors.items()))
        after = "" if self.scale_after is None else f" -> {self.scale_after:g}"
        forward = "".join(f"; first non-finite forward output on rank {r}: {what}"
                          for r, what in sorted(self.first_forward.items()))
        return (f"GradScaler: gradient overflow (inf/nan), step skipped on every rank; non-finite "
                f"gradients of {where}; loss scale {self.scale_before:g}{after}; "
                f"{self.consecutive} step(s) skipped in a row{forward}")


class GradScaler:
    """Dynamic loss scaling (``megengine.amp.GradScaler``, ``torch.amp.GradScaler``).

    ``init_scale``, ``growth_factor``, ``backoff_factor`` and ``growth_interval`` are MegEngine's
    (and PyTorch's) knobs; ``growth_interval=0`` keeps the scale fixed (static scaling).
    ``module`` names the parameters in the overflow report by their path in it (otherwise a
    tensor's ``name``, else its position and shape). ``group`` is the process group over which
    ranks agree on overflow (default: all ranks when distributed). ``max_consecutive_skips``
    (None: never) raises :class:`LossScaleCollapse` after that many skipped steps in a row.
    ``enabled=False`` makes every method a pass-through (scale 1, nothing checked).
    DeepSpeed's two extra knobs: ``hysteresis`` (default 1: back off at every overflow) lets
    ``hysteresis - 1`` overflowing steps be skipped without backing off, counted again from the
    last growth; ``min_scale`` (default 0) is the floor of a backoff.
    ``debug=True`` (needs ``module``) adds to the report the first forward *op* whose output held
    inf/nan (its name and input dtypes and shapes: every op's output is checked while ``module``
    runs forward, through the tracer seam) and the innermost module whose output did (a forward
    hook per module). Slower: for debugging.

    Example::

        scaler = amp.GradScaler(module=net)
        with gm:
            with amp.autocast():
                loss = F.nn.cross_entropy(net(x), y)
            scaler.backward(gm, loss)
        opt.step().clear_grad()
    """

    def __init__(self, init_scale: float = 2.0**4, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, *,
                 enabled: bool = True, module: Module | None = None, group=None,
                 max_consecutive_skips: int | None = 50, warn: bool = True,
                 debug: bool = False, hysteresis: int = 1, min_scale: float = 0.0):
        if not init_scale > 0:
            raise ValueError(f"GradScaler: init_scale must be > 0, got {init_scale}")
        if not growth_factor > 1.0:
            raise ValueError(f"GradScaler: growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"GradScaler: backoff_factor must be in (0, 1), got {backoff_factor}")
        if growth_interval < 0:
            raise ValueError(f"GradScaler: growth_interval must be >= 0, got {growth_interval}")
        if isinstance(hysteresis, bool) or not isinstance(hysteresis, int) or hysteresis < 1:
            raise ValueError(f"GradScaler: hysteresis must be an int >= 1, got {hysteresis!r}")
        if not 0.0 <= min_scale <= init_scale:
            raise ValueError(
                f"GradScaler: min_scale must be in [0, init_scale={init_scale:g}], got {min_scale}")
        self.enabled = bool(enabled)
        self.scale_factor = float(init_scale) if enabled else 1.0
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.hysteresis = hysteresis
        self.min_scale = float(min_scale)
        self._hysteresis_left = hysteresis  # overflows still allowed before the next backoff
        self.group = group
        self.max_consecutive_skips = max_consecutive_skips
        self.warn = warn
        self._growth_tracker = 0
        self._found_non_finite = False
        self._unscaled: set[int] = set()  # ids of optimizers unscaled since the last update
        self._names: dict[int, str] = {}
        self.consecutive_skips = 0
        self.skipped_steps = 0
        self.last_overflow: OverflowReport | None = None
        self._pending: OverflowReport | None = None
        self._first_forward: str | None = None
        self._first_op: str | None = None
        if module is not None:
            self.name_parameters(module)
        if debug:
            if module is None:
                raise ValueError("GradScaler: debug=True needs module= (the model to watch)")
            for path, sub in module.named_modules():
                sub.register_forward_hook(self._forward_watcher(path or "(the model)"))
            watcher = _NonFiniteOps(self)
            module.register_forward_pre_hook(lambda _m, _args: watcher.start())
            module.register_forward_hook(lambda _m, _args, _out: watcher.stop())

    def _forward_watcher(self, path: str):
        """A forward hook remembering the first module of an iteration whose output is not
        finite (hooks run child first, so that is the innermost module where it started)."""

        def hook(module, inputs, output):
            if self._first_forward is not None:
                return None
            outs = output if isinstance(output, (tuple, list)) else (output,)
            for out in outs:
                if isinstance(out, Tensor) and is_floating(out.dtype) and not bool(
                        out.xp.isfinite(out.data).all()):
                    self._first_forward = (f"{path} ({type(module).__name__}, output "
                                           f"{out.dtype.name} {tuple(out.shape)})")
                    break
            return None

        return hook

    def _first_where(self) -> str | None:
        """The debug report's forward part: the first non-finite op and/or module, or None."""
        parts = [p for p in (self._first_op, self._first_forward) if p is not None]
        return "; innermost module: ".join(parts) if parts else None

    # -- naming -----------------------------------------------------------------------------------
    def name_parameters(self, module_or_names) -> "GradScaler":
        """Name parameters in the overflow report: a Module (its ``named_parameters`` paths, e.g.
        ``blocks.3.mlp.fc2.weight``) or a dict ``{name: tensor}``."""
        items = (module_or_names.named_parameters() if isinstance(module_or_names, Module)
                 else module_or_names.items())
        for name, t in items:
            self._names[id(t)] = name
        return self

    def _name(self, t: Tensor, index: int) -> str:
        name = self._names.get(id(t)) or getattr(t, "name", None)
        return name or f"tensor {index} (shape {tuple(t.shape)}, {t.dtype.name})"

    # -- MegEngine's spelling ---------------------------------------------------------------------
    def backward(self, gm, y=None, dy=None, *, unscale_grad: bool = True,
                 update_scale="if_unscale_grad") -> "GradScaler":
        """MegEngine's step: ``gm.backward`` of ``y`` with its output gradient ``dy`` (ones by
        default) multiplied by the scale, then (``unscale_grad``) :meth:`unscale` of the
        gradients of ``gm``'s attached tensors, then (``update_scale``) :meth:`update`."""
        if not self.enabled:
            gm.backward(y, dy)
            return self
        ys = y if isinstance(y, (list, tuple)) else [y]
        if dy is None:
            dys = [None if t is None else _full_like(t, self.scale_factor) for t in ys]
        else:
            dys = [d * self.scale_factor for d in (dy if isinstance(dy, (list, tuple)) else [dy])]
        if isinstance(y, (list, tuple)):
            gm.backward(list(ys), dys)
        else:
            gm.backward(y, dys[0])
        if unscale_grad:
            self.unscale(gm.attached_tensors())
            if update_scale:
                self.update()
        return self

    def unscale(self, grad_tensors) -> "GradScaler":
        """Divide the gradients of ``grad_tensors`` by the scale and check them; when any is inf or
        NaN on any rank, set every one of them to None (so ``opt.step()`` moves nothing) and
        remember the overflow for :meth:`update` (MegEngine's ``unscale``)."""
        tensors = [t for t in grad_tensors if t is not None]
        if not self.enabled:
            return self
        found = self._unscale_and_check(list(zip(tensors, tensors, strict=True)))
        if found:
            for t in tensors:
                t.grad = None
        return self

    # -- PyTorch's spelling -----------------------------------------------------------------------
    def scale(self, outputs):
        """``outputs * scale`` (a Tensor, or a list/tuple of them): back-propagate this instead of
        the loss (``gm.backward(scaler.scale(loss))``)."""
        if not self.enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        return outputs * self.scale_factor

    def unscale_(self, optimizer) -> None:
        """Divide the gradients of ``optimizer``'s parameters by the scale and check them (once per
        optimizer between two :meth:`update` calls, as PyTorch); gradients are kept even on
        overflow, and :meth:`step` then skips ``optimizer.step()``. With
        :func:`~minigrad.amp.master_weights` the gradients are first copied to the float32
        master weights and unscaled there (no float16 underflow)."""
        if not self.enabled:
            return
        if id(optimizer) in self._unscaled:
            raise RuntimeError("GradScaler.unscale_: already called for this optimizer since the "
                               "last update()")
        if isinstance(optimizer, MasterWeights):
            pairs = optimizer.copy_grads_to_master()
        else:
            pairs = [(p, p) for g in optimizer.param_groups for p in g["params"]]
        self._unscale_and_check(pairs)
        self._unscaled.add(id(optimizer))

    def step(self, optimizer):
        """``optimizer.step()`` unless a gradient overflowed (on any rank); unscales first when
        :meth:`unscale_` was not called. Returns ``optimizer`` either way (so
        ``scaler.step(opt).clear_grad()`` reads like MegEngine)."""
        if not self.enabled:
            optimizer.step()
            return optimizer
        if id(optimizer) not in self._unscaled:
            self.unscale_(optimizer)
        if not self._found_non_finite:
            optimizer.step()
        return optimizer

    # -- shared -----------------------------------------------------------------------------------
    def update(self, new_scale: float | None = None) -> "GradScaler":
        """End the iteration: ``new_scale`` sets the scale; otherwise back off after an overflow
        or grow after ``growth_interval`` clean steps in a row. Reports a skipped step (warning,
        :attr:`last_overflow`) and raises :class:`LossScaleCollapse` after
        ``max_consecutive_skips`` of them."""
        if not self.enabled:
            return self
        found, report = self._found_non_finite, self._pending
        before = self.scale_factor
        if new_scale is not None:
            self.scale_factor = float(to_numpy(new_scale.data) if isinstance(new_scale, Tensor)
                                      else new_scale)
        elif self.growth_interval:
            if found:
                if self._hysteresis_left > 1:  # DeepSpeed's hysteresis: not yet
                    self._hysteresis_left -= 1
                else:
                    self.scale_factor = max(before * self.backoff_factor, self.min_scale)
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker >= self.growth_interval:
                    self.scale_factor = before * self.growth_factor
                    self._growth_tracker = 0
                    self._hysteresis_left = self.hysteresis
        self._found_non_finite, self._pending = False, None
        self._first_forward = self._first_op = None
        self._unscaled.clear()
        if not found:
            self.consecutive_skips = 0
            return self
        self.consecutive_skips += 1
        self.skipped_steps += 1
        report.scale_before, report.scale_after = before, self.scale_factor
        report.consecutive = self.consecutive_skips
        self.last_overflow = report
        if self.warn and get_rank() == 0:  # one warning for the job: the report names every
            warnings.warn(str(report), OverflowWarning, stacklevel=2)  # rank's tensors
        limit = self.max_consecutive_skips
        if limit is not None and self.consecutive_skips >= limit:
            raise LossScaleCollapse(
                f"{report}; giving up after {limit} skipped steps in a row (max_consecutive_skips"
                f"={limit}): the model produces inf/nan at any scale, look at the named tensors"
            )
        return self

    def _unscale_and_check(self, pairs) -> bool:
        """Unscale ``holder.grad`` for each ``(named, holder)`` pair and check it; agree over the
        ranks; remember a report. Returns whether any rank found a non-finite gradient."""
        by_device: dict = {}  # device -> [(index, named, holder)]: one check per device
        for i, (named, holder) in enumerate(pairs):
            if holder.grad is not None:
                by_device.setdefault(holder.device, []).append((i, named, holder))
        bad = []
        for device, items in by_device.items():
            grads = [holder.grad for _, _, holder in items]
            unscaled, flags = kernels.unscale_grads(
                [g.data if isinstance(g, Tensor) else g for g in grads], 1.0 / self.scale_factor)
            for (_, _, holder), arr in zip(items, unscaled):
                holder.grad = Tensor(arr, device=device)
            for k in np.flatnonzero(to_numpy(flags)):  # the one read (wait for the GPU)
                i, named, _ = items[k]
                bad.append(self._name(named, i))
        first = self._first_where()
        local = {get_rank(): (bad, first)} if bad else {}
        if is_distributed():  # every rank skips, or none: agree on the count of bad tensors
            flag = np.array([len(bad)], dtype=np.float64)
            all_reduce_array(flag, group=self.group)
            if flag[0]:  # rare: then every rank learns which tensors, on which rank
                gathered: list = [None] * get_world_size(self.group)
                all_gather_object(gathered, [bad, first], group=self.group)
                ranks = self.group.ranks if self.group is not None else range(len(gathered))
                local = {rank: tuple(got) for rank, got in zip(ranks, gathered)
                         if got[0] or got[1]}
        if local:
            self._found_non_finite = True
            if self._pending is None:
                self._pending = OverflowReport({}, self.scale_factor)
            for rank, (names, first) in local.items():
                if names:
                    self._pending.tensors.setdefault(rank, []).extend(names)
                if first is not None:
                    self._pending.first_forward.setdefault(rank, first)
        return bool(local)

    # -- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """MegEngine's keys: ``scale_factor``, ``growth_factor``, ``backoff_factor``,
        ``growth_interval``, ``_growth_tracker`` (plus the skip counters and the overflows left
        before a backoff, ``hysteresis_left``)."""
        return {
            "scale_factor": self.scale_factor,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": self._growth_tracker,
            "consecutive_skips": self.consecutive_skips,
            "skipped_steps": self.skipped_steps,
            "hysteresis_left": self._hysteresis_left,
        }

    def load_state_dict(self, state: dict) -> "GradScaler":
        """Restore what :meth:`state_dict` returned (a MegEngine dict without the skip counters
        loads too)."""
        missing = {"scale_factor", "growth_factor", "backoff_factor", "growth_interval",
                   "_growth_tracker"} - set(state)
        if missing:
            raise ValueError(f"GradScaler.load_state_dict: missing keys {sorted(missing)}")
        self.scale_factor = float(state["scale_factor"])
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self._growth_tracker = int(state["_growth_tracker"])
        self.consecutive_skips = int(state.get("consecutive_skips", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self._hysteresis_left = int(state.get("hysteresis_left", self.hysteresis))
        return self

    def get_scale(self) -> float:
        """The current loss scale (PyTorch's name)."""
        return self.scale_factor

    def __repr__(self) -> str:
        return (f"GradScaler(scale={self.scale_factor:g}, growth_factor={self.growth_factor}, "
                f"backoff_factor={self.backoff_factor}, growth_interval={self.growth_interval}, "
                f"growth_tracker={self._growth_tracker})")


def _full_like(t: Tensor, value: float) -> Tensor:
    return Tensor(np.full(t.shape, value, dtype=np.float32), dtype=t.dtype, device=t.device)


class _NonFiniteOps:
    """The tracer of ``GradScaler(debug=True)`` while its model runs forward: remembers the first
    op whose output is not finite. Installed in :data:`minigrad.seams.TRACER` for the forward
    only; a running profiler keeps its events (each call is passed on to it)."""

    def __init__(self, scaler: GradScaler):
        self.scaler, self.inner, self.active = scaler, None, False

    def start(self) -> None:
        if not self.active:
            self.inner, self.active = seams.TRACER.install(self), True

    def stop(self) -> None:
        if self.active:
            seams.TRACER.install(self.inner)
            self.inner, self.active = None, False

    def op(self, fn, inputs, call):
        out = call(fn, *inputs) if self.inner is None else self.inner.op(fn, inputs, call)
        if self.scaler._first_op is None:
            for o in out if isinstance(out, tuple) else (out,):
                if isinstance(o, Tensor) and is_floating(o.dtype) and not bool(
                        o.xp.isfinite(o.data).all()):
                    args = ", ".join(f"{x.dtype.name} {tuple(x.shape)}" for x in inputs
                                     if isinstance(x, Tensor))
                    self.scaler._first_op = f"op {type(fn).__name__}({args})"
                    break
        return out

    def backward(self, node, call):
        return call() if self.inner is None else self.inner.backward(node, call)

    def module(self, module, call):
        return call() if self.inner is None else self.inner.module(module, call)

    def event(self, *args, **kwargs) -> None:
        if self.inner is not None:
            self.inner.event(*args, **kwargs)

    def span(self, *args, **kwargs):
        return contextlib.nullcontext() if self.inner is None else self.inner.span(*args, **kwargs)
