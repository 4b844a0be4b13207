"""Producers: ``Client`` enqueues tasks and opens :class:`~fencekit.produce.handle.Queue` handles.

``Client.enqueue(task)`` validates and encodes the task, then runs
``enqueue.lua`` (one round trip; the first enqueue to a queue also records
the queue's name in the registry). ``enqueue_many`` sends every task in one
round trip, one script call per queue. A client that owns its connection
enqueues over the lean hot-path connection; one given a redis-py client
(``Client(redis=...)``, as a consumer's jobs get) uses that.

A task keeps a record while ``keep_result`` (the task's, else the
client's) is above 0: ``client.job(jid)`` reads it and ``client.result(jid)``
waits for it (:mod:`fencekit.produce._results`).

The rules -- encoding, the enqueue plan, records, cancel, the result wait,
the queue handle's reads -- are steps shared with the synchronous
:class:`~fencekit.produce.sync_client.SyncClient` (:mod:`fencekit.produce._producer`,
:mod:`fencekit._redis.steps`); this class drives them on asyncio, its
enqueues through a :class:`~fencekit.produce._batching.Coalescer`.

Settings (``prefix``, ``max_payload``, ``durable_replicas``,
``durable_timeout``, ``keep_result`` and the URL) are those of
:mod:`fencekit.settings`: an argument, else ``FENCEKIT_<NAME>``, else the
default.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar

import redis.asyncio
from typing_extensions import Unpack

from fencekit._redis.clients import aclose_client, async_client, watch_of
from fencekit._redis.link import Link, open_link, wait_replicas
from fencekit._redis.steps import Batch, Steps, adrive, arun_batch
from fencekit.errors import FenceKitError, StoreError
from fencekit.hooks import FenceKitHooks
from fencekit.jobs._registry import known_queues
from fencekit.jobs.records import JobInfo
from fencekit.jobs.task import Task
from fencekit.produce import _batch_steps as batch_steps
from fencekit.produce import _dep_steps as dep_steps
from fencekit.produce import _handle_steps as handle_steps
from fencekit.produce._batching import Coalescer
from fencekit.produce._enqueue import Enqueued
from fencekit.produce._producer import Producer, Send, delay_ms, first_error
from fencekit.produce._results import Pause, ResultWaiter, Subscribe, cancel_job, read_job, result_steps
from fencekit.produce.batch import BatchInfo, BatchOpening, Chain
from fencekit.produce.handle import Queue, QueueStats
from fencekit.produce.schedules import ScheduleInfo, schedules_steps
from fencekit.settings import ClientOptions, ClientSettings, resolve, resolve_connecting, table, with_url

__all__ = ["READ_CONCURRENCY", "Client"]

T = TypeVar("T")

_Enqueue = tuple[list[Task], list[bytes], int]  # a Send's fields (a NamedTuple is slower to build per call)

READ_CONCURRENCY = 32
"""Record reads (``job``, ``result``) one client runs at once; more wait their turn."""


class Client(Producer):
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
        settings: ClientSettings = (
            resolve_connecting(ClientSettings, redis_url, options, "Client")
            if redis is None
            else resolve(ClientSettings, with_url(redis_url, options), owner="Client")
        )
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
        self._set_up_producer(settings, hooks)
        self.redis = redis if redis is not None else async_client(self.target)
        self._owns_redis = redis is None
        self._lean: Link | None = None  # enqueues of a client that owns its connection go here
        self._lean_opening: asyncio.Lock | None = None
        self._waiter: ResultWaiter | None = None
        # redis-py's pool refuses a connection past its size (100) instead of waiting: many
        # concurrent job()/result() calls share a few connections through this.
        self._reads = asyncio.Semaphore(READ_CONCURRENCY)
        self._batcher: Coalescer[_Enqueue, list[Enqueued]] = Coalescer(self._send, "fencekit-enqueue-batch")

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
        self._accepted(jid, task)
        return jid

    async def enqueue_many(
        self, tasks: Iterable[Task], *, delay: float | timedelta | None = None, at: datetime | None = None
    ) -> list[str]:
        """Accept many tasks in one round trip; all are validated before any is sent.

        A task with a ``unique_key`` whose key is held gets the holder's jid.
        """
        return [e.jid for e in await self._enqueue(list(tasks), delay_ms(delay, at))]

    async def enqueue_unique(
        self, task: Task, *, delay: float | timedelta | None = None, at: datetime | None = None
    ) -> Enqueued:
        """Enqueue ``task`` unless its ``unique_key`` is held: ``Enqueued(jid, created)``.

        A duplicate gets the jid of the task that holds the key (so
        ``client.result(jid)`` is that task's result), and ``created`` False.
        """
        self._check_unique(task)
        (enqueued,) = await self._enqueue([task], delay_ms(delay, at))
        return enqueued

    async def _enqueue(self, tasks: list[Task], delay_ms: int) -> list[Enqueued]:
        if not tasks:
            return []
        for task in tasks:
            if task.depends_on is not None:  # held for its parents (docs/guides/batches.md)
                return await self._drive_enqueuing(dep_steps.enqueue_any_steps(self, tasks, delay_ms))
        if self.hooks is not None:  # the steps' finally tells the hooks, also of a failure
            return await adrive(self.redis, self.enqueue_steps(tasks, delay_ms), self._enqueue_request)
        # The hot path: the three steps of Producer.enqueue_steps, inline (no generator per call).
        envelopes, new = self.prepare(tasks)
        if new:
            await adrive(self.redis, self.register(new))
        return await self._batcher.submit((tasks, envelopes, delay_ms))

    async def _enqueue_request(self, request: Batch | Send) -> Any:
        """A :class:`Send` joins the coalescer (:mod:`fencekit.produce._batching`); a batch: redis-py."""
        if isinstance(request, Send):
            return await self._batcher.submit(request)
        return await arun_batch(self.redis, request)

    async def _send(self, batch: list[_Enqueue]) -> list[list[Enqueued] | BaseException]:
        """Send the enqueues of one batch (:mod:`fencekit.produce._batching`): one plan per delay."""
        out: list[list[Enqueued] | BaseException] = [[] for _ in batch]
        by_delay: dict[int, list[int]] = {}
        for k, (_, _, wait_ms) in enumerate(batch):
            by_delay.setdefault(wait_ms, []).append(k)
        for delay, ks in by_delay.items():
            tasks = [task for k in ks for task in batch[k][0]]
            envelopes = [envelope for k in ks for envelope in batch[k][1]]
            try:  # Producer.send_steps, inline (the hot path)
                plan, request = self.plan(tasks, envelopes, delay)
                if self._owns_redis:  # the lean connection; its WAIT after the scripts (which cannot wait)
                    link = await self._link()
                    calls = plan.calls
                    replies = await link.pipeline(calls) if len(calls) > 1 else [await _one(link, calls[0])]
                    if request.wait is not None:
                        replies.append(await wait_replicas(link, request.wait))
                else:
                    replies = await arun_batch(self.redis, request)
                outcomes = self.outcomes(plan, tasks, replies)
            except Exception as exc:
                for k in ks:
                    out[k] = exc
                continue
            start = 0
            for k in ks:
                mine = outcomes[start : start + len(batch[k][0])]
                start += len(mine)
                out[k] = first_error(mine)
        return out

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
        watched: list[tuple[ResultWaiter, str, asyncio.Event]] = []

        async def answer(request: Any) -> Any:
            if isinstance(request, Batch):
                for _, _, event in watched:
                    event.clear()  # a wake-up before this read is answered by the read
                async with self._reads:
                    return await arun_batch(self.redis, request)
            if isinstance(request, Subscribe):
                if self._waiter is None:
                    self._waiter = ResultWaiter(self.redis, self.keys, self.logger)
                watched.append(
                    (self._waiter, request.queue, await self._waiter.watch(request.queue, request.jid))
                )
                return None
            assert isinstance(request, Pause)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(watched[0][2].wait(), request.seconds)
            return None

        try:
            return await adrive(self.redis, result_steps(self.keys, jid, queue, timeout, loop.time), answer)
        finally:
            for waiter, found, event in watched:
                waiter.unwatch(found, jid, event)

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

    # batches (docs/guides/batches.md) ---------------------------------------

    def batch(
        self,
        tasks: Iterable[Task] = (),
        *,
        on_complete: Task | None = None,
        on_success: Task | None = None,
        on_failure: Task | None = None,
        keep: float | None = None,
    ) -> BatchOpening:
        """Enqueue ``tasks`` as one batch whose callbacks run exactly once.

        ``await client.batch(...)`` returns the armed :class:`~fencekit.produce.batch.Batch`;
        ``async with client.batch(...) as b:`` keeps it open for ``await b.add(task)``
        and arms it when the block ends (a block that raises cancels it). ``on_complete``
        runs once every child is final whatever the outcome, ``on_success`` once if
        all succeeded, ``on_failure`` once if any failed for good. Each child is
        counted once, by the settle of its current delivery. ``keep``: seconds the
        finished batch stays readable (default a day). Children may live on any
        queues; each keeps a record (an hour unless it says longer) and may not have
        a ``unique_key``.
        """
        callbacks = {"complete": on_complete, "success": on_success, "failure": on_failure}
        return BatchOpening(self, list(tasks), callbacks, keep=keep)

    async def chain(self, tasks: Iterable[Task]) -> Chain:
        """Enqueue ``tasks`` so that each starts once the one before succeeded (it reads that
        one's result in ``current_job().parent_results``); a link that fails for good or is
        cancelled cancels the rest. Returns the :class:`~fencekit.produce.batch.Chain`."""
        tasks = list(tasks)
        jids = await self._drive_enqueuing(dep_steps.chain_steps(self, tasks))
        return Chain(self, jids, [t.queue for t in tasks])

    async def batch_info(self, bid: str) -> BatchInfo | None:
        """Where batch ``bid`` is (:class:`~fencekit.jobs.batches.BatchInfo`), None when unknown."""
        return await self._drive(batch_steps.info_steps(self.keys, bid))

    async def batch_results(self, bid: str) -> dict[str, Any]:
        """The results of batch ``bid``'s children that succeeded and still keep a record, by jid
        (in jid order: enqueue order for generated jids)."""
        return await self._drive(batch_steps.results_steps(self.keys, bid))

    async def _drive(self, steps: Steps[T]) -> T:
        return await adrive(self.redis, steps)

    async def _drive_enqueuing(self, steps: Steps[T]) -> T:
        """Steps that enqueue (a :class:`Send`) as well as read."""
        return await adrive(self.redis, steps, self._enqueue_request)

    async def queues(self) -> list[str]:
        """Every queue name ever used with this prefix."""
        return await known_queues(self.redis, self.keys)

    async def stats(self) -> QueueStats:
        """Counters summed over every queue."""
        return await adrive(self.redis, handle_steps.total_stats(self.keys))

    async def schedules(self) -> list[ScheduleInfo]:
        """The periodic schedules the running processes registered, with their last and next run."""
        return await adrive(self.redis, schedules_steps(self.keys, time.time_ns() // 1_000_000))


async def _one(link: Link, call: Any) -> Any:
    """One call's reply, or its error in the reply's place (as a pipeline gives it)."""
    try:
        return await link.call(call)
    except StoreError:
        raise  # the connection: nothing of the batch is known to have run
    except FenceKitError as exc:
        return exc
