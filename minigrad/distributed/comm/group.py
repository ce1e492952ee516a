"""Process groups: the world, sub-groups, and this process's place in them.

``init_process_group()`` joins the job: it learns rank and world size (arguments, else the
environment of whichever launcher started the process: minigrad's, torchrun, mpiexec or srun; see
:mod:`.env`), connects to the rendezvous store (rank 0 starts it unless a launcher or a user-started
``dist.Server`` already runs one; under mpiexec without ``MASTER_PORT`` rank 0 starts it and shares
its address over MPI), checks that every rank asked for the same backend, and sets up the WORLD
group's transport.

A process group's ``rank`` is always this process's index *in that group*; ``global_rank`` is its
rank in the world (``dist.get_rank()``).

Example::

    dist.init_process_group("127.0.0.1", 23456, world_size=2, rank=r)
    g = dist.new_group([1, 0])     # every rank calls it, in the same order; root is rank 1
    print(g)                       # Group(ranks=[1, 0], rank=1, backend='auto', timeout=300 s)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket

from minigrad import seams
from minigrad.backend import is_cuda_available, set_default_device
from minigrad.backend.xp import cupy_or_none
from minigrad.distributed.comm import recorder
from minigrad.distributed.comm.providers import (
    SETTINGS,
    Backend,
    choose_backend,
    create_backend,
    waiting,
)
from minigrad.distributed.comm.providers.base import OrderedWorker
from minigrad.distributed.comm.providers.mpi import broadcast_from_rank0, mpi_module
from minigrad.distributed.comm.providers.nccl import is_available as nccl_usable
from minigrad.distributed.runtime import env as _env
from minigrad.distributed.runtime import failures
from minigrad.distributed.runtime import log as _log
from minigrad.distributed.runtime import store as _store
from minigrad.distributed.runtime.settings import (
    DEFAULT_TIMEOUT,
    JOB_ENV,
    STORE_ENV,
    default_backend,
    default_timeout,
    default_warn_after,
    seconds,
)

BACKEND_ALIASES = {"gloo": "cpu"}  # PyTorch scripts name their CPU backend "gloo"
_GPU_NAME = re.compile(r"^(?:gpu|cuda:?)(\d+)$")


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

    def __init__(self, session: int = 0):
        self.initialized = False
        self.rank = 0
        self.world_size = 1
        self.local_rank = 0
        self.backend = "auto"
        self.timeout = DEFAULT_TIMEOUT
        self.warn_after = default_warn_after()
        self.client: _store.Client | None = None
        self.server: _store.Server | None = None
        self.secret = b""
        self.job = ""
        # init_process_group calls made by this process so far: keeps the store keys of
        # successive sessions (init, destroy, init again) apart
        self.session = session
        self.n_groups = 0
        # the groups of group_for_ranks, by their ranks in group order (one table per session)
        self.shared_groups: dict[tuple[int, ...], Group] = {}
        self.world: GroupContext | None = None
        self.contexts: list[GroupContext] = []
        self.hosts: list[str] = []
        self.mpi_job = False


_state = _State()


class GroupContext:
    """Runtime state of a group this rank belongs to: backends, sequence numbers, settings.

    ``ranks``: global ranks in group order; ``rank``: this process's index among them;
    ``global_rank``: its rank in the world. The backend for host arrays is created now (all members
    create groups in the same order, so collective setup lines up); others on first use.
    """

    def __init__(self, gid: int, ranks: list[int], setting: str, timeout: float,
                 warn_after: float):
        st = _state
        self.gid, self.ranks = gid, list(ranks)
        self.global_rank = st.rank
        self.rank = self.ranks.index(st.rank)
        self.setting, self.timeout, self.warn_after = setting, timeout, warn_after
        self.client, self.secret, self.job, self.hosts = st.client, st.secret, st.job, st.hosts
        self.prefix = f"s{st.session}/g{gid}"
        self.seq = 0
        self.broken: str | None = None  # the error that made the group unusable, once one did
        self._backends: dict[str, Backend] = {}
        self._peer_workers: dict[tuple, OrderedWorker] = {}
        self._routes: dict[bool, str] = {}
        self._host_backend: Backend | None = None
        self.host_route = self.route(False)
        self.backend(self.host_route)

    @property
    def size(self) -> int:
        """Number of members."""
        return len(self.ranks)

    @property
    def transport_kind(self) -> str | None:
        """The cpu backend's transport (``local``, ``shm``, ``tcp``), None when it is not used."""
        be = self._backends.get("cpu")
        return getattr(be, "transport_kind", None)

    def route(self, on_gpu: bool) -> str:
        """The backend that moves host (or GPU) arrays in this group (see ``choose_backend``);
        decided once per kind of array, since neither the setting nor NCCL's presence changes."""
        route = self._routes.get(on_gpu)
        if route is None:
            route = self._routes[on_gpu] = choose_backend(
                self.setting, on_gpu, _state.mpi_job, nccl_usable)
        return route

    def host_backend(self) -> Backend:
        """The backend object that moves host arrays in this group (``backend(route(False))``),
        kept after the first call since neither the route nor the object changes."""
        be = self._host_backend
        if be is None:
            be = self._host_backend = self.backend(self.route(False))
        return be

    def mark_broken(self, exc: BaseException) -> None:
        """Make the group unusable after ``exc`` interrupted one of its collectives: every later
        call raises, naming ``exc`` (its data may be half moved, its peers gone)."""
        self.broken = f"{type(exc).__name__}: {exc}"

    def next_seq(self) -> int:
        """The next call's sequence number (every member counts the same calls)."""
        if self.broken:
            raise RuntimeError(
                f"group {self.ranks} is unusable after an earlier collective error on rank "
                f"{self.global_rank} ({self.broken}); create the process group again"
            )
        self.seq += 1
        return self.seq

    def backend(self, name: str) -> Backend:
        """The backend object ``name`` of this group, created on first use."""
        be = self._backends.get(name)
        if be is None:
            be = self._backends[name] = create_backend(name, self)
        return be

    def flush(self, keep: Backend | None = None) -> None:
        """Wait for the group's queued asynchronous collectives, except those of ``keep`` (a call
        queued on the same backend runs after them anyway)."""
        for be in tuple(self._backends.values()):
            if be is not keep:
                be.flush()

    def peer_worker(self, direction: str, peer: int) -> OrderedWorker:
        """The worker that runs this rank's asynchronous sends to (or receives from) ``peer`` in
        order; a blocking send/recv with that peer flushes it first."""
        key = (direction, peer)
        worker = self._peer_workers.get(key)
        if worker is None:
            worker = self._peer_workers[key] = OrderedWorker(f"mg-{direction}-{peer}")
        return worker

    def close(self) -> list[BaseException]:
        """Close the backends (GPU ones first: they use the host transport); return errors."""
        errors = []
        for worker in self._peer_workers.values():
            worker.close()
        self._peer_workers.clear()
        for name in sorted(self._backends, key=lambda n: n != "nccl"):
            try:
                self._backends[name].close()
            except Exception as exc:
                errors.append(exc)
        self._backends.clear()
        self._host_backend = None
        return errors


class Group:
    """A set of ranks that run collectives together (MegEngine's ``Group``, PyTorch's groups).

    ``ranks`` lists global ranks in group order; ``root`` is the first of them; ``rank`` is this
    process's index in the group (-1 when it is not a member: using the group then raises);
    ``size``, ``backend`` and ``timeout`` describe the group.
    """

    def __init__(self, ranks: list[int] | None, gid: int | None = None,
                 backend: str | None = None, timeout: float | None = None):
        self._ranks = None if ranks is None else [int(r) for r in ranks]
        self.gid = gid
        self._backend, self._timeout = backend, timeout

    @property
    def ranks(self) -> list[int]:
        """Global ranks of the members, in group order."""
        return list(range(_state.world_size)) if self._ranks is None else list(self._ranks)

    @property
    def size(self) -> int:
        """Number of members."""
        return len(self.ranks)

    @property
    def rank(self) -> int:
        """This process's index in the group (-1 when it is not a member)."""
        ranks = self.ranks
        return ranks.index(_state.rank) if _state.rank in ranks else -1

    @property
    def root(self) -> int:
        """The global rank of the group's first member: the default root of rooted calls."""
        return self.ranks[0]

    @property
    def backend(self) -> str:
        """The backend setting (``cpu``, ``mpi``, ``nccl`` or ``auto``)."""
        return _state.backend if self._backend is None else self._backend

    @property
    def timeout(self) -> float:
        """Seconds a call of this group may wait before it raises."""
        return _state.timeout if self._timeout is None else self._timeout

    @property
    def key(self) -> str:
        """MegEngine's name for the group: its global ranks joined by commas (``"0,1,2,3"``),
        equal for equal groups, so it can key a cache of per-group state."""
        return ",".join(map(str, self.ranks))

    def context(self) -> GroupContext:
        """This rank's runtime state of the group (raises when not initialised or not a member)."""
        if not _state.initialized:
            raise RuntimeError(
                "distributed call before init_process_group() "
                "(use @dist.launcher or call dist.init_process_group first)"
            )
        if self._ranks is None:
            return _state.world
        for ctx in _state.contexts:
            if ctx.gid == self.gid:
                return ctx
        raise ValueError(f"rank {_state.rank} is not a member of group {self._ranks}")

    def __repr__(self) -> str:
        name = "WORLD, " if self._ranks is None else ""
        if not _state.initialized:
            return f"Group({name}not initialised)" if name else f"Group(ranks={self._ranks})"
        return (
            f"Group({name}ranks={self.ranks}, rank={self.rank}, backend={self.backend!r}, "
            f"timeout={self.timeout:g} s)"
        )


WORLD = Group(None)

_open_p2p_groups = [0]  # group_start() calls not yet closed by group_end()


def group_start() -> None:
    """Open a block of point-to-point calls issued together (MegEngine's ``group_start``, NCCL's
    ``ncclGroupStart``), so that ranks that send to each other before they receive cannot
    deadlock. Sends here return once the data is buffered, so every order already works; the
    block is checked for balance (:func:`group_end`) and nests."""
    _open_p2p_groups[0] += 1


def group_end() -> None:
    """Close the block opened by :func:`group_start`; without one open it raises."""
    if _open_p2p_groups[0] == 0:
        raise RuntimeError("group_end: no group_start() is open on this rank")
    _open_p2p_groups[0] -= 1


def resolve_group(group: Group | None) -> Group:
    """``group``, or WORLD for None: the one place that gives ``group=None`` its meaning."""
    return WORLD if group is None else group


def _backend_setting(backend: str) -> str:
    setting = BACKEND_ALIASES.get(str(backend).lower(), str(backend).lower())
    if setting == "auto":
        setting = BACKEND_ALIASES.get(default_backend(), default_backend())
    if setting not in SETTINGS:
        raise ValueError(f"unknown distributed backend {backend!r}: expected one of {SETTINGS}")
    return setting


def bind_device(device: int | str | None, device_type: str = "gpu") -> None:
    """Make ``device`` this process's default device; for ``gpuN`` also CUDA's current device, so
    arrays, streams and NCCL communicators of this rank land on its own GPU. A number is a device
    of ``device_type`` (MegEngine's): ``"gpu"`` (the default here), ``"cpu"``, or ``"xpu"``
    (``init_process_group``'s default), a GPU when this machine has one and else the CPU."""
    if device is None:
        return
    if isinstance(device, int):
        kind = device_type.lower()
        if kind not in ("xpu", "gpu", "cpu"):
            raise ValueError(f"init_process_group: device_type must be 'xpu', 'gpu' or 'cpu', "
                             f"got {device_type!r}")
        if kind == "xpu":  # without a GPU every rank computes on the one CPU device
            name = f"gpu{device}" if is_cuda_available() else "cpu0"
        else:
            name = f"{kind}{device}"
    else:
        name = str(device)
    set_default_device(name)
    m = _GPU_NAME.match(name.strip().lower())
    if m is not None:
        cupy_or_none().cuda.Device(int(m.group(1))).use()


def _parse_init_method(init_method: str | None) -> tuple[str | None, int | None]:
    if init_method is None or init_method == "env://":
        return None, None
    m = re.match(r"^tcp://([^:/]+):(\d+)/?$", init_method)
    if m is None:
        raise ValueError(
            f"init_process_group: init_method {init_method!r} is not supported "
            f"(use 'env://' or 'tcp://HOST:PORT')"
        )
    return m.group(1), int(m.group(2))


def _mpi_rendezvous(rank: int, secret: bytes):
    """Under mpiexec without MASTER_PORT: rank 0 starts the store and MPI tells everyone where
    (address, port, secret, job id); returns those and rank 0's server (None elsewhere)."""
    server = None
    data = None
    if rank == 0:
        secret = secret or _store.generate_secret().encode()
        server = _store.Server(0, secret)
        info = {"host": host_id(), "name": socket.gethostname(), "port": server.port,
                "secret": secret.decode(), "job": _store.generate_secret()[:10]}
        data = json.dumps(info).encode()
    info = json.loads(broadcast_from_rank0(data))
    addr = "127.0.0.1" if info["host"] == host_id() else info["name"]
    return addr, info["port"], info["secret"].encode(), info["job"], server


def _abort_mpi_job() -> None:
    """End every rank of this MPI job (a rank failed; see ``runtime.failures``)."""
    mpi_module().COMM_WORLD.Abort(1)


def _own_store(rank: int, master_ip: str, port: int, secret: bytes):
    """Rank 0 starts the store unless a launcher or a user-started ``dist.Server`` runs one;
    returns ``(this process's server or None, port)``."""
    if rank == 0 and os.environ.get(STORE_ENV) != "external":
        if port == 0 or not _store.is_serving(master_ip, port, secret):
            server = _store.Server(port, secret)
            return server, server.port
    elif port == 0:
        raise ValueError(
            f"init_process_group: rank {rank} needs the store's port (argument, MASTER_PORT or "
            f"init_method='tcp://HOST:PORT')"
        )
    return None, port


def init_process_group(
    master_ip: str | None = None,
    port: int | None = None,
    world_size: int | None = None,
    rank: int | None = None,
    device: int | str | None = None,
    backend: str = "auto",
    timeout=None,
    secret: bytes | str | None = None,
    init_method: str | None = None,
    warn_after=None,
    device_type: str = "xpu",
) -> None:
    """Join the job: learn rank and world size, connect to the store, set up the WORLD group.

    MegEngine's positional form ``init_process_group(master_ip, port, world_size, rank, device)``
    and PyTorch's ``init_process_group("gloo" | "nccl" | "mpi", init_method="env://")`` both work
    ("gloo" means minigrad's cpu backend). Arguments left None come from the environment: minigrad's
    launchers, torchrun (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``), mpiexec and
    srun (see :mod:`minigrad.distributed.runtime.env`). ``backend``: ``"auto"`` (default; see
    :func:`.providers.choose_backend`), ``"cpu"``, ``"mpi"`` or ``"nccl"``.
    ``timeout`` (seconds or a ``timedelta``; default ``MINIGRAD_DIST_TIMEOUT`` or 300) bounds every
    wait of the WORLD group; ``warn_after`` (default ``MINIGRAD_DIST_WARN_AFTER`` or 30) is when a
    waiting rank logs what it waits for. ``device`` (``2`` or ``"gpu2"``) becomes this rank's
    default and current device; a number means a device of ``device_type``: ``"xpu"`` (default,
    MegEngine's) is a GPU where there is one and the CPU elsewhere, ``"gpu"`` insists on a GPU.

    Example::

        dist.init_process_group("127.0.0.1", 23456, world_size=2, rank=0, device=0)
    """
    st = _state
    if st.initialized:
        raise RuntimeError(f"init_process_group: rank {st.rank} is already initialised")
    if master_ip is not None and port is None and master_ip.lower() in SETTINGS + ("gloo",):
        master_ip, backend = None, master_ip  # PyTorch's positional backend
    setting = _backend_setting(backend)
    info = _env.detect()
    method_ip, method_port = _parse_init_method(init_method)
    env_ip, env_port = _env.store_address(info)
    master_ip = master_ip or method_ip or env_ip
    port = port if port is not None else (method_port if method_port is not None else env_port)
    world_size = int(world_size if world_size is not None else info.world_size)
    rank = int(rank if rank is not None else info.rank)
    timeout = default_timeout() if timeout is None else seconds(timeout)
    warn_after = default_warn_after() if warn_after is None else seconds(warn_after, "warn_after")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"init_process_group: need 0 <= rank < world_size, got rank={rank}, "
            f"world_size={world_size}"
        )
    mpi_job = info.mpi and _env.mpi4py_installed() and info.world_size == world_size
    if setting == "mpi" and not mpi_job:
        raise ValueError(
            "init_process_group(backend='mpi') needs a job started by mpiexec or srun (with an MPI "
            "plugin) and mpi4py installed (pip install -e '.[mpi]')"
        )
    env_device = os.environ.get("MINIGRAD_DEFAULT_DEVICE", "")
    if device is None and _GPU_NAME.match(env_device):
        device = env_device  # a launcher chose this rank's GPU
    bind_device(device, device_type)
    secret_b = _store.as_secret(secret)
    job = os.environ.get(JOB_ENV)
    server = None
    if port is None and mpi_job and world_size > 1:
        master_ip, port, secret_b, job, server = _mpi_rendezvous(rank, secret_b)
    master_ip, port = master_ip or "127.0.0.1", int(port or 0)
    if server is None:
        server, port = _own_store(rank, master_ip, port, secret_b)
    try:
        client = _store.Client(master_ip, port, secret_b, timeout=timeout)
    except BaseException:
        if server is not None:
            server.close()
        raise
    st.session += 1
    st.rank, st.world_size, st.local_rank = rank, world_size, info.local_rank
    st.backend, st.timeout, st.warn_after = setting, timeout, warn_after
    st.client, st.server, st.secret, st.mpi_job = client, server, secret_b, mpi_job
    st.job = job or hashlib.sha1(f"{master_ip}:{port}".encode()).hexdigest()[:10]
    st.n_groups = 0
    _log.set_rank(rank)
    recorder.configure(st.job, rank, world_size)
    try:
        _join(client, info, setting, timeout)
        waiting.set_ranks_on_host(st.hosts.count(st.hosts[rank]))
        if mpi_job and world_size > 1:  # no parent process watches the ranks: tell the peers
            failures.arm(client, st.job, rank, world_size, _abort_mpi_job, recorder.dump,
                         serves_store=server is not None)
        st.initialized = True
        st.world = GroupContext(0, list(range(world_size)), setting, timeout, warn_after)
        st.contexts = [st.world]
    except BaseException:
        for exc in _teardown():
            _log.get_logger().warning("while abandoning init_process_group: %s", exc)
        raise


def _join(client: _store.Client, info: _env.LaunchInfo, setting: str, timeout: float) -> None:
    """Tell the store who and where this rank is; learn the others; agree on the backend."""
    st = _state
    rank, world_size = st.rank, st.world_size
    key = f"s{st.session}/rank"
    client.set(f"{key}/{rank}", {"host": host_id(), "backend": setting})
    peers = [client.get(f"{key}/{r}", timeout=timeout) for r in range(world_size)]
    st.hosts = [p["host"] for p in peers]
    settings = [p["backend"] for p in peers]
    if len(set(settings)) > 1:
        raise ValueError(
            "init_process_group: ranks asked for different backends: "
            + ", ".join(f"rank {r}: {s!r}" for r, s in enumerate(settings))
        )
    if info.source == "none":  # nobody said: count the ranks on this host before this one
        st.local_rank = [r for r in range(world_size) if st.hosts[r] == st.hosts[rank]].index(rank)


def new_group(ranks: list[int] | None = None, timeout=None, backend: str | None = None,
              warn_after=None) -> Group:
    """Create a sub-group; every rank must call this, with the same ranks, in the same order.

    The group's root is ``ranks[0]`` (``None``: all ranks). ``timeout``/``warn_after`` (seconds)
    and ``backend`` default to the world's. Ranks outside the group get a Group object that
    raises when used in a collective.
    """
    st = _state
    if not st.initialized:
        raise RuntimeError("new_group called before init_process_group()")
    ranks = list(range(st.world_size)) if ranks is None else [int(r) for r in ranks]
    if not ranks or len(set(ranks)) != len(ranks) or not all(0 <= r < st.world_size for r in ranks):
        raise ValueError(
            f"new_group: ranks must be distinct and in [0, {st.world_size}), got {ranks}"
        )
    setting = st.backend if backend is None else _backend_setting(backend)
    timeout = st.timeout if timeout is None else seconds(timeout)
    warn_after = st.warn_after if warn_after is None else seconds(warn_after, "warn_after")
    st.n_groups += 1
    gid = st.n_groups
    if st.rank in ranks:
        st.contexts.append(GroupContext(gid, ranks, setting, timeout, warn_after))
    return Group(ranks, gid, setting, timeout)


def group_for_ranks(ranks) -> Group:
    """The process group of exactly ``ranks`` (global ranks, in group order), shared by every
    caller in this process: the mesh, placements, the parallel context and the pipeline's tie
    groups ask here, so the same ranks in the same order give the same :class:`Group` object.

    Collective the first time ``ranks`` is asked for, like :func:`new_group`: every rank must ask
    for the same rank lists in the same order (a rank that is not a member too). Since every rank
    then holds the same table, a later request is answered from it on every rank alike and
    creates nothing. The order matters: ``[1, 0]`` (root 1) is another group than ``[0, 1]``.
    The table belongs to the session: ``destroy_process_group`` empties it.
    """
    key = tuple(int(r) for r in ranks)
    group = _state.shared_groups.get(key)
    if group is None:
        group = new_group(list(key))
        _state.shared_groups[key] = group
    return group


def _teardown() -> list[BaseException]:
    """Close everything init_process_group opened; reset the state; return the errors met."""
    st = _state
    failures.disarm()
    waiting.set_ranks_on_host(1)
    errors: list[BaseException] = []
    for ctx in reversed(st.contexts):
        errors += ctx.close()
    for closable in (st.client, st.server):
        if closable is not None:
            try:
                closable.close()
            except Exception as exc:
                errors.append(exc)
    st.__init__(st.session)
    _log.set_rank(0)
    return errors


def destroy_process_group() -> None:
    """Leave the job: close backends, the store client and (on rank 0) the store server.

    Everything is closed even when a part fails; then the first failure is raised.
    """
    errors = _teardown()
    if errors:
        raise RuntimeError(
            f"destroy_process_group: {len(errors)} part(s) failed to close: "
            + "; ".join(f"{type(e).__name__}: {e}" for e in errors)
        ) from errors[0]


def is_distributed() -> bool:
    """True once init_process_group ran (even with world size 1)."""
    return _state.initialized


def is_initialized() -> bool:
    """PyTorch's name for :func:`is_distributed`."""
    return _state.initialized


def is_available() -> bool:
    """PyTorch's check whether the distributed package can be used: always True in minigrad."""
    return True


def get_rank(group: Group | None = None) -> int:
    """This process's global rank (0 before init); with ``group``, its index in it (-1: not in)."""
    return _state.rank if group is None else group.rank


def get_world_size(group: Group | None = None) -> int:
    """Number of ranks in the job (1 before init), or in ``group``."""
    return _state.world_size if group is None else group.size


def get_local_rank() -> int:
    """This process's index among the ranks on its machine (the launcher's ``LOCAL_RANK``)."""
    if _state.initialized:
        return _state.local_rank
    return _env.detect().local_rank


def get_node_size() -> int:
    """The number of machines taking part in the job (1 before init)."""
    return len(set(_state.hosts)) if _state.initialized else 1


def get_backend(group: Group | None = None) -> str:
    """The backend setting of the world (or ``group``): ``auto``, ``cpu``, ``mpi`` or ``nccl``."""
    return resolve_group(group).backend


def get_client() -> _store.Client:
    """The rendezvous store client (``user_set``/``user_get``/``user_pop``, ``barrier`` ...)."""
    if _state.client is None:
        raise RuntimeError("get_client called before init_process_group()")
    return _state.client



def _sampler_world() -> tuple[int, int] | None:
    """(world_size, rank) for samplers built without them (None before init_process_group)."""
    return (_state.world_size, _state.rank) if _state.initialized else None


seams.WORLD.install(_sampler_world)  # samplers find their shard (the data layer's seam)
