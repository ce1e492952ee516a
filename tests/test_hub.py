"""``minigrad.hub``: MegEngine's model hub, offline from a local directory or a cache, downloading
from a URL when one is reachable (a local HTTP server here), never unpickling untrusted weights."""

from __future__ import annotations

import functools
import http.server
import pickle
import subprocess
import sys
import threading
from collections import OrderedDict

import numpy as np
import pytest

import minigrad as mg
from minigrad import hub
from minigrad.serialization import UnsafeCheckpointError

W = np.arange(6, dtype=np.float32).reshape(2, 3) / 10  # Linear(3, 2): weight (out, in)
B = np.array([0.5, -0.5], np.float32)

HUBCONF = '''
"""A model zoo's hubconf."""
import minigrad.module as M
from minigrad import hub

dependencies = ["numpy"]


@hub.pretrained({url!r})
def tiny(**kwargs):
    """A tiny linear model."""
    return M.Linear(3, 2, **kwargs)


def _private():
    return None
'''


def _weights_file(path):
    """What ``megengine.save(net.state_dict(), path)`` writes: a pickle of an OrderedDict."""
    path.write_bytes(pickle.dumps(OrderedDict(weight=W, bias=B), protocol=4))
    return path


def _repo(tmp_path, url):
    repo = tmp_path / "zoo"
    repo.mkdir()
    (repo / "hubconf.py").write_text(HUBCONF.format(url=url))
    return repo


@pytest.fixture
def hub_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_HUB", str(tmp_path / "hubcache"))
    return tmp_path / "hubcache"


@pytest.fixture
def server(tmp_path):
    """A local HTTP server serving ``tmp_path/served`` on 127.0.0.1."""
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_local_repository_list_help_load_pretrained(tmp_path, hub_dir):
    weights = _weights_file(tmp_path / "tiny_1234.pkl")
    repo = _repo(tmp_path, weights.as_uri())
    assert hub.list(str(repo)) == ["tiny"]
    assert hub.help(str(repo), "tiny") == "A tiny linear model."
    fresh = hub.load(str(repo), "tiny")
    assert not np.allclose(fresh.weight.numpy(), W)  # initialised, no weights read
    net = hub.load(str(repo), "tiny", pretrained=True)
    np.testing.assert_array_equal(net.weight.numpy(), W)
    np.testing.assert_array_equal(net.bias.numpy(), B)
    y = net(mg.tensor(np.ones((1, 3), np.float32))).numpy()
    np.testing.assert_allclose(y, np.ones((1, 3)) @ W.T + B, rtol=1e-6)
    with pytest.raises(hub.HubError, match=r"no entry point 'resnet'; it has \['tiny'\]"):
        hub.load(str(repo), "resnet")


def test_decorating_at_import_reads_nothing_and_missing_weights_name_the_file(tmp_path, hub_dir):
    url = "http://127.0.0.1:9/models/resnet18_naiveaug_70312_78a63ca6.pkl"  # discard port: closed
    zoo = hub.import_module("zoo_model", _repo(tmp_path, url) / "hubconf.py")  # no network used
    assert zoo.tiny.url == url and zoo.tiny.__doc__ == "A tiny linear model."
    with pytest.raises(FileNotFoundError) as info:
        zoo.tiny(pretrained=True)
    message = str(info.value)
    assert "resnet18_naiveaug_70312_78a63ca6.pkl" in message and url in message
    assert str(hub_dir / "weights" / "resnet18_naiveaug_70312_78a63ca6.pkl") in message
    # put there by hand, it is found offline
    (hub_dir / "weights").mkdir(parents=True, exist_ok=True)
    _weights_file(hub_dir / "weights" / "resnet18_naiveaug_70312_78a63ca6.pkl")
    np.testing.assert_array_equal(zoo.tiny(pretrained=True).weight.numpy(), W)


def test_weights_are_downloaded_once_into_the_cache(tmp_path, hub_dir, server):
    root, base = server
    _weights_file(root / "tiny_abcd.pkl")
    state = hub.load_serialized_obj_from_url(f"{base}/tiny_abcd.pkl")
    assert list(state) == ["weight", "bias"]
    np.testing.assert_array_equal(state["weight"], W)
    served = (root / "tiny_abcd.pkl").read_bytes()
    assert (hub_dir / "weights" / "tiny_abcd.pkl").read_bytes() == served
    (root / "tiny_abcd.pkl").unlink()  # the server no longer has it: the cache answers
    again = hub.load_serialized_obj_from_url(f"{base}/tiny_abcd.pkl")
    np.testing.assert_array_equal(again["bias"], B)
    with pytest.raises(FileNotFoundError, match="gone.pkl"):
        hub.load_serialized_obj_from_url(f"{base}/gone.pkl")  # a 404
    assert not list((hub_dir / "weights").glob("*.part"))  # no half-written file left behind


class _Boom:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path('PWNED').write_text('x')",))


def test_weights_that_would_run_code_are_refused(tmp_path, hub_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps({"weight": _Boom()}))
    repo = _repo(tmp_path, evil.as_uri())
    with pytest.raises(UnsafeCheckpointError, match="builtins.exec"):
        hub.load(str(repo), "tiny", pretrained=True)
    assert not (tmp_path / "PWNED").exists()


def test_owner_name_repositories_come_from_the_cache_or_git(tmp_path, hub_dir):
    weights = _weights_file(tmp_path / "w.pkl")
    with pytest.raises(hub.HubError, match=r"is not cached at .*megengine_models_master"):
        hub.list("megengine/models", git_host="file:///nonexistent-host")
    cached = hub_dir / "megengine_models_master"
    cached.mkdir(parents=True)
    (cached / "hubconf.py").write_text(HUBCONF.format(url=weights.as_uri()))
    assert hub.list("megengine/models") == ["tiny"]  # offline, from the cache
    # a git host that can be reached: here a bare repository on disk, cloned once
    src = _repo(tmp_path, weights.as_uri())
    origin = tmp_path / "host" / "owner" / "zoo.git"
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q", "-b", "dev", str(src)], check=True)
    subprocess.run(git + ["-C", str(src), "add", "hubconf.py"], check=True)
    subprocess.run(git + ["-C", str(src), "commit", "-qm", "zoo"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(origin)], check=True)
    net = hub.load("owner/zoo:dev", "tiny", git_host=(tmp_path / "host").as_uri(), pretrained=True)
    np.testing.assert_array_equal(net.weight.numpy(), W)
    assert (hub_dir / "owner_zoo_dev" / "hubconf.py").is_file()
    with pytest.raises(ValueError, match="repo_info must be a directory"):
        hub.list("not-a-repo")
    assert "zoo_model" not in sys.modules  # import_module does not register modules globally
    assert mg.hub is hub
