"""``App``: the workers of a deployment and its hooks; and loading one from ``module:attribute``.

``python -m fencekit.pool APP`` names an attribute that is an :class:`App`, a
sequence of workers (classes or instances), or a callable returning either.
Every failure to load it is a :class:`~fencekit.errors.ConfigError` with one
clear line, so the command can exit without a traceback. The hooks follow
the one contract of :mod:`fencekit.runtime.hooks`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from fencekit.errors import ConfigError
from fencekit.hooks import FenceKitHooks, check_hooks
from fencekit.runtime.hooks import Hook, check_hook

__all__ = ["App", "import_path", "load_app", "load_worker_paths", "load_workers"]


@dataclass(frozen=True)
class App:
    """Workers and hooks, as one importable value (``python -m fencekit.pool module:app``).

    ``on_startup``/``on_shutdown`` run in every process that runs jobs (each
    pool child); ``on_pool_startup``/``on_pool_shutdown`` once per pool, in
    the supervisor (the demo seeds its first task there). Each hook is an
    ``async def`` of no argument or of the process's ``Client``. ``hooks``
    (:class:`~fencekit.hooks.FenceKitHooks`) are told of every job of each
    child, of their enqueues, and of the supervisor's reaps.
    """

    workers: Sequence[object]
    on_startup: Sequence[Hook] = field(default_factory=tuple)
    on_shutdown: Sequence[Hook] = field(default_factory=tuple)
    on_pool_startup: Sequence[Hook] = field(default_factory=tuple)
    on_pool_shutdown: Sequence[Hook] = field(default_factory=tuple)
    hooks: FenceKitHooks | None = None

    def __post_init__(self) -> None:
        check_hooks(self.hooks)
        for what in ("on_startup", "on_shutdown", "on_pool_startup", "on_pool_shutdown"):
            hooks = getattr(self, what)
            if isinstance(hooks, (str, bytes)) or not isinstance(hooks, Sequence):
                raise ConfigError(f"App({what}=...) takes a list of async functions, got {hooks!r}")
            object.__setattr__(self, what, tuple(check_hook(h, what) for h in hooks))


def load_workers(spec: str) -> list[object]:
    """Import ``module:attribute`` and return its workers (not yet validated)."""
    return list(load_app(spec).workers)


def load_app(spec: str) -> App:
    """Import ``module:attribute`` and return it as an :class:`App`."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(f"APP must look like 'package.module:attribute', got {spec!r}")
    module_name, _, attr_path = spec.partition(":")
    if not module_name or not attr_path:
        raise ConfigError(f"APP must look like 'package.module:attribute', got {spec!r}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: the working directory is importable
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigError(f"cannot import APP module {module_name!r}: no such module") from None
        raise ConfigError(f"importing APP module {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise ConfigError(
            f"importing APP module {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    target: object = module
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"APP {spec!r}: {module_name!r} has no attribute {attr_path!r}") from None
    if callable(target) and not isinstance(target, type):
        try:
            target = target()
        except Exception as exc:
            raise ConfigError(f"APP {spec!r}: calling it failed: {type(exc).__name__}: {exc}") from exc
    if isinstance(target, App):
        if not target.workers:
            raise ConfigError(f"APP {spec!r} names no workers")
        return target
    if isinstance(target, type) or not isinstance(target, Sequence) or isinstance(target, (str, bytes)):
        raise ConfigError(
            f"APP {spec!r} must be a sequence of workers (or a callable returning one), "
            f"got {type(target).__name__}"
        )
    workers = list(target)
    if not workers:
        raise ConfigError(f"APP {spec!r} names no workers")
    return App(workers)


def import_path(worker: object) -> str:
    """``module:qualname`` under which ``worker`` can be imported again (exec'd children).

    Classes use their own qualified name; an instance must be a module-level
    attribute of the module of its class (found by identity).
    """
    if isinstance(worker, type):
        if "<locals>" in worker.__qualname__:
            raise ConfigError(
                f"worker {worker.__qualname__} is defined inside a function: it cannot be imported"
            )
        return f"{worker.__module__}:{worker.__qualname__}"
    module = sys.modules.get(type(worker).__module__)
    for name, value in vars(module or object()).items():
        if value is worker:
            return f"{type(worker).__module__}:{name}"
    raise ConfigError(
        f"worker instance of {type(worker).__qualname__} is not a module-level attribute; "
        "pass the APP as 'module:attribute' instead"
    )


def load_worker_paths(paths: Sequence[str]) -> list[object]:
    """Import each ``module:qualname`` of :func:`import_path`."""
    workers = []
    for path in paths:
        module_name, _, qualname = path.partition(":")
        try:
            target: object = importlib.import_module(module_name)
            for part in qualname.split("."):
                target = getattr(target, part)
        except Exception as exc:
            raise ConfigError(f"cannot import worker {path!r}: {type(exc).__name__}: {exc}") from exc
        workers.append(target)
    return workers
