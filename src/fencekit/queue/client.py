"""Producers: ``Client`` enqueues tasks and opens :class:`~fencekit.queue.handle.Queue` handles.

``Client.enqueue(task)`` validates and encodes the task, then runs
``enqueue.lua`` (one round trip; the first enqueue to a queue also records
the queue's name in the registry). ``enqueue_many`` sends every task in one
round trip, one script call per queue. A client that owns its connection
enqueues over the lean hot-path connection; one given a redis-py client
(``Client(redis=...)``, as a consumer's jobs get) uses that.

A task keeps a record while ``keep_result`` (the task's, else the
client's) is above 0: ``client.job(jid)`` reads it and ``client.result(jid)``
waits for it (:mod:`fencekit.queue.results`).

Settings (``prefix``, ``max_payload``, ``durable_replicas``,
``durable_timeout``, ``keep_result`` and the URL) are those of
:mod:`fencekit.settings`: an argument, else ``FENCEKIT_<NAME>``, else the
default.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

import redis.asyncio
from typing_extensions import Unpack

from fencekit._log import JobLines, default_logger
from fencekit._redis.clients import aclose_client, async_client, watch_of
from fencekit._redis.keys import KeySpace
from fencekit._redis.link import Link, open_link, wait_replicas
from fencekit._redis.run import Durability, apipeline, translated
from fencekit._redis.url import parse_url
from fencekit.errors import ConfigError, DurabilityError, FenceKitError, JobNotFound, PayloadError, StoreError
from fencekit.hooks import FenceKitHooks, JobEvent, check_hooks
from fencekit.queue import codec
from fencekit.queue.batching import Coalescer
from fencekit.queue.enqueue import Enqueued, EnqueuePlan, encode
from fencekit.queue.handle import Queue, QueueStats
from fencekit.queue.records import JobInfo
from fencekit.queue.registry import known_queues, register_queues
from fencekit.queue.results import SAFETY_REREAD, ResultWaiter, cancel_job, outcome, read_job
from fencekit.queue.task import Task, unix_ms
from fencekit.settings import ClientOptions, ClientSettings, resolve, table, with_url

__all__ = ["READ_CONCURRENCY", "Client"]

_Enqueue = tuple[list[Task], list[bytes], int]  # one enqueue call: its tasks, their envelopes, the delay

READ_CONCURRENCY = 32
"""Record reads (``job``, ``result``) one client runs at once; more wait their turn."""


class Client:
    """Enqueues tasks and inspects queues (an async context manager too)."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        redis: redis.asyncio.Redis | None = None,
        hooks: FenceKitHooks | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        """``redis`` reuses a redis-py client instead of opening one (it is not closed here).

        ``hooks`` (:mod:`fencekit.hooks`) are told of every enqueue and may
        carry a trace context in each task.
        """
        settings: ClientSettings = resolve(ClientSettings, with_url(redis_url, options), owner="Client")
        self._setup(settings, redis, hooks)

    @classmethod
    def sharing(
        cls, settings: Mapping[str, Any], redis: redis.asyncio.Redis, hooks: FenceKitHooks | None = None
    ) -> Client:
        """A client on ``redis`` with the settings a ``Server`` or pool resolved already."""
        client = cls.__new__(cls)
        client._setup({name: settings[name] for name in table(ClientSettings)}, redis, hooks)  # type: ignore[arg-type]
        return client

    def _setup(
        self, settings: ClientSettings, redis: redis.asyncio.Redis | None, hooks: FenceKitHooks | None
    ) -> None:
        self.hooks = check_hooks(hooks)
        self.settings = settings
        self.target = parse_url(settings["redis_url"])
        self.keys = KeySpace(settings["prefix"])
        self.max_payload = settings["max_payload"]
        self.durable = Durability.of(settings["durable_replicas"], settings["durable_timeout"])
        self.keep_result: float = settings["keep_result"]
        self.redis = redis if redis is not None else async_client(self.target)
        self._owns_redis = redis is None
        self._lean: Link | None = None  # enqueues of a client that owns its connection go here
        self._lean_opening: asyncio.Lock | None = None
        self._known_queues: set[str] = set()
        self.logger = default_logger("fencekit.client")
        self._waiter: ResultWaiter | None = None
        # redis-py's pool refuses a connection past its size (100) instead of waiting: many
        # concurrent job()/result() calls share a few connections through this.
        self._reads = asyncio.Semaphore(READ_CONCURRENCY)
        self._batcher: Coalescer[_Enqueue, list[Enqueued]] = Coalescer(self._send, "fencekit-enqueue-batch")

    @property
    def logger(self) -> logging.Logger:
        """Where the client logs (``fencekit.client`` by default); assign another logger to replace it."""
        return self._lines.logger

    @logger.setter
    def logger(self, logger: logging.Logger) -> None:
        self._lines = JobLines(logger)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool (when this client created it)."""
        if self._waiter is not None:
            await self._waiter.aclose()
            self._waiter = None
        await self._batcher.aclose()
        if self._lean is not None:
            await self._lean.aclose()
            self._lean = None
        if self._owns_redis:
            await aclose_client(self.redis)

    def queue(self, name: str) -> Queue:
        """The handle of queue ``name``."""
        return Queue(self.redis, self.keys, name, producer=self)

    async def enqueue(
        self, task: Task, *, delay: float | timedelta | None = None, at: datetime | None = None
    ) -> str:
        """Accept ``task`` and return its jid.

        ``delay`` defers it (seconds or timedelta); ``at`` (an aware datetime)
        starts it then instead -- at once if that time has passed.
        """
        (jid,) = await self.enqueue_many((task,), delay=delay, at=at)
        if self._lines.wanted():
            self._lines.info("task %s accepted: %s/%s", jid, task.queue, task.operation)
        return jid

    async def enqueue_many(
        self, tasks: Iterable[Task], *, delay: float | timedelta | None = None, at: datetime | None = None
    ) -> list[str]:
        """Accept many tasks in one round trip; all are validated before any is sent.

        A task with a ``unique_key`` whose key is held gets the holder's jid.
        """
        return [e.jid for e in await self._enqueue(list(tasks), _delay_ms(delay, at))]

    async def enqueue_unique(
        self, task: Task, *, delay: float | timedelta | None = None, at: datetime | None = None
    ) -> Enqueued:
        """Enqueue ``task`` unless its ``unique_key`` is held: ``Enqueued(jid, created)``.

        A duplicate gets the jid of the task that holds the key (so
        ``client.result(jid)`` is that task's result), and ``created`` False.
        """
        if task.unique_key is None:
            raise ConfigError("enqueue_unique needs a Task with a unique_key")
        (enqueued,) = await self._enqueue([task], _delay_ms(delay, at))
        return enqueued

    async def _enqueue(self, tasks: list[Task], delay_ms: int) -> list[Enqueued]:
        if not tasks:
            return []
        if self.hooks is not None:
            return await self._enqueue_observed(self.hooks, tasks, delay_ms)
        envelopes = encode(tasks, max_payload=self.max_payload, keep_result=self.keep_result)
        new = [q for q in dict.fromkeys(t.queue for t in tasks) if q not in self._known_queues]
        if new:
            await register_queues(self.redis, self.keys, new)
            self._known_queues.update(new)
        return await self._batcher.submit((tasks, envelopes, delay_ms))

    async def _enqueue_observed(
        self, hooks: FenceKitHooks, tasks: list[Task], delay_ms: int
    ) -> list[Enqueued]:
        """:meth:`_enqueue` telling ``hooks`` of each task's outcome (with its error when refused)."""
        envelopes: list[bytes] = []
        error: BaseException | None = None
        try:
            envelopes = encode(tasks, max_payload=self.max_payload, keep_result=self.keep_result, hooks=hooks)
            new = [q for q in dict.fromkeys(t.queue for t in tasks) if q not in self._known_queues]
            if new:
                await register_queues(self.redis, self.keys, new)
                self._known_queues.update(new)
            return await self._batcher.submit((tasks, envelopes, delay_ms))
        except BaseException as exc:
            error = exc
            raise
        finally:
            now = time.time_ns()
            for i, task in enumerate(tasks):
                trace = codec.decode(envelopes[i]).trace if i < len(envelopes) else None
                event = JobEvent(task.queue, task.operation, task.jid, task.attempt, None, trace, at_ns=now)
                hooks.job("enqueued", event._replace(error=error))

    async def _send(self, batch: list[_Enqueue]) -> list[list[Enqueued] | BaseException]:
        """Send the enqueues of one batch (:mod:`fencekit.queue.batching`): one plan per delay."""
        out: list[list[Enqueued] | BaseException] = [[] for _ in batch]
        by_delay: dict[int, list[int]] = {}
        for k, (_, _, delay_ms) in enumerate(batch):
            by_delay.setdefault(delay_ms, []).append(k)
        for delay_ms, ks in by_delay.items():
            tasks = [task for k in ks for task in batch[k][0]]
            envelopes = [envelope for k in ks for envelope in batch[k][1]]
            try:
                outcomes = await self._send_plan(tasks, envelopes, delay_ms)
            except Exception as exc:
                for k in ks:
                    out[k] = exc
                continue
            start = 0
            for k in ks:
                mine = outcomes[start : start + len(batch[k][0])]
                start += len(mine)
                error = next((o for o in mine if isinstance(o, BaseException)), None)
                out[k] = error if error is not None else mine  # type: ignore[assignment]
        return out

    async def _send_plan(
        self, tasks: list[Task], envelopes: list[bytes], delay_ms: int
    ) -> list[Enqueued | BaseException]:
        """Send tasks with one delay: per task, its outcome or its call's error."""
        plan = EnqueuePlan.of(self.keys, tasks, envelopes, keep_result=self.keep_result, delay_ms=delay_ms)
        calls = plan.calls
        durable = self.durable
        if self._owns_redis:
            link = await self._link()
            results = await link.pipeline(calls) if len(calls) > 1 else [await _one(link, calls[0])]
            if durable is not None:  # scripts cannot WAIT: it follows them on the same connection
                results.append(await wait_replicas(link, durable))
        else:
            results = await apipeline(self.redis, calls, wait=durable)
        confirmed = int(results.pop()) if durable is not None else 0
        if durable is not None and confirmed < durable.replicas:
            raise DurabilityError(
                f"{len(tasks)} task(s) accepted by the master but confirmed by {confirmed} of "
                f"{durable.replicas} replicas within {durable.timeout_ms} ms: a failover now could lose them",
                confirmed,
            )
        return plan.outcomes(tasks, results)

    async def _link(self) -> Link:
        """The lean connection for enqueues (opened on first use, again after a failure)."""
        if self._lean is None or self._lean.closed:
            if self._lean_opening is None:
                self._lean_opening = asyncio.Lock()
            async with self._lean_opening:
                if self._lean is None or self._lean.closed:
                    self._lean = await open_link(
                        self.target, name="fencekit-client", watch=watch_of(self.redis)
                    )
        return self._lean

    async def job(self, jid: str, *, queue: str | None = None) -> JobInfo | None:
        """What happened to task ``jid`` (None: it keeps no record, or it was forgotten).

        ``queue`` saves looking for it in every known queue.
        """
        async with self._reads:
            return await read_job(self.redis, self.keys, jid, queue)

    async def result(self, jid: str, *, timeout: float | None = None, queue: str | None = None) -> Any:
        """Wait until task ``jid`` finishes and return what its ``perform`` returned.

        Woken by the finishing ack (no polling). Raises
        :class:`~fencekit.errors.JobFailed` (``.error``: type, message,
        traceback), :class:`~fencekit.errors.JobCancelled` or
        :class:`~fencekit.errors.JobExpired`, :class:`~fencekit.errors.JobNotFound`
        for a task that keeps no record, and the built-in ``TimeoutError``
        after ``timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        info = await self.job(jid, queue=queue)
        if info is not None and not info.status.finished:
            if self._waiter is None:
                self._waiter = ResultWaiter(self.redis, self.keys, self.logger)
            waiter, found = self._waiter, info.queue
            event = await waiter.watch(found, jid)
            try:
                while info is not None and not info.status.finished:
                    event.clear()
                    info = await self.job(jid, queue=found)
                    if info is None or info.status.finished:
                        break
                    left = SAFETY_REREAD if deadline is None else min(SAFETY_REREAD, deadline - loop.time())
                    if left <= 0:
                        raise TimeoutError(f"task {jid} did not finish within {timeout}s")
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(event.wait(), left)
            finally:
                waiter.unwatch(found, jid, event)
        if info is None:
            raise JobNotFound(f"no record of task {jid}: it keeps none (keep_result=0), or it was forgotten")
        return outcome(info)

    async def cancel(self, jid: str, *, queue: str | None = None) -> bool:
        """Cancel task ``jid``: True if this call cancelled it, False if it had finished or is unknown.

        A waiting task leaves its queue; a running one stops being current at
        once (its ack and fenced writes are refused) and its consumer cancels
        its coroutine as soon as the published cancel reaches it. Its record,
        if it has one, says ``cancelled``. A task without a record is looked for
        in every known queue (pass ``queue`` to look in one), by a scan whose
        cost grows with the queue's length.
        """
        return await cancel_job(self.redis, self.keys, jid, queue, self.settings["keep_finished"])

    async def queues(self) -> list[str]:
        """Every queue name ever used with this prefix."""
        return await known_queues(self.redis, self.keys)

    async def stats(self) -> QueueStats:
        """Counters summed over every queue."""
        total = QueueStats()
        queues = await self.queues()
        with translated():
            pipe = self.redis.pipeline(transaction=False)
            for q in queues:
                pipe.hgetall(self.keys.queue(q).stats)
            for raw in await pipe.execute():
                total = total + QueueStats.from_hash(raw)
        return total


async def _one(link: Link, call: Any) -> Any:
    """One call's reply, or its error in the reply's place (as a pipeline gives it)."""
    try:
        return await link.call(call)
    except StoreError:
        raise  # the connection: nothing of the batch is known to have run
    except FenceKitError as exc:
        return exc


def _delay_ms(delay: float | timedelta | None, at: datetime | None = None) -> int:
    if at is not None:
        if delay is not None:
            raise ConfigError("give enqueue either delay= or at=, not both")
        if not isinstance(at, datetime):
            raise ConfigError(f"at must be a timezone-aware datetime, got {at!r}")
        try:
            due = unix_ms(at, "at")
        except PayloadError as exc:
            raise ConfigError(str(exc)) from None
        # The producer's clock: the script adds the delay to Redis's own clock.
        return max(0, due - time.time_ns() // 1_000_000)
    if delay is None:
        return 0
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
        raise ConfigError(f"delay must be a non-negative number of seconds or a timedelta, got {delay!r}")
    return round(seconds * 1000)
