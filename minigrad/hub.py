"""``minigrad.hub``: MegEngine's model hub, working offline from a local directory or a cache.

Every model file of MegEngine's model zoo decorates its constructors at import time::

    @hub.pretrained("https://data.megengine.org.cn/models/weights/resnet18_naiveaug_70312_78a63ca6.pkl")
    def resnet18(**kwargs):
        return ResNet(BasicBlock, [2, 2, 2, 2], **kwargs)

and users then call ``resnet18(pretrained=True)`` or ``hub.load("megengine/models", "resnet18",
pretrained=True)``. Decorating touches no file and no network, so such modules import anywhere.

Weights (:func:`load_serialized_obj_from_url`): a ``file://`` URL or a local path is read where it
is; any other URL is looked up in the cache, ``<hub dir>/weights/<file name>``, and downloaded
there when missing (into a temporary file renamed once complete, so the cache never holds half a
file). When it is neither cached nor downloadable the error names the file, the URL and the path
to put it at. Weights are read with :func:`minigrad.load`: MegEngine's ``.mge``/``.pkl`` pickles go
through the restricted reader of :mod:`minigrad.megengine_checkpoint`, which rebuilds only arrays,
plain containers and tensors and refuses anything that could run code. Nothing is ever unpickled
without that restriction.

Repositories (:func:`load`, :func:`list`, :func:`help`): ``repo_info`` is a local directory that
holds a ``hubconf.py``, or MegEngine's ``"owner/name[:branch]"``, looked up in the cache
(``<hub dir>/<owner>_<name>_<branch or commit>``) and cloned there with ``git`` when missing.
Importing ``hubconf.py`` runs the repository's code, as in MegEngine and PyTorch: load only
repositories you trust. The hub directory is ``$MINIGRAD_HUB``, else ``~/.cache/minigrad/hub``.

Example::

    net = hub.load("/path/to/models", "resnet18", pretrained=True)    # offline, local checkout
    hub.list("megengine/models:master")                               # cached or cloned
"""

from __future__ import annotations

import builtins
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import types
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

from minigrad.serialization import load as _load_checkpoint

__all__ = [
    "DEFAULT_BRANCH",
    "DEFAULT_GIT_HOST",
    "HUBCONF",
    "HubError",
    "get_hub_dir",
    "help",
    "import_module",
    "list",
    "load",
    "load_serialized_obj_from_url",
    "pretrained",
    "set_hub_dir",
]

DEFAULT_GIT_HOST = "github.com"
DEFAULT_BRANCH = "master"
HUBCONF = "hubconf.py"
DOWNLOAD_BLOCK_BYTES = 1 << 16
DOWNLOAD_TIMEOUT_S = 60.0

_hub_dir: Path | None = None  # set_hub_dir's choice, else the environment / default


class HubError(RuntimeError):
    """A repository or an entry point of the hub could not be found or fetched."""


def get_hub_dir() -> Path:
    """Where repositories and weights are cached: :func:`set_hub_dir`'s directory, else
    ``$MINIGRAD_HUB``, else ``~/.cache/minigrad/hub``."""
    if _hub_dir is not None:
        return _hub_dir
    env = os.environ.get("MINIGRAD_HUB")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "minigrad" / "hub"


def set_hub_dir(path: str | os.PathLike) -> None:
    """Use ``path`` as the hub directory from now on (for this process)."""
    global _hub_dir
    _hub_dir = Path(path).expanduser()


# -- weights -----------------------------------------------------------------------------------


def _local_path(url: str) -> Path | None:
    """The file a ``file://`` URL or a plain path names; None for a network URL."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return Path(urllib.request.url2pathname(parsed.path))
    if not parsed.scheme or len(parsed.scheme) == 1:  # a path (or one with a drive letter)
        return Path(url).expanduser()
    return None


def _download(url: str, target: Path, timeout: float) -> None:
    """Fetch ``url`` into ``target`` through a temporary file in the same directory."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".", suffix=".part")
    try:
        request = urllib.request.Request(url, headers={"User-Agent": "minigrad"})
        with urllib.request.urlopen(request, timeout=timeout) as response, \
                os.fdopen(fd, "wb") as out:
            for block in iter(lambda: response.read(DOWNLOAD_BLOCK_BYTES), b""):
                out.write(block)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_serialized_obj_from_url(url: str, model_dir: str | os.PathLike | None = None,
                                 timeout: float = DOWNLOAD_TIMEOUT_S) -> Any:
    """The object saved at ``url`` (usually a ``state_dict``), from a local path, the cache
    ``model_dir`` (default ``<hub dir>/weights``) or, when not cached, downloaded into it.

    Raises FileNotFoundError naming the file, the URL and where to put the file when the weights
    are neither there nor downloadable; RefusedPickleError (from the restricted reader) for a
    file that asks to run code."""
    local = _local_path(url)
    if local is not None:
        if not local.is_file():
            raise FileNotFoundError(f"hub: the weights file {str(local)!r} does not exist")
        return _load_checkpoint(local)
    name = Path(urllib.parse.urlparse(url).path).name
    if not name:
        raise ValueError(f"hub: the URL {url!r} names no file")
    cached = Path(model_dir).expanduser() if model_dir is not None else get_hub_dir() / "weights"
    cached = cached / name
    if not cached.is_file():
        try:
            _download(url, cached, timeout)
        except (OSError, urllib.error.URLError, ValueError) as exc:
            raise FileNotFoundError(
                f"hub: the weights file {name!r} is not in the cache and could not be downloaded "
                f"from {url} ({exc}); download it and put it at {str(cached)!r}"
            ) from None
    return _load_checkpoint(cached)


class pretrained:  # noqa: N801  (MegEngine's spelling: a decorator used as @hub.pretrained(url))
    """Decorate a model constructor so that ``constructor(pretrained=True, **kwargs)`` also loads
    the weights at ``url`` into the model it returns (see :func:`load_serialized_obj_from_url`).

    Decorating happens at import time and reads nothing; only a call with ``pretrained=True``
    looks for the weights."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, func: Callable) -> Callable:
        url = self.url

        @functools.wraps(func)
        def pretrained_model_func(*args, pretrained: bool = False, **kwargs):
            model = func(*args, **kwargs)
            if pretrained:
                model.load_state_dict(load_serialized_obj_from_url(url))
            return model

        pretrained_model_func.url = url
        return pretrained_model_func


# -- repositories ------------------------------------------------------------------------------


def import_module(name: str, path: str | os.PathLike) -> types.ModuleType:
    """Import the Python file ``path`` as a module called ``name`` (running its code), with its
    directory first on ``sys.path`` while it runs, so that it can import its sibling modules."""
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"hub.import_module: {str(path)!r} is not a file")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    folder = str(path.parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    return module


def _parse_repo(repo_info: str) -> tuple[str, str, str | None]:
    repo, _, branch = repo_info.partition(":")
    owner, slash, name = repo.partition("/")
    if not slash or not owner or not name or "/" in name:
        raise ValueError(f"hub: repo_info must be a directory holding {HUBCONF} or "
                         f"'owner/name[:branch]', got {repo_info!r}")
    return owner, name, branch or None


def _clone_url(git_host: str, owner: str, name: str, protocol: str) -> str:
    if "://" in git_host:  # an explicit URL (a mirror, a local file:// host)
        return f"{git_host.rstrip('/')}/{owner}/{name}.git"
    if protocol.upper() == "HTTPS":
        return f"https://{git_host}/{owner}/{name}.git"
    if protocol.upper() == "SSH":
        return f"git@{git_host}:{owner}/{name}.git"
    raise ValueError(f"hub: protocol must be 'HTTPS' or 'SSH', got {protocol!r}")


def _clone(url: str, branch: str | None, commit: str | None, target: Path) -> None:
    """``git clone`` into a temporary directory, then rename it to ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=target.name + "."))
    try:
        clone = ["git", "clone", "--quiet"] + (["--branch", branch] if branch else [])
        subprocess.run(clone + [url, str(tmp)], check=True, capture_output=True, text=True)
        if commit:
            subprocess.run(["git", "-C", str(tmp), "checkout", "--quiet", commit], check=True,
                           capture_output=True, text=True)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _repo_dir(repo_info: str, git_host: str, use_cache: bool, commit: str | None,
              protocol: str) -> Path:
    """The directory holding the repository's ``hubconf.py`` (local, cached or cloned)."""
    local = Path(repo_info).expanduser()
    if local.is_dir():
        if not (local / HUBCONF).is_file():
            raise HubError(f"hub: the directory {str(local)!r} has no {HUBCONF}")
        return local
    owner, name, branch = _parse_repo(repo_info)
    cached = get_hub_dir() / f"{owner}_{name}_{commit or branch or DEFAULT_BRANCH}"
    if use_cache and (cached / HUBCONF).is_file():
        return cached
    url = _clone_url(git_host, owner, name, protocol)
    try:
        _clone(url, branch, commit, cached)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        raise HubError(
            f"hub: {repo_info!r} is not cached at {str(cached)!r} and cloning {url} failed "
            f"({str(detail).strip()}); clone it there, or pass a local directory as repo_info"
        ) from None
    if not (cached / HUBCONF).is_file():
        raise HubError(f"hub: the repository {repo_info!r} has no {HUBCONF}")
    return cached


def _hubconf(repo_info, git_host, use_cache, commit, protocol) -> types.ModuleType:
    folder = _repo_dir(repo_info, git_host, use_cache, commit, protocol)
    return import_module("hubconf", folder / HUBCONF)


def _entries(hubconf: types.ModuleType) -> builtins.list[str]:
    return sorted(k for k, v in vars(hubconf).items()
                  if callable(v) and not k.startswith("_") and not isinstance(v, types.ModuleType))


def _entry(hubconf: types.ModuleType, entry: str, repo_info: str) -> Callable:
    if entry not in _entries(hubconf):
        raise HubError(f"hub: {repo_info!r} has no entry point {entry!r}; it has "
                       f"{_entries(hubconf)}")
    return getattr(hubconf, entry)


def list(repo_info: str, git_host: str = DEFAULT_GIT_HOST, use_cache: bool = True,  # noqa: A001
         commit: str | None = None, protocol: str = "HTTPS") -> builtins.list[str]:
    """The entry points (public callables) of the repository's ``hubconf.py``, sorted."""
    return _entries(_hubconf(repo_info, git_host, use_cache, commit, protocol))


def help(repo_info: str, entry: str, git_host: str = DEFAULT_GIT_HOST,  # noqa: A001
         use_cache: bool = True, commit: str | None = None, protocol: str = "HTTPS") -> str:
    """The docstring of the repository's entry point ``entry``."""
    hubconf = _hubconf(repo_info, git_host, use_cache, commit, protocol)
    return _entry(hubconf, entry, repo_info).__doc__ or ""


def load(repo_info: str, entry: str, *args, git_host: str = DEFAULT_GIT_HOST,
         use_cache: bool = True, commit: str | None = None, protocol: str = "HTTPS",
         **kwargs) -> Any:
    """Call the repository's entry point ``entry`` with ``args`` and ``kwargs`` (for example
    ``pretrained=True``) and return what it builds."""
    hubconf = _hubconf(repo_info, git_host, use_cache, commit, protocol)
    return _entry(hubconf, entry, repo_info)(*args, **kwargs)
