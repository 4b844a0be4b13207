"""Old import paths, kept for one release after a move, through one mechanism.

``import fencekit`` puts :class:`MovedFinder` first on ``sys.meta_path``. Importing
an old path (``fencekit.codec``, ``fencekit.queue.worker``, ``fencekit.sql`` ...)
then imports the module's new home and binds the *same* module object under the
old name, so ``fencekit.codec.decode is fencekit.jobs.codec.decode`` and a class
imported either way is one class. Each first import of an old path warns with a
:class:`DeprecationWarning` naming the new path (``fencekit.storage``, fencekit
0.6.1's path of the Django helpers, stays without a warning as before).

The table :data:`MOVED` is the whole list; nothing else keeps a shim module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

__all__ = ["MOVED", "SILENT", "MovedFinder", "install"]

_QUEUE = {
    "jobs": "task codec worker functions periodic flow histogram records history",
    "produce": "client sync_client handle sync_handle schedules",
    "consume": "job",
    "services": "drain",
}
"""Modules of the old flat ``queue/`` that kept their name in their new home."""

_QUEUE_PRIVATE = {
    "jobs": "ids binding registry",
    "produce": "producer enqueue batching handle_steps bulk results",
    "consume": "consumer turns outbox wake_claims waker perform threads cancels refusals observe settle",
    "services": "heartbeat reaper scheduler ticker",
}
"""Modules of the old flat ``queue/`` that became implementation modules (a leading underscore)."""

MOVED: dict[str, str] = {
    # 0.2: flat top-level modules into their subpackages
    "fencekit.admin": "fencekit.web.source",
    "fencekit.appload": "fencekit.runtime.app",
    "fencekit.codec": "fencekit.jobs.codec",
    "fencekit.testing_cluster": "fencekit.testing.cluster",
    "fencekit.testing_sentinel": "fencekit.testing.sentinel",
    "fencekit.testing_tls": "fencekit.testing.tls",
    "fencekit.storage": "fencekit.integrations.django",
    # 0.2: the integrations under one home
    "fencekit.django": "fencekit.integrations.django",
    "fencekit.celery": "fencekit.integrations.celery",
    "fencekit.otel": "fencekit.integrations.otel",
    "fencekit.sql": "fencekit.integrations.sql",
    "fencekit.sql.alembic": "fencekit.integrations.sql.alembic",
    "fencekit.sql.columns": "fencekit.integrations.sql.columns",
    "fencekit.sql.outbox": "fencekit.integrations.sql.outbox",
    # 0.2: the flat queue/ package split by role
    "fencekit.queue": "fencekit.jobs",
    "fencekit.queue.loops": "fencekit._aio.loops",
    **{f"fencekit.queue.{m}": f"fencekit.{home}.{m}" for home, ms in _QUEUE.items() for m in ms.split()},
    **{
        f"fencekit.queue.{m}": f"fencekit.{home}._{m}"
        for home, ms in _QUEUE_PRIVATE.items()
        for m in ms.split()
    },
}
"""Old module path -> its new home."""

SILENT = frozenset({"fencekit.storage", "fencekit.queue"})
"""Old paths that resolve without a warning (``fencekit.queue`` held nothing itself: its modules warn)."""


class _AliasLoader(importlib.abc.Loader):
    """Hands back the new module itself, so both names are one module object."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing runs again; the module keeps its own ``__spec__`` (importlib set the alias's)."""
        module.__spec__ = self.spec


class MovedFinder(importlib.abc.MetaPathFinder):
    """Resolves the old paths of :data:`MOVED` (see the module docstring)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        if fullname not in SILENT:
            warnings.warn(
                f"{fullname} has moved to {new}; the old path works until fencekit 0.3",
                DeprecationWarning,
                stacklevel=2,
            )
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    """Put one :class:`MovedFinder` first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
