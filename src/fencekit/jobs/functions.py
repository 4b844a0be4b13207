"""Task functions: ``@app.task`` over a typed function, enqueued by calling it.

``send_email = app.task(queue="emails")(send_email)`` gives a
:class:`TaskFunction` that is both sides of the job:

- the producer's: ``await send_email.enqueue("a@b.c", subject="hi")`` (its
  arguments typed by the function's own ``ParamSpec``) binds the call to the
  signature, stores it as params named by parameter
  (:mod:`fencekit.jobs._binding`) and returns the jid; ``await
  send_email.run(...)`` also waits for the result; ``send_email.options(delay=...,
  ...)`` gives a :class:`TaskCall` with the same typed ``enqueue``/``run``
  and per-call options (they cannot share the function's ``ParamSpec``);
  ``send_email.build(...)`` is the :class:`~fencekit.jobs.task.Task` of a
  call, for any client (a sync one too);
- the worker's: its ``queue``, ``operation`` (the function's ``__name__``
  unless ``name=``), the decorator's options as attributes (validated by
  :func:`~fencekit.jobs.worker.inspect_worker` at decoration, so every
  worker option is a decorator option), a ``perform`` (the function) and
  its ``fencekit_binder``. It registers like any worker
  (``Server.add_workers(send_email)``) and is found again by import path in
  an exec'd pool child, being a module-level attribute.

Calling ``send_email(...)`` runs the function itself (for tests).

Which client enqueues (:class:`ClientPlace`): in a process that runs the
app's tasks (a ``Server``, a pool child), the client its jobs already use,
attached for that event loop while it serves; elsewhere one opened lazily
from the app's settings, one per event loop, closed by ``await app.close()``.
``send_email.enqueue_sync(...)`` (synchronous code: a WSGI view, a script, a
sync task's thread) goes through that serving loop's client when the process
serves the app, and otherwise through one
:class:`~fencekit.produce.sync_client.SyncClient` per process, opened lazily
from the same settings (thread-safe; no event loop).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from typing_extensions import ParamSpec

from fencekit.errors import ConfigError
from fencekit.jobs._binding import Binder
from fencekit.jobs.flow import concurrency_key, debounce_options, key_options
from fencekit.jobs.task import Task
from fencekit.jobs.worker import WORKER_DEFAULTS, WorkerSpec, inspect_worker

if TYPE_CHECKING:
    from fencekit.produce.client import Client
    from fencekit.produce.sync_client import SyncClient

__all__ = [
    "AsyncTaskFunction",
    "ClientPlace",
    "SyncTaskFunction",
    "TaskCall",
    "TaskFunction",
    "attach_client",
    "task_function",
]

P = ParamSpec("P")
R = TypeVar("R")

OutboxWriter = Callable[[Any, Task, "float | timedelta | None", "datetime | None"], Any]
"""Writes a task into the SQL outbox (the App gives its place ``produce.outbox.enqueue_in``)."""

DEFAULT_QUEUE = "default"

RUN_KEEP_RESULT = 3600.0
"""Seconds ``run()`` keeps a result when the client keeps none (``keep_result=0``): it must read it."""


class ClientPlace:
    """Which :class:`~fencekit.produce.client.Client` enqueues, per event loop (see the module docstring)."""

    def __init__(
        self,
        opener: Callable[[], Client],
        sync_opener: Callable[[], SyncClient] | None = None,
        outbox: OutboxWriter | None = None,
    ) -> None:
        self._opener = opener
        self._outbox = outbox
        self._opened: dict[asyncio.AbstractEventLoop, Client] = {}
        self._attached: dict[asyncio.AbstractEventLoop, list[Client]] = {}
        self._sync_opener = sync_opener
        self._sync: SyncClient | None = None
        self._sync_lock = threading.Lock()

    def client(self) -> Client:
        """The client of the running loop: the serving process's, else one opened now (no I/O yet)."""
        loop = asyncio.get_running_loop()
        attached = self._attached.get(loop)
        if attached:
            return attached[-1]
        client = self._opened.get(loop)
        if client is None:
            for other in [other for other in self._opened if other.is_closed()]:
                del self._opened[other]  # its connections died with its loop
            client = self._opened[loop] = self._opener()
        return client

    def attach(self, client: Client) -> Callable[[], None]:
        """Enqueue on ``client`` in the running loop until the returned function is called."""
        loop = asyncio.get_running_loop()
        self._attached.setdefault(loop, []).append(client)

        def detach() -> None:
            clients = self._attached.get(loop, [])
            if client in clients:
                clients.remove(client)
            if not clients:
                self._attached.pop(loop, None)

        return detach

    def enqueue_sync(self, task: Task, delay: float | timedelta | None, at: datetime | None) -> str:
        """Enqueue ``task`` from synchronous code; returns its jid (see the module docstring).

        Called on the serving loop's own thread it would block that loop, so
        that is a RuntimeError (use ``await ....enqueue()`` there).
        """
        serving = next((loop for loop in self._attached if not loop.is_closed()), None)
        if serving is not None:
            try:
                running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is serving:
                raise RuntimeError("enqueue_sync() on the event loop would block it: use await .enqueue()")
            return asyncio.run_coroutine_threadsafe(self._enqueue(task, delay, at), serving).result()
        return self.sync_client().enqueue(task, delay=delay, at=at)

    async def _enqueue(self, task: Task, delay: float | timedelta | None, at: datetime | None) -> str:
        return await self.client().enqueue(task, delay=delay, at=at)  # on the serving loop: its client

    def enqueue_in(self, where: Any, task: Task, delay: float | timedelta | None, at: datetime | None) -> Any:
        """Write ``task`` into the SQL outbox in ``where``'s transaction (the jid, awaitable for an
        asyncio session): ``fencekit.integrations.sql.outbox.enqueue_in`` with the app's settings."""
        if self._outbox is None:
            raise RuntimeError("this task function has no outbox writer: build it with App.task")
        return self._outbox(where, task, delay, at)

    def sync_client(self) -> SyncClient:
        """The process's :class:`~fencekit.produce.sync_client.SyncClient`, opened on first use."""
        if self._sync_opener is None:
            raise RuntimeError("this task function has no synchronous client: use await .enqueue()")
        with self._sync_lock:
            if self._sync is None:
                self._sync = self._sync_opener()
            return self._sync

    async def close(self) -> None:
        """Close the clients this place opened for the running loop and for synchronous code.

        Attached clients are their owners'.
        """
        client = self._opened.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()
        self.close_sync()

    def close_sync(self) -> None:
        """Close the synchronous client this place opened (if any)."""
        with self._sync_lock:
            sync, self._sync = self._sync, None
        if sync is not None:
            sync.close()


def attach_client(specs: Iterable[WorkerSpec], client: Client) -> Callable[[], None]:
    """Make ``client`` the one the task functions among ``specs`` enqueue with, in this loop.

    A ``Server`` and a pool child call it while they serve, so a job (or
    anyone in that process) enqueuing a task function opens no connection of
    its own. Returns the function that undoes it.
    """
    places = {id(s.source.place): s.source.place for s in specs if isinstance(s.source, TaskFunction)}
    detaches = [place.attach(client) for place in places.values()]

    def detach() -> None:
        for undo in detaches:
            undo()

    return detach


class TaskCall(Generic[P, R]):
    """A task function with per-call options: ``send_email.options(delay=60).enqueue(...)``."""

    __slots__ = ("at", "delay", "function", "task_options")

    def __init__(
        self,
        function: TaskFunction[P, R],
        *,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        task_options: dict[str, Any] | None = None,
    ) -> None:
        self.function = function
        self.delay = delay
        self.at = at
        self.task_options = task_options or {}

    def build(self, *args: P.args, **kwargs: P.kwargs) -> Task:
        """The :class:`~fencekit.jobs.task.Task` of this call (what ``enqueue`` sends).

        ``delay``/``at`` are not part of the task: pass them to the client's
        ``enqueue`` (this object's :attr:`delay` and :attr:`at`).
        """
        f = self.function
        options = self.task_options
        if f.spec.priority and "priority" not in options:
            options = {**options, "priority": f.spec.priority}
        params = f.fencekit_binder.encode(args, kwargs)
        if f.spec.key_of is not None and "concurrency_key" not in options:
            options = {**options, "concurrency_key": concurrency_key(f.spec, params)}
        if f.spec.debounce is not None and "debounce_key" not in options:
            options = {**debounce_options(f.spec, params), **options}
        if f.spec.keys is not None:
            options = {**key_options(f.spec, params), **options}
        return Task(f.queue, f.operation, params, **options)

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """Enqueue the call; returns its jid. A bad call is a PayloadError naming the parameter."""
        task = self.build(*args, **kwargs)
        return await self.function.place.client().enqueue(task, delay=self.delay, at=self.at)

    def enqueue_sync(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """:meth:`enqueue` for synchronous code (see :meth:`ClientPlace.enqueue_sync`); returns the jid."""
        return self.function.place.enqueue_sync(self.build(*args, **kwargs), self.delay, self.at)

    def enqueue_in(self, where: Any, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Write the call into the SQL outbox in ``where``'s transaction (:meth:`TaskFunction.enqueue_in`)."""
        return self.function.place.enqueue_in(where, self.build(*args, **kwargs), self.delay, self.at)

    async def run(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Enqueue the call and wait for its result (``Client.result``: JobFailed if it failed)."""
        task = self.build(*args, **kwargs)
        client = self.function.place.client()
        if task.keep_result is None and not client.keep_result:
            task.keep_result = RUN_KEEP_RESULT
        jid = await client.enqueue(task, delay=self.delay, at=self.at)
        result: R = await client.result(jid, queue=task.queue)
        return result


class TaskFunction(Generic[P, R]):
    """A function registered with ``@app.task`` (see the module docstring).

    The decorator's options are attributes of the object, read by
    :func:`~fencekit.jobs.worker.inspect_worker` as a worker class's are.
    """

    queue: str
    operation: str
    fencekit_binder: Binder

    def __init__(
        self,
        function: Callable[P, Any],
        place: ClientPlace,
        *,
        queue: str = DEFAULT_QUEUE,
        name: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        functools.update_wrapper(self, function)  # type: ignore[arg-type]  # its names, for import_path
        self.function = function
        self.place = place
        self.queue = queue
        self.operation = name if name is not None else function.__name__
        self.perform = function
        self.fencekit_binder = Binder(function)
        label = f"@app.task of {function.__qualname__}"
        for option, value in (options or {}).items():
            if option not in WORKER_DEFAULTS or hasattr(TaskFunction, option):
                known = ", ".join(["queue", "name", *WORKER_DEFAULTS])
                raise ConfigError(f"{label}: unknown option {option!r} (options: {known})")
            setattr(self, option, value)
        try:
            self.spec = inspect_worker(self)
        except ConfigError as exc:
            why = str(exc).removeprefix(f"worker task {function.__qualname__}: ")
            raise ConfigError(f"{label}: {why}".replace("attribute '", "option '")) from None
        self._plain: TaskCall[P, R] = TaskCall(self)

    def __repr__(self) -> str:
        return f"<task {self.__qualname__} ({self.queue}/{self.operation})>"  # type: ignore[attr-defined]

    def build(self, *args: P.args, **kwargs: P.kwargs) -> Task:
        """The :class:`~fencekit.jobs.task.Task` of the call ``function(*args, **kwargs)``.

        What ``enqueue`` sends; a sync client enqueues it just the same.
        """
        params = self.fencekit_binder.encode(args, kwargs)
        return Task(
            self.queue,
            self.operation,
            params,
            priority=self.spec.priority,
            concurrency_key=concurrency_key(self.spec, params),
            **debounce_options(self.spec, params),
            **key_options(self.spec, params),
        )

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """Enqueue the call; returns its jid. A bad call is a PayloadError naming the parameter."""
        return await self.place.client().enqueue(self.build(*args, **kwargs))

    def enqueue_sync(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """:meth:`enqueue` for synchronous code: a view, a script, a sync task's thread; returns the jid.

        In a process that serves the app it goes through the serving loop's
        client; elsewhere through the app's one ``SyncClient`` per process.
        """
        return self.place.enqueue_sync(self.build(*args, **kwargs), None, None)

    def enqueue_in(self, where: Any, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Write the call into the SQL outbox inside ``where``'s transaction; returns its jid.

        ``where`` is a SQLAlchemy ``Session`` or ``Connection`` (then the jid), or an
        ``AsyncSession``/``AsyncConnection`` (then an awaitable of it). The task is enqueued
        once the transaction commits, never if it rolls back (docs/guides/outbox.md).
        """
        return self.place.enqueue_in(where, self.build(*args, **kwargs), None, None)

    async def run(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Enqueue the call and wait for what the function returned (through ``Client.result``)."""
        return await self._plain.run(*args, **kwargs)

    def options(
        self,
        *,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        jid: str | None = None,
        unique_key: str | None = None,
        unique_for: float | timedelta | None = None,
        timeout: float | timedelta | None = None,
        expires: float | timedelta | datetime | None = None,
        keep_result: float | timedelta | None = None,
        priority: int | None = None,
        concurrency_key: str | None = None,
        fair_key: str | None = None,
        rate_key: str | None = None,
    ) -> TaskCall[P, R]:
        """This function with per-call enqueue options (those of ``Task`` and ``Client.enqueue``)."""
        given = {
            "jid": jid,
            "unique_key": unique_key,
            "unique_for": unique_for,
            "timeout": timeout,
            "expires": expires,
            "keep_result": keep_result,
            "priority": priority,
            "concurrency_key": concurrency_key,
            "fair_key": fair_key,
            "rate_key": rate_key,
        }
        return TaskCall(
            self, delay=delay, at=at, task_options={k: v for k, v in given.items() if v is not None}
        )


class AsyncTaskFunction(TaskFunction[P, R]):
    """A task function over an ``async def``: calling it returns the function's coroutine."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        result: Coroutine[Any, Any, R] = self.function(*args, **kwargs)
        return result


class SyncTaskFunction(TaskFunction[P, R]):
    """A task function over a plain ``def`` (run in the consumer's threads): calling it runs it."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = self.function(*args, **kwargs)
        return result


def task_function(
    function: Callable[..., Any],
    place: ClientPlace,
    *,
    queue: str = DEFAULT_QUEUE,
    name: str | None = None,
    options: dict[str, Any] | None = None,
) -> TaskFunction[Any, Any]:
    """The task function of ``function``: async or sync by how it is declared."""
    if not callable(function) or isinstance(function, (type, TaskFunction)):
        raise ConfigError(f"@app.task takes a function, got {function!r}")
    kind = AsyncTaskFunction if inspect.iscoroutinefunction(function) else SyncTaskFunction
    return kind(function, place, queue=queue, name=name, options=options)
