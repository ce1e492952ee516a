"""``cupy.cuda.nccl`` for the fake CuPy: communicators of any size whose ranks are processes (forked
inside ``fake_cupy.installed``, by ``run_workers`` say) exchanging their buffers through files in
a folder named after the unique id (under ``fake.scratch``, removed with the fake).

Like NCCL, creating a communicator waits for all its ranks and refuses two ranks on one GPU
(``Duplicate GPU detected``); collectives wait for every rank's contribution and write the result
into the receive buffer (given, as in CuPy, by device pointers and an element count); ``send`` and
``recv`` pair up by peer and order, also between ``groupStart``/``groupEnd``. Sends never wait, so
grouped exchanges in any order complete.

The unique id and the communicator's signature follow the CuPy version the fake plays: CuPy 14's
``get_unique_id()`` returns 128 ``bytes`` and ``NcclCommunicator(int, bytes, int)`` refuses a
tuple; CuPy 13's returns a tuple of 128 signed chars and refuses ``bytes`` (Cython's
``TypeError`` for an argument of the wrong type).
"""

from __future__ import annotations

import ctypes
import os
import time
import types

import numpy as np

#: how long a rank waits for the others before the fake gives up (seconds)
TIMEOUT = 60.0

DTYPES = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
          6: np.float16, 7: np.float32, 8: np.float64}
_CODES = [("INT8", 0), ("UINT8", 1), ("INT32", 2), ("UINT32", 3), ("INT64", 4), ("UINT64", 5),
          ("FLOAT16", 6), ("FLOAT32", 7), ("FLOAT64", 8), ("SUM", 0), ("PROD", 1), ("MAX", 2),
          ("MIN", 3), ("AVG", 4)]
_REDUCE = {0: np.add.reduce, 1: np.multiply.reduce, 2: np.maximum.reduce, 3: np.minimum.reduce}


class NcclError(RuntimeError):
    """``cupy.cuda.nccl.NcclError``: NCCL's status and message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _folder(root: str, uid: bytes) -> str:
    return os.path.join(root, f"nccl-{uid[:16].hex()}")


def _write(path: str, data: bytes) -> None:
    with open(path + ".part", "wb") as f:
        f.write(data)
    os.replace(path + ".part", path)  # readers never see half a buffer


def _wait_read(path: str, what: str) -> bytes:
    deadline = time.monotonic() + TIMEOUT
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise NcclError(6, f"fake NCCL: waited {TIMEOUT:.0f} s for {what} ({path})")
        time.sleep(0.001)
    with open(path, "rb") as f:
        return f.read()


def make_nccl(fake, cupy_version: int = 14) -> types.ModuleType:
    """The ``cupy.cuda.nccl`` module of ``fake`` as CuPy ``cupy_version`` (13 or 14) has it."""
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.available = True
    nccl.NcclError = NcclError
    for name, code in _CODES:
        setattr(nccl, f"NCCL_{name}", code)
    id_type = bytes if cupy_version >= 14 else tuple

    def get_unique_id():
        raw = os.urandom(128)
        return raw if id_type is bytes else tuple(int(v) for v in np.frombuffer(raw, np.int8))

    class NcclCommunicator:
        """A communicator of ``ndev`` ranks; this process is ``rank``, on the current device."""

        def __init__(self, ndev: int, commId, rank: int):  # noqa: N803  (CuPy's names)
            if type(commId) is not id_type:
                raise TypeError(f"Argument 'commId' has incorrect type (expected "
                                f"{id_type.__name__}, got {type(commId).__name__})")
            if len(commId) != 128:
                raise ValueError(f"commId must have 128 entries, got {len(commId)}")
            if not 0 <= rank < ndev:
                raise NcclError(4, f"ncclInvalidArgument: rank {rank} of {ndev}")
            self._size, self._rank = int(ndev), int(rank)
            self._device = fake.current_device()
            uid = commId if id_type is bytes else bytes(np.array(commId, np.int8))
            self._dir = _folder(fake.scratch, uid)
            self._seq = 0
            self._p2p: dict[tuple, int] = {}
            os.makedirs(self._dir, exist_ok=True)
            parts = self._exchange("init", np.array([self._device], np.int64).tobytes())
            devices = [int(np.frombuffer(p, np.int64)[0]) for p in parts]
            if len(set(devices)) != len(devices):
                raise NcclError(5, "ncclInvalidUsage: Duplicate GPU detected: the ranks run on "
                                   f"devices {devices}")

        # -- the exchange through files
        def _exchange(self, tag: str, data: bytes) -> list[bytes]:
            """Every rank's ``data`` for the collective ``tag`` (this rank's own included)."""
            if self._size == 1:
                return [data]
            _write(os.path.join(self._dir, f"{tag}.{self._rank}"), data)
            return [_wait_read(os.path.join(self._dir, f"{tag}.{r}"), f"rank {r} in {tag}")
                    for r in range(self._size)]

        def _collective(self, op: str, stream, send: int, nbytes: int, dtype: int):
            fake._check_current(self._device)
            on = fake.streams[stream, self._device]
            fake.issue(on)
            fake.events.append(f"nccl {op} on {on.name}")
            self._seq += 1
            data = ctypes.string_at(send, nbytes) if nbytes else b""
            parts = self._exchange(f"c{self._seq}-{op}", data)
            return [np.frombuffer(p, DTYPES[dtype]) for p in parts]

        @staticmethod
        def _put(recv: int, array: np.ndarray) -> None:
            array = np.ascontiguousarray(array)
            if array.nbytes:
                ctypes.memmove(recv, array.ctypes.data, array.nbytes)

        def _reduce(self, parts, op: int):
            if op == 4:  # AVG
                return (np.add.reduce(parts) / len(parts)).astype(parts[0].dtype)
            return _REDUCE[op](parts).astype(parts[0].dtype)

        # -- the collectives (CuPy's signatures: pointers, element counts, NCCL's codes)
        def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
            size = count * np.dtype(DTYPES[datatype]).itemsize
            parts = self._collective("allReduce", stream, sendbuf, size, datatype)
            self._put(recvbuf, self._reduce(parts, op))

        def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
            size = count * np.dtype(DTYPES[datatype]).itemsize
            parts = self._collective("reduce", stream, sendbuf, size, datatype)
            if self._rank == root:
                self._put(recvbuf, self._reduce(parts, op))

        def broadcast(self, sendbuf, recvbuf, count, datatype, root, stream):
            size = count * np.dtype(DTYPES[datatype]).itemsize
            parts = self._collective("broadcast", stream, sendbuf, size, datatype)
            self._put(recvbuf, parts[root])

        def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):  # noqa: N802
            size = recvcount * self._size * np.dtype(DTYPES[datatype]).itemsize
            parts = self._collective("reduceScatter", stream, sendbuf, size, datatype)
            mine = slice(self._rank * recvcount, (self._rank + 1) * recvcount)
            self._put(recvbuf, self._reduce([p[mine] for p in parts], op))

        def allGather(self, sendbuf, recvbuf, count, datatype, stream):  # noqa: N802
            size = count * np.dtype(DTYPES[datatype]).itemsize
            parts = self._collective("allGather", stream, sendbuf, size, datatype)
            self._put(recvbuf, np.concatenate(parts))

        def _message(self, direction: str, peer: int, stream) -> int:
            """Issue a send ("to") or receive ("from") on ``stream``; its number between the two
            ranks in that direction (1, 2, ...), which names the message's file."""
            fake._check_current(self._device)
            on = fake.streams[stream, self._device]
            fake.issue(on)
            fake.events.append(f"nccl {'send to' if direction == 'to' else 'recv from'} {peer} "
                               f"on {on.name}")
            k = self._p2p[(direction, peer)] = self._p2p.get((direction, peer), 0) + 1
            return k

        def send(self, sendbuf, count, datatype, peer, stream):
            k = self._message("to", peer, stream)
            size = count * np.dtype(DTYPES[datatype]).itemsize
            _write(os.path.join(self._dir, f"p{self._rank}-{peer}.{k}"),
                   ctypes.string_at(sendbuf, size) if size else b"")

        def recv(self, recvbuf, count, datatype, peer, stream):
            k = self._message("from", peer, stream)
            data = _wait_read(os.path.join(self._dir, f"p{peer}-{self._rank}.{k}"),
                              f"a send from rank {peer}")
            size = count * np.dtype(DTYPES[datatype]).itemsize
            if len(data) != size:
                raise NcclError(5, f"ncclInvalidUsage: recv of {size} bytes from rank {peer}, "
                                   f"which sent {len(data)}")
            self._put(recvbuf, np.frombuffer(data, np.uint8))

        def destroy(self) -> None:
            pass

        def rank_id(self) -> int:
            return self._rank

        def size(self) -> int:
            return self._size

        def device_id(self) -> int:
            return self._device

    nccl.NcclCommunicator = NcclCommunicator
    nccl.get_unique_id = get_unique_id
    nccl.groupStart = nccl.groupEnd = lambda: None
    return nccl
