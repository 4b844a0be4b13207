"""What the web pages show: one read of Redis turned into a :class:`Snapshot`.

:class:`AdminSource` is the only part of the web layer that talks to Redis.
It reads the same keys the queue uses (``keys.py``) through an asyncio
redis-py client, in three pipelined round trips (batches of
:mod:`fencekit._redis.steps`, so on a Redis Cluster each node's share of a
read is one pipeline of its own), so ``/admin`` and ``/metrics`` show
exactly what ``Client``/``Queue`` would report:

1. the registry: known and paused queues, registered consumers with their info,
   their last beats, and Redis's own clock (beat ages are measured on the clock
   that wrote them, so host clock skew does not make consumers look dead);
2. per queue: counters, the backlog (pending, due, oldest: ``backlog.lua``), scheduled and
   dead-letter counts, and per consumer the size of its in-flight hash for each queue it polls;
3. the newest dead letters of the queues that have any, and the periodic
   schedules registered in the known queues (``queue.schedules``).

Consumers are read as :class:`~fencekit.jobs._registry.ConsumerRecord` values,
the record their heartbeats write (one parser for the reaper and the pages).
Two things live outside Redis and are handed in by whoever hosts the web
app: pool children (a callable the supervisor provides, returning
:class:`ChildView` records, or None when there is no pool), the host's
periodic loops (a callable returning :class:`LoopView` records) and job durations: a
:class:`DurationHistogram` the host feeds with :meth:`DurationHistogram.observe`,
or a callable called at every read that returns the current histogram (the
server's consumer's own, or one the pool sums from its children's bucket
counts with :meth:`DurationHistogram.from_counts`).

:meth:`AdminSource.ready` answers the readiness probe with a PING bounded by
its own short timeout, so ``/ready`` stays fast while Redis hangs (SIGSTOP)
instead of waiting on a socket that never answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio
from redis.exceptions import RedisError

from fencekit._redis import scripts
from fencekit._redis.clients import aclose_client, async_client
from fencekit._redis.keys import DEFAULT_PREFIX, KeySpace, validate_queue
from fencekit._redis.run import as_text, translated
from fencekit._redis.steps import Batch, Op, adrive, arun_batch, cmd
from fencekit._redis.url import RedisTarget, parse_url
from fencekit.consume._settle import in_flight
from fencekit.errors import StoreError
from fencekit.jobs import codec
from fencekit.jobs._registry import ConsumerRecord, known_queues
from fencekit.jobs.histogram import DurationHistogram
from fencekit.jobs.history import History, HistoryBucket, read_histories
from fencekit.jobs.records import JobInfo
from fencekit.produce._batch_steps import cancel_steps
from fencekit.produce._results import cancel_job, read_job
from fencekit.produce.handle import DeadLetter, Queue, QueueStats, ScheduledTask
from fencekit.produce.schedules import schedules_steps
from fencekit.services.backlog import Backlog
from fencekit.settings import ClientSettings, defaults
from fencekit.web._batch_view import BatchView, bounded, count_open, read_batch
from fencekit.web._views import (
    BatchCounts,
    ChildView,
    ConsumerView,
    LoopView,
    QueueView,
    RunningView,
    Snapshot,
    consumer_view,
)
from fencekit.web.browse import Filter, Page, read_page

__all__ = [
    "AdminSource",
    "BatchCounts",
    "ChildView",
    "ConsumerView",
    "DurationHistogram",
    "LoopView",
    "QueueView",
    "Snapshot",
]

DEFAULT_READY_TIMEOUT = 0.5
DEFAULT_SNAPSHOT_TIMEOUT = 5.0
DEFAULT_DEAD_LETTERS = 20

ChildrenSource = Callable[[], "tuple[ChildView, ...] | None"]
LoopsSource = Callable[[], "tuple[LoopView, ...]"]
BatchCountsSource = Callable[[], BatchCounts]


class AdminSource:
    """Reads what /admin and /metrics show (see the module docstring).

    ``queues`` are the polled queues shown in the table; ``None`` shows every
    queue ever used with the prefix. The totals always cover every known
    queue, like ``Client.stats()``. The source does not own ``redis`` unless
    it was made by :meth:`from_url`.
    """

    desired_workers: Callable[[], int] | None = None  # set by the host (fencekit_desired_workers)

    def __init__(
        self,
        redis: redis.asyncio.Redis,
        keys: KeySpace,
        queues: Sequence[str] | None = None,
        *,
        children: ChildrenSource | None = None,
        durations: DurationHistogram | Callable[[], DurationHistogram] | None = None,
        loops: LoopsSource | None = None,
        batches: BatchCountsSource | None = None,
        target: RedisTarget | None = None,
        heartbeat_ttl: float = 30.0,
        dead_letter_limit: int = DEFAULT_DEAD_LETTERS,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        snapshot_timeout: float = DEFAULT_SNAPSHOT_TIMEOUT,
        logger: logging.Logger | None = None,
        keep_finished: int | None = None,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.queues: tuple[str, ...] | None = (
            tuple(validate_queue(q) for q in queues) if queues is not None else None
        )
        self.children = children
        self.loops = loops
        self.batches = batches
        if isinstance(durations, DurationHistogram):
            self.durations = durations
            self._fresh_durations: Callable[[], DurationHistogram] | None = None
        else:
            self.durations = DurationHistogram()
            self._fresh_durations = durations
        self.target = target
        self.heartbeat_ttl = heartbeat_ttl
        self.dead_letter_limit = dead_letter_limit
        self.ready_timeout = ready_timeout
        self.snapshot_timeout = snapshot_timeout
        self.logger = logger or logging.getLogger("fencekit.web")
        # the cap a cancel from the page applies to a queue's finished records
        self.keep_finished: int = (
            keep_finished if keep_finished is not None else defaults(ClientSettings)["keep_finished"]
        )
        self._owns_redis = False

    @classmethod
    def from_url(
        cls,
        redis_url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        queues: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> AdminSource:
        """A source with its own connection pool (closed by :meth:`aclose`), to mount the app elsewhere."""
        target = parse_url(redis_url)
        source = cls(async_client(target), KeySpace(prefix), queues, target=target, **kwargs)
        source._owns_redis = True
        return source

    async def aclose(self) -> None:
        """Close the connection pool if this source created it."""
        if self._owns_redis:
            await aclose_client(self.redis)

    @property
    def redis_display(self) -> str | None:
        """The Redis URL with passwords replaced by ``***`` (never the password)."""
        return self.target.redacted() if self.target is not None else None

    # probes ------------------------------------------------------------------
    async def ready(self) -> bool:
        """True if Redis answers PING within ``ready_timeout`` seconds."""
        try:
            return bool(await asyncio.wait_for(self.redis.ping(), self.ready_timeout))
        except (asyncio.TimeoutError, RedisError, OSError):
            return False

    # reads -------------------------------------------------------------------
    async def known_queues(self) -> list[str]:
        """The queues shown in the table: the polled ones, or every known one."""
        if self.queues is not None:
            return list(self.queues)
        return await known_queues(self.redis, self.keys)

    async def snapshot(self) -> Snapshot:
        """Read everything the pages show; raises :class:`StoreError` (also on timeout)."""
        self.feed_durations()
        try:
            return await asyncio.wait_for(self._read(), self.snapshot_timeout)
        except asyncio.TimeoutError:
            raise StoreError(f"Redis did not answer within {self.snapshot_timeout:g}s") from None

    def feed_durations(self) -> None:
        """Replace :attr:`durations` with what the ``durations`` callable returns, if one was given."""
        if self._fresh_durations is not None:
            self.durations = self._fresh_durations()

    def loop_health(self) -> tuple[LoopView, ...]:
        """The host's periodic loops: name, rounds run, unexpected errors, alive (empty if none)."""
        return self.loops() if self.loops is not None else ()

    def batch_counts(self) -> BatchCounts | None:
        """What the host's batch loops did (None: the host runs none, as a mounted app)."""
        return self.batches() if self.batches is not None else None

    async def open_batches(self) -> int:
        """How many batches are not finished (the reconciler's index); raises StoreError (on timeout too)."""
        return await bounded(count_open(self.redis, self.keys), self.snapshot_timeout)

    def pool_children(self) -> tuple[ChildView, ...] | None:
        """The supervisor's children, or None when there is no pool."""
        return self.children() if self.children is not None else None

    async def _read(self) -> Snapshot:
        keys = self.keys
        known_raw, consumers_raw, beats_raw, (now_s, now_us), paused_raw = await arun_batch(
            self.redis,
            Batch(
                (
                    cmd("smembers", keys.queues),
                    cmd("hgetall", keys.consumers),
                    cmd("zrange", keys.beats, 0, -1, withscores=True),
                    cmd("time"),
                    cmd("smembers", keys.paused),
                )
            ),
        )
        known, paused = {as_text(q) for q in known_raw}, {as_text(q) for q in paused_raw}
        shown = list(self.queues) if self.queues is not None else sorted(known)
        every = sorted(known | set(shown))
        now_ms = int(now_s) * 1000 + int(now_us) // 1000
        beats = {as_text(cid): float(score) for cid, score in beats_raw}
        records = {
            as_text(cid): ConsumerRecord.from_json(as_text(cid), raw) for cid, raw in consumers_raw.items()
        }
        consumer_ids = sorted(set(records) | set(beats))

        ops: list[Op] = [cmd("hgetall", keys.queue(q).stats) for q in every]
        for q in shown:
            qk = keys.queue(q)
            ops.append(scripts.backlog(pending=qk.pending, scheduled=qk.scheduled))  # every list, due, oldest
            ops.append(cmd("zcard", qk.scheduled))
            ops.append(cmd("zcard", qk.dead_index))
        slots: list[tuple[str, str]] = []
        for cid in consumer_ids:
            record = records.get(cid)
            polled = record.queues if record is not None and record.queues is not None else shown
            for q in polled:
                slots.append((cid, q))
                ops.append(cmd("hlen", keys.queue(q).inflight(cid)))
        replies = await arun_batch(self.redis, Batch(ops))

        stats = {q: QueueStats.from_hash(replies[i]) for i, q in enumerate(every)}
        at = len(every)
        counts: dict[str, tuple[Backlog, int, int]] = {}
        for q in shown:
            counts[q] = (Backlog.from_reply(replies[at]), int(replies[at + 1]), int(replies[at + 2]))
            at += 3
        queue_inflight = dict.fromkeys(shown, 0)
        consumer_inflight = dict.fromkeys(consumer_ids, 0)
        for (cid, q), n in zip(slots, replies[at:]):
            consumer_inflight[cid] += int(n)
            if q in queue_inflight:
                queue_inflight[q] += int(n)

        totals = QueueStats()
        for s in stats.values():
            totals = totals + s
        views = tuple(
            QueueView(q, stats[q], c[0].pending, c[1], queue_inflight[q], c[2], q in paused, c[0])
            for q, c in counts.items()
        )
        consumers = tuple(
            consumer_view(
                records.get(cid) or ConsumerRecord.from_json(cid, None),
                beats.get(cid),
                now_ms,
                consumer_inflight[cid],
                self.heartbeat_ttl,
            )
            for cid in consumer_ids
        )
        letters = await self._latest_dead([v.name for v in views if v.dead_letters])
        failed = await self._latest_failed([v.name for v in views if v.stats.failed])
        busy = [(cid, q) for (cid, q), n in zip(slots, replies[at:]) if int(n)]
        running = await self._running(busy, now_ms)
        scheduled = await self._soonest([v.name for v in views if v.scheduled])
        schedules = await adrive(self.redis, schedules_steps(keys, now_ms, every))
        return Snapshot(
            schedules=tuple(schedules),
            failed=failed,
            running=running,
            scheduled=scheduled,
            queues=views,
            totals=totals,
            consumers=consumers,
            dead_letters=letters,
            children=self.pool_children(),
            durations=self.durations,
            taken_at=now_ms / 1000,
        )

    async def _latest_dead(self, queues: Sequence[str]) -> tuple[DeadLetter, ...]:
        limit = self.dead_letter_limit
        if not queues or limit <= 0:
            return ()
        per_queue = await asyncio.gather(*(self.queue(q).dead_letters(limit) for q in queues))
        merged = sorted((d for letters in per_queue for d in letters), key=lambda d: d.at, reverse=True)
        return tuple(merged[:limit])

    async def _latest_failed(self, queues: Sequence[str]) -> tuple[JobInfo, ...]:
        limit = self.dead_letter_limit
        if not queues or limit <= 0:
            return ()
        per_queue = await asyncio.gather(*(self.queue(q).failed(limit) for q in queues))
        merged = sorted(
            (f for kept in per_queue for f in kept), key=lambda f: f.finished_at or 0.0, reverse=True
        )
        return tuple(merged[:limit])

    async def _running(self, busy: Sequence[tuple[str, str]], now_ms: int) -> tuple[RunningView, ...]:
        """The tasks in the in-flight hashes of ``busy`` (consumer, queue) pairs, longest first."""
        if not busy:
            return ()
        hashes = await arun_batch(
            self.redis, Batch([cmd("hgetall", self.keys.queue(q).inflight(cid)) for cid, q in busy])
        )
        rows = []
        for (cid, q), entries in zip(busy, hashes):
            for d in in_flight(entries):
                runtime = max(0.0, now_ms / 1000 - d.token / 1_000_000)
                rows.append(
                    RunningView(
                        q, d.jid, d.operation, codec.run_number(d.attempt), cid, d.token, runtime, d.recorded
                    )
                )
        rows.sort(key=lambda v: v.runtime, reverse=True)
        return tuple(rows[: self.dead_letter_limit])

    async def _soonest(self, queues: Sequence[str]) -> tuple[ScheduledTask, ...]:
        limit = self.dead_letter_limit
        if not queues or limit <= 0:
            return ()
        per_queue = await asyncio.gather(*(self.queue(q).scheduled(limit) for q in queues))
        merged = sorted((t for tasks in per_queue for t in tasks), key=lambda t: t.due_at)
        return tuple(merged[:limit])

    async def history(
        self, queue: str | None = None, window: str = "1h"
    ) -> tuple[History, dict[str, History]]:
        """The history of ``queue`` (None: every queue shown, summed) over ``window``, and per queue.

        Raises ConfigError for an unknown window, StoreError when Redis fails or does not
        answer within ``snapshot_timeout`` (as :meth:`snapshot`).
        """

        async def read() -> dict[str, History]:
            queues = [queue] if queue is not None else await self.known_queues()
            return await read_histories(self.redis, self.keys, queues, window)

        try:
            per_queue = await asyncio.wait_for(read(), self.snapshot_timeout)
        except asyncio.TimeoutError:
            raise StoreError(f"Redis did not answer within {self.snapshot_timeout:g}s") from None
        return History.combine(per_queue, window), per_queue

    async def last_minute(self) -> dict[str, HistoryBucket]:
        """Per queue shown, the newest complete minute's bucket (queues with none are absent)."""
        _, per_queue = await self.history(None, "1h")
        out: dict[str, HistoryBucket] = {}
        for queue, history in per_queue.items():
            previous = history.end - 2 * history.step  # the current minute is still being booked
            for bucket in reversed(history.buckets):
                if bucket.at == previous:
                    out[queue] = bucket
        return out

    async def browse(self, queue: str, which: str, number: int, where: Filter) -> Page:
        """Page ``number`` of list ``which`` of ``queue`` (:mod:`fencekit.web.browse`), bounded by
        ``snapshot_timeout``; ValueError for a bad list or page, StoreError when Redis fails."""
        try:
            return await asyncio.wait_for(
                read_page(self.redis, self.keys, queue, which, number, where), self.snapshot_timeout
            )
        except asyncio.TimeoutError:
            raise StoreError(f"Redis did not answer within {self.snapshot_timeout:g}s") from None

    async def job(self, jid: str) -> JobInfo | None:
        """The record of task ``jid`` in any known queue (None: no record)."""
        return await read_job(self.redis, self.keys, jid)

    async def cancel(self, jid: str, queue: str) -> bool:
        """Cancel task ``jid`` of ``queue`` (as ``Client.cancel``)."""
        return await cancel_job(self.redis, self.keys, jid, queue, self.keep_finished)

    async def batch(self, bid: str) -> BatchView | None:
        """Batch ``bid`` and its children by state (:mod:`fencekit.web._batch_view`; None: unknown)."""
        return await bounded(read_batch(self.redis, self.keys, bid), self.snapshot_timeout)

    async def cancel_batch(self, bid: str) -> int:
        """Cancel batch ``bid``'s children not final yet (as ``Batch.cancel``); ConfigError if unknown."""
        return await adrive(self.redis, cancel_steps(self.keys, bid, self.keep_finished))

    # actions -----------------------------------------------------------------
    def queue(self, name: str) -> Queue:
        """The ``Queue`` handle of ``name`` on this source's connection."""
        return Queue(self.redis, self.keys, name)

    async def is_known(self, name: str) -> bool:
        """True if ``name`` is a queue the pages may act on (shown, or known to the registry)."""
        if self.queues is not None and name in self.queues:
            return True
        with translated():
            return bool(await self.redis.sismember(self.keys.queues, name))
