"""``App``: the workers, task functions and hooks of a deployment; loading one from ``module:attribute``.

``@app.task`` makes a task function (:mod:`fencekit.jobs.functions`) and
adds it to the app's workers.

``python -m fencekit.pool APP`` names an attribute that is an :class:`App`, a
sequence of workers (classes or instances), or a callable returning either.
Every failure to load it is a :class:`~fencekit.errors.ConfigError` with one
clear line, so the command can exit without a traceback. The hooks follow
the one contract of :mod:`fencekit.runtime.hooks`.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Coroutine, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar, overload

from typing_extensions import ParamSpec, Unpack

from fencekit._redis.url import parse_url
from fencekit.errors import ConfigError
from fencekit.hooks import FenceKitHooks, check_hooks
from fencekit.jobs.batches import BatchInfo
from fencekit.jobs.functions import (
    DEFAULT_QUEUE,
    AsyncTaskFunction,
    ClientPlace,
    SyncTaskFunction,
    TaskFunction,
    task_function,
)
from fencekit.jobs.records import JobInfo
from fencekit.jobs.task import Task
from fencekit.jobs.worker import WorkerOptions
from fencekit.produce.batch import BatchOpening, SyncBatch
from fencekit.produce.client import Client
from fencekit.produce.outbox import enqueue_in
from fencekit.produce.sync_client import SyncClient
from fencekit.runtime.hooks import Hook, check_hook
from fencekit.settings import ClientOptions, ClientSettings, resolve, with_url

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["App", "import_path", "load_app", "load_worker_paths", "load_workers", "pool_url"]


class App:
    """Workers, task functions and hooks, as one importable value (``python -m fencekit.pool module:app``).

    ``workers`` are worker classes or instances (optional: ``@app.task``
    functions join them as they are decorated). ``on_startup``/``on_shutdown``
    run in every process that runs jobs (each pool child);
    ``on_pool_startup``/``on_pool_shutdown`` once per pool, in the supervisor
    (the demo seeds its first task there). Each hook is an ``async def`` of no
    argument or of the process's ``Client``. ``hooks``
    (:class:`~fencekit.hooks.FenceKitHooks`) are told of every job of each
    child, of their enqueues, and of the supervisor's reaps.

    ``redis_url`` and the :class:`~fencekit.settings.ClientOptions` are those
    of the client a task function's ``enqueue`` opens outside a process that
    runs this app (argument, else ``FENCEKIT_<NAME>``, else the default),
    and of the ``SyncClient`` that ``enqueue_sync`` opens;
    ``await app.close()`` (or ``app.close_sync()``) closes them.
    """

    def __init__(
        self,
        workers: Sequence[object] = (),
        *,
        on_startup: Sequence[Hook] = (),
        on_shutdown: Sequence[Hook] = (),
        on_pool_startup: Sequence[Hook] = (),
        on_pool_shutdown: Sequence[Hook] = (),
        hooks: FenceKitHooks | None = None,
        redis_url: str | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        check_hooks(hooks)
        self.hooks = hooks
        if isinstance(workers, (str, bytes)) or not isinstance(workers, Sequence):
            raise ConfigError(f"App(workers=...) takes a list of workers, got {workers!r}")
        self._workers = tuple(workers)
        self._tasks: list[TaskFunction[Any, Any]] = []
        self.on_startup = _hooks(on_startup, "on_startup")
        self.on_shutdown = _hooks(on_shutdown, "on_shutdown")
        self.on_pool_startup = _hooks(on_pool_startup, "on_pool_startup")
        self.on_pool_shutdown = _hooks(on_pool_shutdown, "on_pool_shutdown")
        given = with_url(redis_url, options)
        resolve(ClientSettings, given, owner="App")  # a bad setting fails here, not at the first enqueue
        self.redis_url = redis_url
        """The URL given to this App, None when none was: a pool serving the app without a URL
        of its own (``--redis-url``, ``FENCEKIT_REDIS_URL``) serves this one (:func:`pool_url`)."""
        self.place = ClientPlace(
            lambda: Client(hooks=self.hooks, **given),
            lambda: SyncClient(hooks=self.hooks, **given),
            outbox=functools.partial(_enqueue_in, {k: v for k, v in given.items() if k != "redis_url"}),
        )

    @property
    def workers(self) -> tuple[object, ...]:
        """The workers given, then the task functions decorated (each once)."""
        given = self._workers
        return given + tuple(t for t in self._tasks if not any(t is w for w in given))

    @overload
    def task(self, function: Callable[P, Coroutine[Any, Any, R]], /) -> AsyncTaskFunction[P, R]: ...  # type: ignore[overload-overlap]

    @overload
    def task(self, function: Callable[P, R], /) -> SyncTaskFunction[P, R]: ...

    @overload
    def task(
        self, /, *, queue: str = DEFAULT_QUEUE, name: str | None = None, **options: Unpack[WorkerOptions]
    ) -> _Decorator: ...

    def task(
        self,
        function: Callable[..., Any] | None = None,
        /,
        *,
        queue: str = DEFAULT_QUEUE,
        name: str | None = None,
        **options: Any,
    ) -> Any:
        """Register ``function`` as a task function of this app (``@app.task`` or ``@app.task(...)``).

        ``queue`` (default ``"default"``), ``name`` (the operation; default the
        function's ``__name__``) and every worker option
        (:class:`~fencekit.jobs.worker.WorkerOptions`: ``retry``,
        ``retry_count``, ``timeout``, ``keep_result``, ``keep_failed``, and
        the periodic ``cron``/``every``, ``cron_params``, ``cron_tz``,
        ``cron_catch_up``: ``docs/guides/periodic.md``); an unknown or bad one is a
        ConfigError naming it. A periodic function's required parameters
        must be bound by ``cron_params`` (a ConfigError at decoration
        otherwise): they are the params of each run. An ``async def`` runs
        on the event loop, a plain ``def`` in the consumer's threads.
        """

        def register(fn: Callable[..., Any]) -> TaskFunction[Any, Any]:
            made = task_function(fn, self.place, queue=queue, name=name, options=options)
            self._tasks.append(made)
            return made

        return register if function is None else register(function)

    # What became of a task enqueued through this app, without a Client of one's own: the
    # running loop's client (a serving process's own), or the synchronous one.

    async def job(self, jid: str, *, queue: str | None = None) -> JobInfo | None:
        """:meth:`Client.job <fencekit.produce.client.Client.job>` on this app's Redis."""
        return await self.place.client().job(jid, queue=queue)

    async def result(self, jid: str, *, timeout: float | None = None, queue: str | None = None) -> Any:
        """:meth:`Client.result <fencekit.produce.client.Client.result>` on this app's Redis."""
        return await self.place.client().result(jid, timeout=timeout, queue=queue)

    async def cancel(self, jid: str, *, queue: str | None = None) -> bool:
        """:meth:`Client.cancel <fencekit.produce.client.Client.cancel>` on this app's Redis."""
        return await self.place.client().cancel(jid, queue=queue)

    def batch(
        self,
        tasks: Iterable[Task] = (),
        *,
        on_complete: Task | None = None,
        on_success: Task | None = None,
        on_failure: Task | None = None,
        keep: float | None = None,
    ) -> BatchOpening:
        """:meth:`Client.batch <fencekit.produce.client.Client.batch>` on this app's Redis:
        ``await app.batch([analyse.build(g) for g in games], on_complete=report.build(user))``."""
        return self.place.client().batch(
            tasks, on_complete=on_complete, on_success=on_success, on_failure=on_failure, keep=keep
        )

    async def batch_info(self, bid: str) -> BatchInfo | None:
        """:meth:`Client.batch_info <fencekit.produce.client.Client.batch_info>` on this app's Redis."""
        return await self.place.client().batch_info(bid)

    async def batch_results(self, bid: str) -> dict[str, Any]:
        """:meth:`Client.batch_results <fencekit.produce.client.Client.batch_results>` on this app's Redis."""
        return await self.place.client().batch_results(bid)

    def batch_sync(
        self,
        tasks: Iterable[Task],
        *,
        on_complete: Task | None = None,
        on_success: Task | None = None,
        on_failure: Task | None = None,
        keep: float | None = None,
    ) -> SyncBatch:
        """:meth:`batch` from synchronous code (the app's ``SyncClient``): the armed batch."""
        return self.place.sync_client().batch(
            tasks, on_complete=on_complete, on_success=on_success, on_failure=on_failure, keep=keep
        )

    def job_sync(self, jid: str, *, queue: str | None = None) -> JobInfo | None:
        """:meth:`job` from synchronous code (the app's ``SyncClient``)."""
        return self.place.sync_client().job(jid, queue=queue)

    def result_sync(self, jid: str, *, timeout: float | None = None, queue: str | None = None) -> Any:
        """:meth:`result` from synchronous code (the app's ``SyncClient``)."""
        return self.place.sync_client().result(jid, timeout=timeout, queue=queue)

    def cancel_sync(self, jid: str, *, queue: str | None = None) -> bool:
        """:meth:`cancel` from synchronous code (the app's ``SyncClient``)."""
        return self.place.sync_client().cancel(jid, queue=queue)

    async def close(self) -> None:
        """Close the clients this app opened for enqueues: the running loop's, and the synchronous one."""
        await self.place.close()

    def close_sync(self) -> None:
        """Close the synchronous client ``enqueue_sync`` opened (if any), from synchronous code."""
        self.place.close_sync()


class _Decorator(Protocol):
    """What ``app.task(...)`` with options returns: it turns a function into a task function."""

    @overload
    def __call__(self, function: Callable[P, Coroutine[Any, Any, R]], /) -> AsyncTaskFunction[P, R]: ...  # type: ignore[overload-overlap]

    @overload
    def __call__(self, function: Callable[P, R], /) -> SyncTaskFunction[P, R]: ...


def _hooks(hooks: object, what: str) -> tuple[Hook, ...]:
    if isinstance(hooks, (str, bytes)) or not isinstance(hooks, Sequence):
        raise ConfigError(f"App({what}=...) takes a list of async functions, got {hooks!r}")
    return tuple(check_hook(h, what) for h in hooks)


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
    module_name = getattr(worker, "__module__", None)  # a task function's is its function's
    if not isinstance(module_name, str):
        module_name = type(worker).__module__
    module = sys.modules.get(module_name)
    for name, value in vars(module or object()).items():
        if value is worker:
            return f"{module_name}:{name}"
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


def pool_url(app: App, given_url: str | None, given_by: str) -> tuple[str | None, str, str | None]:
    """Which Redis a pool serving ``app`` uses, where that came from, and a warning if any.

    ``given_url``: the pool's own URL when one was given (``given_by`` says how:
    ``--redis-url``, ``FENCEKIT_REDIS_URL``, ``Pool(redis_url=...)``), None when
    none was. The pool's own wins; else the app's (``App(redis_url=...)``), so
    the app's enqueues and the pool's claims meet in one Redis; else None: the
    caller's default. Both given and different: a warning naming both.
    """
    if given_url is not None:
        warning = None
        if app.redis_url is not None and parse_url(app.redis_url) != parse_url(given_url):
            warning = (
                f"the pool serves {parse_url(given_url).redacted()} ({given_by}), but the app names "
                f"{parse_url(app.redis_url).redacted()} (App(redis_url=...)): the app's enqueues "
                "outside the pool go there, and nothing serves them"
            )
        return given_url, given_by, warning
    if app.redis_url is not None:
        return app.redis_url, "App(redis_url=...)", None
    return None, "", None


def _enqueue_in(
    options: dict[str, Any],
    where: Any,
    task: Task,
    delay: float | timedelta | None,
    at: datetime | None,
) -> Any:
    """A task function's ``enqueue_in``: the outbox row, with the App's settings (else the environment)."""
    settings = resolve(ClientOptions, options, owner="App")
    return enqueue_in(
        where,
        task,
        delay=delay,
        at=at,
        table=settings["outbox_table"],
        keep_result=settings["keep_result"],
        max_payload=settings["max_payload"],
    )
