"""``await drain(app)``: run an app's tasks in this process until its queues are empty; say what ran.

For users' own tests ("the view enqueues, the job runs, the row is
updated"): :func:`drain` runs a :class:`~fencekit.Server` in burst mode
(``burst=True``, the rule of :mod:`fencekit.services.drain`) with the app's
workers, its :class:`~fencekit.hooks.FenceKitHooks` and its
``on_startup``/``on_shutdown`` hooks -- and nothing else of the app, so
workers however they were declared (classes, instances, ``@app.task``
functions) all run -- against the test's Redis, and returns a
:class:`Drained`: each task that succeeded with its result, each that
failed for good with its exception, how many attempts were retried and
how many tasks became dead letters. Retries wait their delay, as in
production: a task that fails once is retried and counted once in
``retried``.

It is bounded: after ``timeout`` seconds with tasks left (one scheduled far
ahead, one that never ends) it stops and raises
:class:`~fencekit.errors.DrainTimeout`, whose message says what each queue
still holds. :func:`drain_sync` is the same for synchronous tests; it runs
its own event loop, so it cannot be called from inside a running one.

Results are read from the tasks' records, which exist while the
producer's ``keep_result`` is above 0 (the default, 3600 s): a task enqueued
with ``keep_result=0`` appears in ``succeeded`` with ``result`` None.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import Unpack

from fencekit.hooks import FenceKitHooks, JobEvent
from fencekit.jobs.records import JobInfo
from fencekit.produce.client import Client
from fencekit.runtime.app import App
from fencekit.runtime.server import Server
from fencekit.settings import ServerOptions

__all__ = ["DEFAULT_TIMEOUT", "Drained", "Failed", "Succeeded", "drain", "drain_sync"]

DEFAULT_TIMEOUT = 30.0
"""Seconds :func:`drain` waits for the queues to empty before :class:`~fencekit.errors.DrainTimeout`."""


@dataclass(frozen=True, slots=True)
class Succeeded:
    """A task that ran to completion: what its ``perform`` returned (None without a record)."""

    jid: str
    queue: str
    operation: str
    result: Any
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class Failed:
    """A task that failed for good (retries spent, a timeout, a dead letter) and why.

    ``error`` is the exception its last attempt raised (None for a dead
    letter, which never ran: bad input, no worker); ``reason`` is the
    error as its record keeps it (``"ValueError: ..."``, or the dead
    letter's reason).
    """

    jid: str | None
    queue: str
    operation: str
    error: BaseException | None
    attempt: int = 0
    reason: str = ""


@dataclass(frozen=True)
class Drained:
    """What one :func:`drain` ran, in the order the outcomes landed in Redis."""

    succeeded: tuple[Succeeded, ...] = ()
    failed: tuple[Failed, ...] = ()
    retried: int = 0
    """Attempts that failed and were scheduled again (each retry once)."""
    dead: int = 0
    """Tasks kept as dead letters (bad input, no worker for the operation)."""

    def results(self, operation: str | None = None) -> list[Any]:
        """The results of the succeeded tasks (of ``operation`` only, when given), in order."""
        return [s.result for s in self.succeeded if operation is None or s.operation == operation]

    def raise_failures(self) -> None:
        """Raise the first failure's own exception (its traceback shows where the task failed)."""
        for failure in self.failed:
            if failure.error is not None:
                raise failure.error
        if self.failed:
            first = self.failed[0]
            raise AssertionError(f"task {first.jid} ({first.queue}/{first.operation}) failed: {first.reason}")


@dataclass
class _Recorder:
    """The callbacks :func:`drain` adds to the app's hooks to learn what ran."""

    succeeded: list[JobEvent] = field(default_factory=list)
    failed: list[JobEvent] = field(default_factory=list)
    retried: int = 0

    def hooks(self, app_hooks: FenceKitHooks | None) -> FenceKitHooks:
        """The app's hooks (or none) with this recorder's callbacks called first."""
        base = app_hooks if app_hooks is not None else FenceKitHooks()
        return dataclasses.replace(
            base,
            on_succeeded=_both(self.succeeded.append, base.on_succeeded),
            on_failed=_both(self.failed.append, base.on_failed),
            on_retried=_both(self._retried, base.on_retried),
        )

    def _retried(self, event: JobEvent) -> None:
        self.retried += 1


def _both(
    first: Callable[[JobEvent], None], then: Callable[[JobEvent], None] | None
) -> Callable[[JobEvent], None]:
    if then is None:
        return first

    def call(event: JobEvent) -> None:
        first(event)
        then(event)

    return call


async def drain(
    app: App | Sequence[object],
    redis_url: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    **options: Unpack[ServerOptions],
) -> Drained:
    """Run ``app``'s tasks here until every queue it serves is empty; return what ran.

    ``app`` is an :class:`~fencekit.App` or a list of workers. ``redis_url``
    and ``options`` are the ``Server``'s (default: ``FENCEKIT_REDIS_URL``,
    which the pytest plugin's ``fencekit_redis_url`` fixture sets); the web
    server is off and ``grace`` is 1 s unless given. Raises
    :class:`~fencekit.errors.DrainTimeout` after ``timeout`` seconds with
    tasks left.
    """
    if not isinstance(app, App):
        app = App(list(app))
    recorder = _Recorder()
    settings: dict[str, Any] = {"web_port": None, "grace": 1.0, **options}
    settings.update(burst=True, burst_timeout=timeout)
    server = Server(redis_url, hooks=recorder.hooks(app.hooks), **settings)
    server.add_workers(*app.workers)
    for hook in app.on_startup:
        server.on_startup(hook)
    for hook in app.on_shutdown:
        server.on_shutdown(hook)
    client = Client(server.settings["redis_url"], prefix=server.settings["prefix"])
    try:
        queues = server.registry.queues
        dead_before = await _dead(client, queues)
        await server.run()
        succeeded = []
        for e in recorder.succeeded:
            info = await _record(client, e)
            result = info.result if info is not None else None
            succeeded.append(Succeeded(e.jid or "", e.queue, e.operation, result, e.attempt))
        failed = []
        for e in recorder.failed:
            info = await _record(client, e)
            operation = e.operation or (info.operation if info is not None else None) or ""
            reason = f"{type(e.error).__name__}: {e.error}" if e.error is not None else ""
            if info is not None and info.error is not None:
                reason = str(info.error)
            failed.append(Failed(e.jid, e.queue, operation, e.error, e.attempt, reason))
        dead = await _dead(client, queues) - dead_before
        return Drained(tuple(succeeded), tuple(failed), recorder.retried, dead)
    finally:
        await client.close()


async def _record(client: Client, event: JobEvent) -> JobInfo | None:
    return await client.job(event.jid, queue=event.queue) if event.jid is not None else None


async def _dead(client: Client, queues: Sequence[str]) -> int:
    return sum([(await client.queue(q).stats()).dead for q in queues])


def drain_sync(
    app: App | Sequence[object],
    redis_url: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    **options: Unpack[ServerOptions],
) -> Drained:
    """:func:`drain` for synchronous tests: runs it on a new event loop (not from inside a running one)."""
    return asyncio.run(drain(app, redis_url, timeout=timeout, **options))
