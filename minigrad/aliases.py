"""Import paths that are second names for modules defined elsewhere: MegEngine's module paths.

MegEngine programs import ``megengine.device``, ``megengine.random``, ``megengine.tensor``,
``megengine.functional.elemwise``, ``megengine.functional.tensor`` and
``megengine.functional.math`` (both the ``functional`` package itself),
``megengine.functional.distributed``,
``megengine.module.elemwise``, ``megengine.distributed.functional`` and
``megengine.distributed.helper``; PyTorch and OneFlow programs import ``torch.optim``,
``torch.utils.data``, ``torch.cuda`` and ``torch.accelerator`` (``oneflow.`` the same). minigrad
defines each of these once, in the layer it belongs to, and this table (:data:`ALIASES`) is the
one place that lists the other names: ``import minigrad.functional.elemwise`` gives the very
module object ``minigrad.functional.elementwise``.

How: importing this module (``minigrad/__init__.py`` does, first) puts a finder on ``sys.meta_path``
that, asked for an alias, imports the real module and hands it back. Nothing is loaded before it
is asked for, so ``import minigrad.functional`` still does not pull in the distributed runtime;
``import minigrad.functional.distributed`` does, because the user asked for it.

Example::

    import minigrad.functional.elemwise as elemwise    # MegEngine's path
    import minigrad.functional.elementwise as elementwise
    assert elemwise is elementwise
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys

#: alias import path -> the module that defines it
ALIASES = {
    "minigrad.device": "minigrad.backend.device_api",
    "minigrad.tensor": "minigrad.autodiff.tensor",
    "minigrad.random": "minigrad.functional.random",
    "minigrad.functional.elemwise": "minigrad.functional.elementwise",
    "minigrad.functional.tensor": "minigrad.functional",
    "minigrad.functional.math": "minigrad.functional",
    "minigrad.functional.distributed": "minigrad.distributed.comm.functional",
    "minigrad.module.elemwise": "minigrad.module.elementwise",
    "minigrad.distributed.functional": "minigrad.distributed.comm.functional",
    "minigrad.distributed.helper": "minigrad.distributed.data_parallel.helper",
    "minigrad.optim": "minigrad.optimizer",
    "minigrad.utils.data": "minigrad.data",
    "minigrad.cuda": "minigrad.backend.cuda_api",
    "minigrad.accelerator": "minigrad.backend.cuda_api",
}


class AliasFinder:
    """Answers an import of an alias path with the module it names (see :data:`ALIASES`): a
    meta-path finder and loader in one (the protocol of ``importlib.abc.MetaPathFinder`` and
    ``Loader``, without importing ``importlib.abc``, which costs milliseconds at startup)."""

    def find_spec(self, fullname, path=None, target=None):
        """A spec for ``fullname`` when it is an alias, else None (the normal finders go on)."""
        if fullname in ALIASES:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        """The real module, imported under its own name (the alias adds no second copy)."""
        module = importlib.import_module(ALIASES[spec.name])
        spec.loader_state = module.__spec__  # the machinery is about to overwrite it
        return module

    def exec_module(self, module) -> None:
        """Nothing to run: the real module already ran. The import machinery stamped the alias's
        spec on it; give it back its own, so the module still knows its true name."""
        module.__spec__ = module.__spec__.loader_state


def install() -> None:
    """Make the alias paths importable (idempotent)."""
    if not any(isinstance(finder, AliasFinder) for finder in sys.meta_path):
        sys.meta_path.append(AliasFinder())


install()
