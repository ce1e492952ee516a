"""Process groups: the world, sub-groups, and this process's place in them.

``init_process_group()`` connects to the rendezvous store (starting it on rank 0 when no launcher
runs one), then builds the WORLD group's data transport: shared memory when all ranks share a host,
TCP otherwise (``MINIGRAD_DIST_TRANSPORT=tcp`` forces TCP, e.g. to test it on one machine).

Example::

    dist.init_process_group("127.0.0.1", 23456, world_size=2, rank=r)
    g = dist.new_group([1, 0])     # every rank calls it, in the same order; root is rank 1
    print(g.rank, g.size, g.root)
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from typing import Any

from minigrad.data import sampler as _sampler
from minigrad.distributed import store as _store
from minigrad.distributed.backends import BACKENDS, create_backend

DEFAULT_TIMEOUT = 300.0
TIMEOUT_ENV = "MINIGRAD_DIST_TIMEOUT"
TRANSPORT_ENV = "MINIGRAD_DIST_TRANSPORT"
JOB_ENV = "MINIGRAD_DIST_JOB"
STORE_ENV = "MINIGRAD_DIST_STORE"  # "external": a launcher runs the store, rank 0 must not


def default_timeout() -> float:
    """Collective/store timeout in seconds: ``MINIGRAD_DIST_TIMEOUT`` or 300."""
    return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT))


def host_id() -> str:
    """Identifies this machine (hostname + boot id), to choose shared memory vs TCP."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


class _State:
    """Everything init_process_group sets up in this process."""

    def __init__(self):
        self.initialized = False
        self.rank = 0
        self.world_size = 1
        self.backend = "auto"
        self.timeout = DEFAULT_TIMEOUT
        self.client: _store.Client | None = None
        self.server: _store.Server | None = None
        self.secret = b""
        self.job = ""
        self.epoch = 0  # how many times this process initialised: keeps store keys apart
        self.n_groups = 0
        self.world: GroupContext | None = None
        self.contexts: list[GroupContext] = []
        self.hosts: list[str] = []
        self.p2p = None
        self.lock = threading.Lock()


_state = _State()


class GroupContext:
    """Runtime state of a group this rank belongs to: transport, sequence numbers, backends."""

    def __init__(self, gid: int, ranks: list[int], timeout: float):
        st = _state
        self.gid, self.ranks, self.rank = gid, list(ranks), st.rank
        self.index = self.ranks.index(st.rank)
        self.timeout = float(timeout)
        self.client, self.secret, self.job = st.client, st.secret, st.job
        self.prefix = f"e{st.epoch}/g{gid}"
        self.seq = 0
        self.broken = False
        self._backends: dict[str, Any] = {}
        self.transport_kind = _choose_transport(self.ranks)
        from minigrad.distributed.backends import cpu

        cls = {"local": cpu.LocalTransport, "shm": cpu.ShmTransport, "tcp": cpu.TcpTransport}
        self.transport = cls[self.transport_kind](self)

    def next_seq(self) -> int:
        """The next collective's sequence number (every rank counts the same calls)."""
        if self.broken:
            raise RuntimeError(
                f"group {self.ranks} is unusable after an earlier collective error on rank "
                f"{self.rank}; create the process group again"
            )
        self.seq += 1
        return self.seq

    def backend(self, name: str):
        """The backend object ``name`` ("cpu" or "nccl") of this group, created on first use."""
        be = self._backends.get(name)
        if be is None:
            be = self._backends[name] = create_backend(name, self)
        return be

    def close(self) -> None:
        for be in self._backends.values():
            if hasattr(be, "close"):
                be.close()
        self.transport.close()


def _choose_transport(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return "local"
    forced = os.environ.get(TRANSPORT_ENV, "auto").lower()
    if forced not in ("auto", "shm", "tcp"):
        raise ValueError(f"{TRANSPORT_ENV}={forced!r}: expected 'auto', 'shm' or 'tcp'")
    same_host = len({_state.hosts[r] for r in ranks}) == 1
    if forced == "shm" and not same_host:
        raise ValueError(f"{TRANSPORT_ENV}=shm but group {ranks} spans several hosts")
    if forced != "auto":
        return forced
    from minigrad.distributed.backends.cpu import SHM_DIR

    return "shm" if same_host and SHM_DIR is not None else "tcp"


class Group:
    """A set of ranks that run collectives together (MegEngine's ``Group``).

    ``ranks`` lists global ranks in group order; ``root`` is the first of them; ``rank`` is this
    process's index in the group (-1 when it is not a member: using such a group raises).
    """

    def __init__(self, ranks: list[int] | None, gid: int | None = None):
        self._ranks = None if ranks is None else [int(r) for r in ranks]
        self.gid = gid

    @property
    def ranks(self) -> list[int]:
        return list(range(_state.world_size)) if self._ranks is None else list(self._ranks)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def rank(self) -> int:
        ranks = self.ranks
        return ranks.index(_state.rank) if _state.rank in ranks else -1

    @property
    def root(self) -> int:
        return self.ranks[0]

    def context(self) -> GroupContext:
        """This rank's runtime state of the group (raises when not initialised or not a member)."""
        if not _state.initialized:
            raise RuntimeError(
                "distributed collective called before init_process_group() "
                "(use @dist.launcher or call dist.init_process_group first)"
            )
        if self._ranks is None:
            return _state.world
        for ctx in _state.contexts:
            if ctx.gid == self.gid:
                return ctx
        raise ValueError(f"rank {_state.rank} is not a member of group {self._ranks}")

    def __repr__(self) -> str:
        return "Group(WORLD)" if self._ranks is None else f"Group(ranks={self._ranks})"


WORLD = Group(None)


def _resolve(group: Group | None) -> Group:
    return WORLD if group is None else group


def init_process_group(
    master_ip: str | None = None,
    port: int | None = None,
    world_size: int | None = None,
    rank: int | None = None,
    device: int | str | None = None,
    backend: str = "auto",
    timeout: float | None = None,
    secret: bytes | str | None = None,
) -> None:
    """Join the job: connect to the store, learn the world, build WORLD's transport.

    Arguments left None come from the environment (``MASTER_ADDR``, ``MASTER_PORT``,
    ``WORLD_SIZE``, ``RANK``, ``MINIGRAD_DIST_SECRET``, ``MINIGRAD_DIST_TIMEOUT``), as set by
    ``python -m minigrad.distributed.launch``. Rank 0 starts the store server itself unless a
    launcher already runs it.
    """
    if _state.initialized:
        raise RuntimeError(f"init_process_group: rank {_state.rank} is already initialised")
    env = os.environ
    master_ip = master_ip or env.get("MASTER_ADDR", "127.0.0.1")
    world_size = int(world_size if world_size is not None else env.get("WORLD_SIZE", 1))
    rank = int(rank if rank is not None else env.get("RANK", 0))
    timeout = default_timeout() if timeout is None else float(timeout)
    if backend not in BACKENDS + ("auto",):
        raise ValueError(
            f"init_process_group: unknown backend {backend!r}, expected 'auto', 'cpu' or 'nccl'"
        )
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"init_process_group: need 0 <= rank < world_size, got rank={rank}, "
            f"world_size={world_size}"
        )
    if device is not None:
        from minigrad.backend import set_default_device

        set_default_device(f"gpu{device}" if isinstance(device, int) else str(device))
    port = int(port if port is not None else env.get("MASTER_PORT", 0))
    secret_b = _store._as_secret(secret)
    server = None
    if rank == 0 and env.get(STORE_ENV) != "external":
        server = _store.Server(port, secret_b)
        port = server.port
    elif port == 0:
        raise ValueError(f"init_process_group: rank {rank} needs the store port (MASTER_PORT)")
    client = _store.Client(master_ip, port, secret_b, timeout=timeout)
    st = _state
    st.epoch += 1
    st.rank, st.world_size, st.backend, st.timeout = rank, world_size, backend, timeout
    st.client, st.server, st.secret = client, server, secret_b
    st.job = env.get(JOB_ENV) or hashlib.sha1(f"{master_ip}:{port}".encode()).hexdigest()[:10]
    st.n_groups = 0
    key = f"e{st.epoch}/host"
    client.set(f"{key}/{rank}", host_id())
    st.hosts = [client.get(f"{key}/{r}", timeout=timeout) for r in range(world_size)]
    st.initialized = True
    try:
        st.world = GroupContext(0, list(range(world_size)), timeout)
        st.contexts = [st.world]
    except BaseException:
        destroy_process_group()
        raise


def new_group(ranks: list[int], timeout: float | None = None) -> Group:
    """Create a sub-group; every rank must call this, with the same ranks, in the same order.

    The group's root is ``ranks[0]``. Ranks outside the group get a Group object that raises when
    used in a collective.
    """
    st = _state
    if not st.initialized:
        raise RuntimeError("new_group called before init_process_group()")
    ranks = [int(r) for r in ranks]
    if not ranks or len(set(ranks)) != len(ranks) or not all(0 <= r < st.world_size for r in ranks):
        raise ValueError(
            f"new_group: ranks must be distinct and in [0, {st.world_size}), got {ranks}"
        )
    st.n_groups += 1
    gid = st.n_groups
    if st.rank in ranks:
        ctx = GroupContext(gid, ranks, st.timeout if timeout is None else timeout)
        st.contexts.append(ctx)
    return Group(ranks, gid)


def destroy_process_group() -> None:
    """Leave the job: close transports, the store client and (on rank 0) the store server."""
    st = _state
    for ctx in st.contexts:
        try:
            ctx.close()
        except Exception:
            pass
    if st.p2p is not None:
        st.p2p.close()
    if st.client is not None:
        st.client.close()
    if st.server is not None:
        st.server.close()
    epoch = st.epoch
    st.__init__()
    st.epoch = epoch


def is_distributed() -> bool:
    """True once init_process_group ran (even with world size 1)."""
    return _state.initialized


def get_rank() -> int:
    """This process's global rank (0 before init)."""
    return _state.rank


def get_world_size() -> int:
    """Number of ranks in the job (1 before init)."""
    return _state.world_size


def get_backend() -> str:
    """The backend name given to init_process_group ("auto", "cpu" or "nccl")."""
    return _state.backend


def get_client() -> _store.Client:
    """The rendezvous store client (``user_set``/``user_get``/``user_pop``, ``barrier`` ...)."""
    if _state.client is None:
        raise RuntimeError("get_client called before init_process_group()")
    return _state.client


def get_p2p():
    """The point-to-point channels of this rank (created on first send/recv)."""
    st = _state
    if st.p2p is None:
        from minigrad.distributed.backends.cpu import P2P

        world = WORLD.context()
        kind = "tcp" if world.transport_kind == "tcp" else "shm"
        st.p2p = P2P(world, kind)
    return st.p2p


def group_barrier(group: Group | None = None) -> None:
    """Block until every member of ``group`` (default WORLD) reached this point."""
    from minigrad.distributed import comm

    comm.barrier(group)


def _sampler_world() -> tuple[int, int] | None:
    """(world_size, rank) for samplers built without them (None before init_process_group)."""
    return (_state.world_size, _state.rank) if _state.initialized else None


_sampler.set_world_provider(_sampler_world)  # the data layer's seam (it cannot import us)
