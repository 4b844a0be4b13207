"""Inspecting a queue: the ``Queue`` handle, its counters, scheduled tasks and dead letters.

``client.queue(name)`` returns a :class:`Queue` with the per-queue operations
of the kickdown API (``pending``, ``length``, ``scheduled``, ``stats``,
``purge``, ``schedule``) plus fencekit's dead-letter record (``dead_letters``, ``revive``)
and the failures it keeps (``failed``, ``retry_failed``). The operations over
all of them (``revive_all``, ``purge_dead``, ``retry_failed()``) run in
pipelined batches (:mod:`fencekit.queue.bulk`).
Every read goes to the keys of ``fencekit._redis.keys``; nothing is cached.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

import orjson
import redis.asyncio

from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace, is_jid, validate_queue
from fencekit._redis.run import arun, as_text, translated
from fencekit.errors import ConfigError, PayloadError
from fencekit.queue import bulk, codec
from fencekit.queue.history import History, read_history
from fencekit.queue.records import JobInfo, parse
from fencekit.queue.task import Task

if TYPE_CHECKING:
    from fencekit.queue.client import Client

__all__ = ["DeadLetter", "Queue", "QueueStats", "ScheduledTask"]


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Cumulative counters of one queue (or of all queues, summed).

    ``processed`` counts tasks whose worker completed (each task once:
    invariant I6 of ``docs/design.md``); ``failed`` tasks permanently dropped (retries exhausted, no worker,
    malformed); ``dead`` the failed ones kept as dead letters; ``fenced_out``
    settlements refused because the delivery was stale; ``retried`` attempts
    scheduled again (after an exception, a timeout or a crash); ``expired``
    tasks dropped unrun because their ``expires`` time had passed; ``deduped``
    enqueues that returned the jid of the task holding their ``unique_key``;
    ``cancelled`` tasks a client's ``cancel()`` took out (waiting or running).
    """

    processed: int = 0
    failed: int = 0
    fenced_out: int = 0
    dead: int = 0
    retried: int = 0
    enqueued: int = 0
    purged: int = 0
    revived: int = 0
    expired: int = 0
    deduped: int = 0
    cancelled: int = 0

    @classmethod
    def from_hash(cls, raw: dict[Any, Any]) -> QueueStats:
        values = {as_text(k): v for k, v in raw.items()}
        return cls(**{f.name: _int(values.get(f.name)) for f in fields(cls)})

    def __add__(self, other: QueueStats) -> QueueStats:
        return QueueStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


@dataclass(slots=True)
class ScheduledTask(Task):
    """A task waiting in the scheduled set, with when it is due (Unix seconds)."""

    due_at: float = 0.0


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A task kept for an operator: why it failed, and its payload as stored."""

    id: str
    queue: str
    reason: str
    raw: bytes
    at: float
    jid: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Queue:
    """Operations on one queue; get one from :meth:`Client.queue`."""

    def __init__(
        self, client: redis.asyncio.Redis, keys: KeySpace, name: str, *, producer: Client | None = None
    ) -> None:
        self.name = validate_queue(name)
        self._client = client
        self._keys = keys
        self._qk = keys.queue(name)
        self._producer = producer

    async def schedule(self, task: Task, run_at: datetime) -> str:
        """Enqueue ``task`` (of this queue) to start at ``run_at``, an aware datetime; returns its jid.

        The kickdown 0.5 spelling of ``client.enqueue(task, at=run_at)``.
        """
        if self._producer is None:
            raise ConfigError(f"this handle of {self.name!r} cannot enqueue: get it from Client.queue()")
        if task.queue != self.name:
            raise ConfigError(f"task of queue {task.queue!r} scheduled through the handle of {self.name!r}")
        return await self._producer.enqueue(task, at=run_at)

    async def pending(self) -> list[Task]:
        """Tasks waiting to be claimed, oldest first (non-destructive).

        Entries that are not valid envelopes are left out here (they are
        counted by :meth:`length` and dead-lettered when claimed).
        """
        with translated():
            raws = await self._client.lrange(self._qk.pending, 0, -1)
        tasks = []
        for raw in reversed(raws):
            try:
                tasks.append(Task.from_envelope(codec.decode(raw)))
            except PayloadError:
                continue
        return tasks

    async def length(self) -> int:
        """How many tasks are physically waiting in the queue."""
        with translated():
            return int(await self._client.llen(self._qk.pending))

    async def scheduled(self, limit: int | None = None) -> list[ScheduledTask]:
        """Tasks waiting for a retry delay (or a delayed start), earliest first (the first ``limit``)."""
        with translated():
            end = -1 if limit is None else max(0, limit - 1)
            entries = await self._client.zrange(self._qk.scheduled, 0, end, withscores=True)
        out = []
        for raw, score in cast("list[tuple[bytes, float]]", entries):
            try:
                env = codec.decode(raw)
            except PayloadError:
                continue
            task = Task.from_envelope(env)
            out.append(
                ScheduledTask(
                    task.queue,
                    task.operation,
                    task.params,
                    task.jid,
                    task.attempt,
                    timeout=task.timeout,
                    expires=task.expires,
                    due_at=score / 1000,
                )
            )
        return out

    async def stats(self) -> QueueStats:
        """The queue's cumulative counters."""
        with translated():
            return QueueStats.from_hash(await self._client.hgetall(self._qk.stats))

    async def history(self, window: str = "1h") -> History:
        """What each minute of ``window`` saw (``"1h"``, ``"24h"``, ``"48h"``; ``"90d"``: each hour).

        The buckets the ``Server`` or pool supervisor book every few seconds
        (:mod:`fencekit.queue.history`); ConfigError for another window.
        """
        return await read_history(self._client, self._keys, [self.name], window)

    async def purge(self) -> int:
        """Drop every waiting task (not scheduled ones, not counters); return how many."""
        call = scripts.purge(pending=self._qk.pending, stats=self._qk.stats, record_prefix=self._qk.job(""))
        return int(await arun(self._client, call))

    async def in_flight(self) -> int:
        """How many tasks of this queue registered consumers are running now."""
        with translated():
            consumers = await self._client.hkeys(self._keys.consumers)
            pipe = self._client.pipeline(transaction=False)
            for cid in consumers:
                pipe.hlen(self._qk.inflight(as_text(cid)))
            return sum(int(n) for n in await pipe.execute())

    async def dead_letters(self, limit: int = 50) -> list[DeadLetter]:
        """The newest dead letters first, with their reasons."""
        with translated():
            raw_ids = await self._client.zrevrange(self._qk.dead_index, 0, limit - 1)
            ids = [as_text(i) for i in cast("list[bytes | str]", raw_ids)]
            if not ids:
                return []
            values = await self._client.hmget(self._qk.dead, [x for i in ids for x in (i, f"{i}:why")])
        letters = []
        for n, dead_id in enumerate(ids):
            raw, why = values[2 * n], values[2 * n + 1]
            if raw is None:
                continue
            try:
                meta = orjson.loads(why) if why else {}
            except orjson.JSONDecodeError:
                meta = {}
            letters.append(
                DeadLetter(
                    id=dead_id,
                    queue=self.name,
                    reason=str(meta.get("reason", "")),
                    raw=raw.encode() if isinstance(raw, str) else raw,
                    at=float(meta.get("at", 0)) / 1000,
                    jid=meta.get("jid"),
                    extra={k: v for k, v in meta.items() if k not in ("reason", "jid", "at")},
                )
            )
        return letters

    async def dead_count(self) -> int:
        with translated():
            return int(await self._client.zcard(self._qk.dead_index))

    async def run_now(self, jid: str) -> bool:
        """Start scheduled task ``jid`` now (at the head of the queue); False if none has that jid."""
        qk = self._qk
        call = scripts.run_now(
            scheduled=qk.scheduled, pending=qk.pending, wake=qk.wake, record=qk.job(jid), jid=jid
        )
        return bool(await arun(self._client, call))

    async def failed(self, limit: int = 50) -> list[JobInfo]:
        """The tasks kept after they failed for good, newest first, with their errors."""
        with translated():
            keys = [
                as_text(k)
                for k in cast("list[bytes]", await self._client.lrange(self._qk.failed, 0, limit - 1))
            ]
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.hgetall(key)
            hashes = await pipe.execute()
        out = []
        prefix = len(self._qk.job(""))
        for key, values in zip(keys, hashes):
            flat = [x for pair in values.items() for x in pair]
            info = parse(key[prefix:], self.name, (flat, 0, ""))
            if info is not None:
                out.append(info)
        return out

    async def failed_count(self) -> int:
        with translated():
            return int(await self._client.llen(self._qk.failed))

    async def retry_failed(self, jid: str | None = None) -> int:
        """Run kept failures again from attempt 0: task ``jid``, or every one (``None``); returns how many.

        The new attempt keeps a record for the producer's retention of the
        first one (else the client's ``keep_result``).
        """
        if jid is None:
            return await self.retry_all_failed()
        qk = self._qk
        record = qk.job(jid)
        with translated():
            raw = await self._client.hget(record, "env")
        if raw is None:
            return 0
        try:
            envelope = codec.decode(raw)
        except PayloadError:
            return 0
        keep = envelope.keep if envelope.keep is not None else (self._default_keep_ms() or None)
        fresh = envelope._replace(attempt=0, keep=keep).encode()
        call = scripts.failed_retry(
            failed=qk.failed,
            record=record,
            pending=qk.pending,
            stats=qk.stats,
            wake=qk.wake,
            envelope=fresh,
            keep_ms=keep or 0,
        )
        return int(await arun(self._client, call))

    async def retry_all_failed(
        self, *, batch: int = bulk.DEFAULT_BATCH, progress: bulk.Progress | None = None
    ) -> int:
        """:meth:`retry_failed` of every kept failure, in pipelined batches; returns how many.

        ``progress(handled, total)`` is called after each batch.
        """
        return await bulk.retry_all_failed(
            self._client, self._qk, default_keep_ms=self._default_keep_ms(), batch=batch, progress=progress
        )

    def _default_keep_ms(self) -> int:
        """The producer's ``keep_result`` in ms (0 without a producer, or with no records)."""
        return round(self._producer.keep_result * 1000) if self._producer is not None else 0

    async def revive_all(
        self, *, batch: int = bulk.DEFAULT_BATCH, progress: bulk.Progress | None = None
    ) -> int:
        """Enqueue every dead letter again as stored, oldest first, in pipelined batches; returns how many.

        Letters that die while it runs are left for the next run.
        ``progress(handled, total)`` is called after each batch.
        """
        return await bulk.revive_all(self._client, self._qk, batch=batch, progress=progress)

    async def purge_dead(self) -> int:
        """Drop every dead letter (the counters are kept); returns how many there were."""
        return await bulk.purge_dead(self._client, self._qk)

    async def revive(self, dead_id: str, task: Task | None = None) -> bool:
        """Enqueue a dead letter again (as stored, or as ``task``); False if it is gone."""
        envelope = task.envelope() if task is not None else b""
        qk = self._qk
        with translated():
            stored = await self._client.hget(qk.dead, dead_id)
        jid = task.jid if task is not None else (codec.peek_jid(stored) if stored is not None else None)
        call = scripts.dead_revive(
            dead=qk.dead,
            dead_index=qk.dead_index,
            pending=qk.pending,
            stats=qk.stats,
            wake=qk.wake,
            dead_id=dead_id,
            envelope=envelope,
            record=qk.job(jid) if is_jid(jid) else None,
        )
        return bool(await arun(self._client, call))
