"""DataLoader: turn a dataset + sampler into an iterator of collated NumPy batches.

Batching is the sampler's job (MegEngine semantics): each list of indices it yields becomes one
batch: ``dataset[i]`` for each index, then ``transform.apply_batch``, then ``collator.apply``.
With ``num_workers > 0`` batches are built in worker processes (fork on Linux) and handed back in
sampler order. A worker's exception is re-raised in the main process as MegEngine (and PyTorch) do:
``RuntimeError("Caught ValueError in DataLoader worker process 0 ...")`` carrying the worker's
original traceback, with the original exception (rebuilt when possible) as its ``__cause__``.
``timeout`` bounds the wait for each batch, also for a ``StreamDataset``, whose items are then read
by a helper thread so that a stream blocked in ``__iter__`` cannot hang the loader; workers are
shut down on exhaustion, ``break`` (when the iterator is garbage collected), errors and
interpreter exit.

Example::

    ds = MNIST(subset="bundled")
    loader = DataLoader(ds, RandomSampler(ds, batch_size=128, seed=0),
                        transform=Compose([Normalize(33.3, 78.6), ToMode("CHW")]), num_workers=2)
    for images, labels in loader:      # float32 (128, 1, 28, 28), int32 (128,)
        ...

PyTorch's and OneFlow's spelling, ``DataLoader(dataset, batch_size, shuffle=True)`` (also
``drop_last=`` and ``collate_fn=``), builds the sampler from those arguments (a
``RandomSampler`` or ``SequentialSampler`` over the whole dataset on every rank, as theirs does)
and yields batches of Tensors, as theirs do; the MegEngine spelling keeps NumPy batches.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import pickle
import queue
import random
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from minigrad import seams
from minigrad.backend.device import is_cuda_available, probe_gpus
from minigrad.backend.transfer import pin_memory
from minigrad.data.collator import Collator, as_tensors
from minigrad.data.dataset.base import StreamDataset
from minigrad.data.sampler import RandomSampler, Sampler, SequentialSampler, StreamSampler
from minigrad.data.transform import PseudoTransform

__all__ = ["DataLoader", "WorkerInfo", "get_worker_info"]

# Seconds between liveness checks while waiting (a crashed worker is reported within this time).
_POLL_S = 0.2


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker process knows about itself (``None`` in the main process)."""

    id: int
    num_workers: int
    seed: int


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """Inside a DataLoader worker: its :class:`WorkerInfo`; in the main process: ``None``."""
    return _worker_info


class DataLoader:
    """Iterate ``dataset`` in batches chosen by ``sampler``.

    Args:
        dataset: a map-style ``Dataset`` or a ``StreamDataset``.
        sampler: a map sampler (default ``SequentialSampler(dataset, batch_size=1)``), or for a
            StreamDataset a ``StreamSampler`` (default batch size 1).
        transform: applied with ``transform.apply_batch(samples)`` before collating (default
            :class:`~minigrad.data.transform.PseudoTransform`, the identity, as in MegEngine).
        collator: builds the batch (default :class:`Collator`); an object with ``apply`` or a
            callable taking the list of samples.
        num_workers: worker processes building batches (0: in the main process).
        timeout: seconds to wait for one batch (from the workers, or from a StreamDataset's
            iterator) before raising (0: no limit).
        prefetch_factor: batches in flight per worker.
        worker_init_fn: called with the worker id at the start of each worker process.
        pin_memory: copy each batch's arrays into pinned (page-locked) host memory, in the main
            process, so that moving them to a GPU (``mg.tensor(batch, device="gpu0")``) is an
            asynchronous copy on a side stream (``minigrad.backend.transfer``). Without a usable
            GPU it warns once and batches stay as they are.
        batch_size, shuffle, drop_last, collate_fn: PyTorch's and OneFlow's arguments (keywords,
            or ``DataLoader(dataset, batch_size, shuffle)`` by position): the sampler is built from
            them and batches are Tensors (see the module docstring); not with ``sampler``.

    Example::

        loader = DataLoader(train_set, RandomSampler(train_set, batch_size=64, seed=0))
        for images, labels in loader:   # NumPy batches
            ...
    """

    def __init__(
        self,
        dataset: Any,
        sampler: Sampler | None = None,
        transform: Any = None,
        collator: Any = None,
        num_workers: int = 0,
        timeout: float = 0,
        prefetch_factor: int = 2,
        worker_init_fn: Callable[[int], None] | None = None,
        pin_memory: bool = False,
        *,
        batch_size: int | None = None,
        shuffle: bool | None = None,
        drop_last: bool = False,
        collate_fn: Callable | None = None,
    ) -> None:
        if isinstance(sampler, int) and not isinstance(sampler, bool):
            # PyTorch's positional order: DataLoader(dataset, batch_size, shuffle, ...)
            if batch_size is not None:
                raise TypeError("DataLoader: batch_size given twice (by position and keyword)")
            batch_size, sampler = sampler, None
            if isinstance(transform, bool):
                shuffle, transform = transform, None
        torch_style = (batch_size is not None or shuffle is not None or drop_last
                       or collate_fn is not None)
        if torch_style:
            sampler, collator = self._torch_style(dataset, sampler, collator, batch_size,
                                                  shuffle, drop_last, collate_fn)
        self._tensor_batches = torch_style
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"DataLoader: num_workers must be an int >= 0, got {num_workers!r}")
        if not isinstance(timeout, (int, float)) or timeout < 0:
            raise ValueError(f"DataLoader: timeout must be a number >= 0, got {timeout!r}")
        if not isinstance(prefetch_factor, int) or prefetch_factor < 1:
            raise ValueError(
                f"DataLoader: prefetch_factor must be an int >= 1, got {prefetch_factor!r}"
            )
        self.stream = isinstance(dataset, StreamDataset)
        if self.stream:
            sampler = StreamSampler(batch_size=1) if sampler is None else sampler
            if not isinstance(sampler, StreamSampler):
                raise TypeError(
                    f"DataLoader: a StreamDataset needs a StreamSampler, "
                    f"got {type(sampler).__name__}"
                )
        else:
            if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
                raise TypeError(
                    f"DataLoader: dataset must be map-style (__getitem__ and __len__) or a "
                    f"StreamDataset, got {type(dataset).__name__}"
                )
            sampler = SequentialSampler(dataset, batch_size=1) if sampler is None else sampler
            if isinstance(sampler, StreamSampler):
                raise TypeError("DataLoader: StreamSampler only works with a StreamDataset")
        if transform is not None and not hasattr(transform, "apply_batch"):
            raise TypeError(f"DataLoader: transform needs apply_batch, got {transform!r}")
        if transform is None:
            transform = PseudoTransform()
        self.dataset, self.sampler, self.transform = dataset, sampler, transform
        self.collator = Collator() if collator is None else collator
        self.num_workers, self.timeout = num_workers, float(timeout)
        self.prefetch_factor, self.worker_init_fn = prefetch_factor, worker_init_fn
        self.pin_memory = bool(pin_memory)
        # The data position (state_dict): the sampler's state before the current pass, the
        # batches handed out in it, and batches to skip in the next pass (after a load).
        self._pass_start: dict | None = None
        self._delivered = 0
        self._skip = 0
        if self.pin_memory and not is_cuda_available():
            warnings.warn(
                f"DataLoader: pin_memory=True but no GPU is usable ({probe_gpus().reason}); "
                "batches stay in ordinary host memory", RuntimeWarning, stacklevel=2,
            )
            self.pin_memory = False

    @staticmethod
    def _torch_style(dataset, sampler, collator, batch_size, shuffle, drop_last, collate_fn):
        """The sampler and collator that PyTorch's arguments describe."""
        if sampler is not None:
            raise ValueError(
                "DataLoader: give either a sampler (MegEngine) or batch_size/shuffle/drop_last "
                f"(PyTorch), not both; got sampler={sampler!r}"
            )
        if collate_fn is not None and collator is not None:
            raise ValueError("DataLoader: give either collator or collate_fn, not both")
        batch_size = 1 if batch_size is None else batch_size
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be an int >= 1, got {batch_size!r}")
        if isinstance(dataset, StreamDataset):
            sampler = StreamSampler(batch_size=batch_size)
        else:
            kind = RandomSampler if shuffle else SequentialSampler
            sampler = kind(dataset, batch_size, bool(drop_last), world_size=1, rank=0)
        return sampler, collate_fn if collate_fn is not None else collator

    def __len__(self) -> int:
        if self.stream:
            raise TypeError("DataLoader: a StreamDataset has no length")
        return len(self.sampler)

    def __repr__(self) -> str:
        parts = [f"dataset={self.dataset!r}", f"sampler={self.sampler!r}"]
        if type(self.transform) is not PseudoTransform:
            parts.append(f"transform={self.transform!r}")
        parts.append(f"collator={self.collator!r}")
        parts.append(f"num_workers={self.num_workers}")
        if self.num_workers:
            parts.append(f"prefetch_factor={self.prefetch_factor}")
        if self.pin_memory:
            parts.append("pin_memory=True")
        parts.append(f"timeout={self.timeout:g}")
        return "DataLoader(\n" + "".join(f"  {p},\n" for p in parts) + ")"

    def _tasks(self) -> Iterator[tuple[str, list[Any]]]:
        """("indices", [...]) per batch for map-style, ("samples", [...]) read from a stream (in a
        helper thread when a timeout is set, so that a blocked stream cannot hang the caller)."""
        if self.stream:
            batches = (("samples", samples) for samples in self.sampler.batches(self.dataset))
            return _TimedStream(batches, self.timeout) if self.timeout > 0 else batches
        return (("indices", list(indices)) for indices in self.sampler)

    def state_dict(self) -> dict:
        """The data position: the sampler's epoch counter at the start of the current pass and
        the batches handed out in it, so that a resumed run (``load_state_dict`` then ``iter``)
        reads the next batch, not the first. Map-style datasets only."""
        if self.stream:
            raise TypeError(f"DataLoader.state_dict: {_NO_STREAM_POSITION}")
        if self._pass_start is None:
            return {"sampler": self.sampler.state_dict(), "batches": 0}
        return {"sampler": dict(self._pass_start), "batches": self._delivered}

    def load_state_dict(self, state: dict) -> None:
        """Resume at the position :meth:`state_dict` returned: the next ``iter`` continues that
        pass after its last batch (the order comes from the sampler's seed and epoch; skipped
        batches are not loaded), or starts the following epoch when the pass was complete."""
        if self.stream:
            raise TypeError(f"DataLoader.load_state_dict: {_NO_STREAM_POSITION}")
        self.sampler.load_state_dict(state["sampler"])
        batches = int(state["batches"])
        self._pass_start, self._delivered, self._skip = None, 0, batches
        if batches and batches >= len(self.sampler):  # that pass was over: start the next one
            self.sampler.load_state_dict(
                {"epoch": self.sampler.upcoming_epoch(), "started": True})
            self._skip = 0

    def _positioned(self, tasks: Iterator) -> Iterator:
        """``tasks`` after the batches to skip (a resumed pass); counts the pass's start."""
        skip, self._skip = self._skip, 0
        self._delivered = skip
        return itertools.islice(tasks, skip, None) if skip else tasks

    def __iter__(self) -> Iterator[Any]:
        resumable = not self.stream and hasattr(self.sampler, "state_dict")
        if resumable:
            self._pass_start = self.sampler.state_dict()
        tasks = self._tasks()
        if resumable:
            tasks = self._positioned(tasks)
        if self.num_workers == 0:
            batches = (_build(self.dataset, self.transform, self.collator, t) for t in tasks)
        else:
            batches = _WorkerPool(self, tasks)
        batches = map(pin_memory, batches) if self.pin_memory else batches
        batches = map(as_tensors, batches) if self._tensor_batches else batches
        tracer = seams.TRACER.value  # the profiler, when one runs
        batches = batches if tracer is None else _traced(batches, tracer)
        return batches if self.stream else _Counted(batches, self)


class _Counted:
    """The batches of a pass, counting those handed out (the loader's position); other
    attributes are the wrapped iterator's (a worker pool's ``pids``, ``shutdown``)."""

    def __init__(self, batches: Iterator[Any], loader: DataLoader) -> None:
        self._batches, self._loader = batches, loader

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> Any:
        batch = next(self._batches)
        self._loader._delivered += 1
        return batch

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_batches", "_loader"):
            raise AttributeError(name)
        return getattr(self._batches, name)


def _traced(batches: Iterator[Any], tracer) -> Iterator[Any]:
    """The batches, each fetch timed on the running profiler's timeline."""
    batches = iter(batches)
    for index in itertools.count():
        try:
            with tracer.span("DataLoader batch", "data", index=index):
                batch = next(batches)
        except StopIteration:
            return
        yield batch


#: Why a loader over a stream cannot save or restore its position, and what to do instead.
_NO_STREAM_POSITION = (
    "a StreamDataset has no position to save or resume: a stream is read in order, without "
    "indices, so the loader can neither record where it is nor go back there. Leave this loader "
    "out of the checkpoint's state and keep the position yourself (save how many samples were "
    "read, and let the StreamDataset's __iter__ start after them), or use a map-style Dataset "
    "(__getitem__ and __len__), whose loader resumes at the next batch")


def _read_stream(batches: Iterator[Any], out: queue.Queue, stop: threading.Event) -> None:
    """Body of a ``_TimedStream`` thread: move batches into ``out`` until the stream ends or fails
    or ``stop`` is set. It never references the ``_TimedStream`` itself, which can therefore be
    garbage collected (and stop the thread) while the thread waits."""
    def put(item) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    try:
        for batch in batches:
            if not put(("batch", batch)):
                return
    except BaseException as exc:  # handed to the consumer, which raises it
        put(("error", exc))
        return
    put(("end", None))


class _TimedStream:
    """Iterate a stream's batches with a bound on the wait for each: a daemon thread reads the
    stream (a ``StreamDataset.__iter__`` may block forever on a socket or a pipe) and this side
    waits for it at most ``timeout`` seconds, then raises a clear error."""

    def __init__(self, batches: Iterator[Any], timeout: float) -> None:
        self.timeout = timeout
        self.queue: queue.Queue = queue.Queue(maxsize=2)
        self.stop = threading.Event()
        # started on the first next() so that worker processes are forked before it exists
        self.thread = threading.Thread(target=_read_stream, args=(batches, self.queue, self.stop),
                                       daemon=True, name="minigrad-stream-reader")
        self.done = False

    def __iter__(self) -> _TimedStream:
        return self

    def __next__(self) -> Any:
        if self.done:
            raise StopIteration
        if self.thread.ident is None:
            self.thread.start()
        try:
            kind, value = self.queue.get(timeout=self.timeout)
        except queue.Empty:
            raise RuntimeError(
                f"DataLoader timed out after {self.timeout:g}s waiting for the StreamDataset to "
                "produce samples; raise timeout= or check the stream for blocking reads"
            ) from None
        if kind == "batch":
            return value
        self.done = True
        self.close()
        if kind == "error":
            raise value
        raise StopIteration

    def close(self) -> None:
        self.stop.set()

    def __del__(self) -> None:
        self.stop.set()


def _build(dataset: Any, transform: Any, collator: Any, task: tuple[str, list[Any]]) -> Any:
    kind, payload = task
    samples = [dataset[i] for i in payload] if kind == "indices" else payload
    if type(transform) is not PseudoTransform:  # the identity: skip the per-sample calls
        samples = transform.apply_batch(samples)
    return collator.apply(samples) if hasattr(collator, "apply") else collator(samples)


class _WorkerError:
    """A worker's exception, carried to the main process as (type, message, traceback text)."""

    def __init__(self, worker_id: int, exc: BaseException) -> None:
        self.worker_id, self.pid = worker_id, os.getpid()
        self.text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.message = str(exc)
        try:
            self.exc_type: type | None = pickle.loads(pickle.dumps(type(exc)))
        except Exception:
            self.exc_type = None
        self.type_name = type(exc).__qualname__

    def reraise(self) -> None:
        msg = (
            f"Caught {self.type_name} in DataLoader worker process {self.worker_id} "
            f"(pid {self.pid}).\nOriginal {self.text}"
        )
        try:  # the original exception, when its type can be rebuilt from the message alone
            cause = self.exc_type(self.message) if self.exc_type is not None else None
        except Exception:
            cause = None
        raise RuntimeError(msg) from (cause if isinstance(cause, BaseException) else None)


def _worker_loop(
    loader: DataLoader, index_q: Any, result_q: Any, worker_id: int, seed: int
) -> None:
    """Body of a worker process: build batches for tasks until a ``None`` sentinel arrives."""
    global _worker_info
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is handled (and cleaned up) by the parent
    # Results are only abandoned when the parent no longer wants them, so never block exit on them.
    result_q.cancel_join_thread()
    np.random.seed(seed % 2**32)  # NumPy's legacy seeds are 32-bit
    random.seed(seed)
    _worker_info = WorkerInfo(worker_id, loader.num_workers, seed)
    parent = os.getppid()
    init_error = None
    try:
        if loader.worker_init_fn is not None:
            loader.worker_init_fn(worker_id)
    except Exception as exc:
        init_error = _WorkerError(worker_id, exc)  # reported as the result of every task
    while True:
        try:
            task = index_q.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # orphaned: the parent died without shutting us down
                return
            continue
        if task is None:
            return
        idx, work = task
        if init_error is not None:
            result_q.put(pickle.dumps((idx, init_error)))
            continue
        try:
            batch = _build(loader.dataset, loader.transform, loader.collator, work)
            out = pickle.dumps((idx, batch), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # also catches unpicklable batches
            out = pickle.dumps((idx, _WorkerError(worker_id, exc)))
        result_q.put(out)


class _WorkerPool:
    """One epoch of multi-process loading: dispatch tasks round-robin, reorder the results."""

    def __init__(self, loader: DataLoader, tasks: Iterator[tuple[str, list[Any]]]) -> None:
        methods = mp.get_all_start_methods()
        ctx = mp.get_context("fork" if "fork" in methods and sys.platform != "darwin" else None)
        self.loader, self.tasks, self.timeout = loader, tasks, loader.timeout
        self.n = loader.num_workers
        self.closed = False
        self.result_q = ctx.Queue()
        self.index_qs = [ctx.Queue() for _ in range(self.n)]
        base_seed = int(np.random.randint(0, 2**31 - 1))  # controllable via np.random.seed
        self.workers = []
        for wid in range(self.n):
            w = ctx.Process(
                target=_worker_loop,
                args=(loader, self.index_qs[wid], self.result_q, wid, base_seed + wid),
                daemon=True,
                name=f"minigrad-dataloader-{wid}",
            )
            w.start()
            self.workers.append(w)
        self.sent = self.received = 0
        self.exhausted = False
        self.buffer: dict[int, Any] = {}
        try:
            for _ in range(self.n * loader.prefetch_factor):
                self._dispatch()
        except BaseException:
            self.shutdown()
            raise

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    def _dispatch(self) -> None:
        if self.exhausted:
            return
        try:
            task = next(self.tasks)
        except StopIteration:
            self.exhausted = True
            return
        self.index_qs[self.sent % self.n].put((self.sent, task))
        self.sent += 1

    def __iter__(self) -> _WorkerPool:
        return self

    def __next__(self) -> Any:
        if self.closed:
            raise StopIteration
        try:
            if self.received == self.sent and self.exhausted:
                self.shutdown()
                raise StopIteration
            while self.received not in self.buffer:
                idx, result = self._get()
                self.buffer[idx] = result
            result = self.buffer.pop(self.received)
            self.received += 1
            if isinstance(result, _WorkerError):
                result.reraise()
            self._dispatch()
            return result
        except BaseException:
            self.shutdown()
            raise

    def _get(self) -> tuple[int, Any]:
        start = time.monotonic()
        while True:
            try:
                idx, result = pickle.loads(self.result_q.get(timeout=_POLL_S))
            except queue.Empty:
                pass
            else:
                return idx, result
            for wid, w in enumerate(self.workers):
                if not w.is_alive():
                    raise RuntimeError(
                        f"DataLoader worker {wid} (pid {w.pid}) exited unexpectedly with exit "
                        f"code {w.exitcode} while batch {self.received} was pending"
                    )
            waited = time.monotonic() - start
            if self.timeout > 0 and waited >= self.timeout:
                wid = self.received % self.n
                raise RuntimeError(
                    f"DataLoader timed out after {self.timeout:g}s waiting for batch "
                    f"{self.received} from worker {wid} (pid {self.workers[wid].pid}); raise "
                    f"timeout= or check the dataset for slow or blocking reads"
                )

    def shutdown(self) -> None:
        """Stop and reap all workers; safe to call more than once."""
        if self.closed:
            return
        self.closed = True
        if isinstance(self.tasks, _TimedStream):
            self.tasks.close()
        for q in self.index_qs:
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 1.0  # idle workers exit at once; busy ones get terminated
        for w in self.workers:
            w.join(timeout=max(0.0, deadline - time.monotonic()))
        for w in self.workers:
            if w.is_alive():
                w.terminate()
                w.join(timeout=2.0)
            if w.is_alive():
                w.kill()
                w.join()
        for q in [*self.index_qs, self.result_q]:
            q.cancel_join_thread()
            q.close()
        self.buffer.clear()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass
