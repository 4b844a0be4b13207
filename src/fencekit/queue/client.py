"""Producers and inspection: ``Client``, the ``Queue`` handle, counters.

``Client.enqueue(task)`` validates and encodes the task, then runs
``enqueue.lua`` (one round trip; the first enqueue to a queue also records
the queue's name in the registry, pipelined with it). ``enqueue_many`` sends
every task in one round trip, one script call per queue.

``client.queue(name)`` returns a :class:`Queue` handle with the per-queue
operations of the kickdown API (``pending``, ``length``, ``scheduled``,
``stats``, ``purge``) plus fencekit's dead-letter record.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import timedelta
from types import TracebackType
from typing import Any, cast

import orjson
import redis.asyncio

from fencekit._redis import scripts
from fencekit._redis.keys import DEFAULT_PREFIX, KeySpace, validate_queue
from fencekit._redis.link import Link, open_link
from fencekit._redis.store import (
    DEFAULT_URL,
    aclose_client,
    apipeline,
    arun,
    as_text,
    async_client,
    parse_url,
    translated,
)
from fencekit.errors import ConfigError, DurabilityError, PayloadError
from fencekit.queue import codec
from fencekit.queue.task import Task


def default_logger(name: str) -> logging.Logger:
    """A logger that writes text to stdout unless the application configured logging."""
    logger = logging.getLogger(name)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Cumulative counters of one queue (or of all queues, summed).

    ``processed`` counts tasks whose worker completed (each task once, DESIGN
    I6); ``failed`` tasks permanently dropped (retries exhausted, no worker,
    malformed); ``dead`` the failed ones kept as dead letters; ``fenced_out``
    settlements refused because the delivery was stale; ``retried`` attempts
    scheduled again (after an exception or a crash).
    """

    processed: int = 0
    failed: int = 0
    fenced_out: int = 0
    dead: int = 0
    retried: int = 0
    enqueued: int = 0
    purged: int = 0
    revived: int = 0

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

    def __init__(self, client: redis.asyncio.Redis, keys: KeySpace, name: str) -> None:
        self.name = validate_queue(name)
        self._client = client
        self._keys = keys
        self._qk = keys.queue(name)

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

    async def scheduled(self) -> list[ScheduledTask]:
        """Tasks waiting for a retry delay (or a delayed start), earliest first."""
        with translated():
            entries = await self._client.zrange(self._qk.scheduled, 0, -1, withscores=True)
        out = []
        for raw, score in cast("list[tuple[bytes, float]]", entries):
            try:
                env = codec.decode(raw)
            except PayloadError:
                continue
            out.append(
                ScheduledTask(env.queue, env.operation, env.params, env.jid, env.attempt, score / 1000)
            )
        return out

    async def stats(self) -> QueueStats:
        """The queue's cumulative counters."""
        with translated():
            return QueueStats.from_hash(await self._client.hgetall(self._qk.stats))

    async def purge(self) -> int:
        """Drop every waiting task (not scheduled ones, not counters); return how many."""
        return int(await arun(self._client, scripts.purge(pending=self._qk.pending, stats=self._qk.stats)))

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

    async def revive(self, dead_id: str, task: Task | None = None) -> bool:
        """Enqueue a dead letter again (as stored, or as ``task``); False if it is gone."""
        envelope = task.envelope() if task is not None else b""
        qk = self._qk
        call = scripts.dead_revive(
            dead=qk.dead,
            dead_index=qk.dead_index,
            pending=qk.pending,
            stats=qk.stats,
            wake=qk.wake,
            dead_id=dead_id,
            envelope=envelope,
        )
        return bool(await arun(self._client, call))


class Client:
    """Enqueues tasks and inspects queues (an async context manager too)."""

    def __init__(
        self,
        redis_url: str = DEFAULT_URL,
        *,
        prefix: str = DEFAULT_PREFIX,
        max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
        redis: redis.asyncio.Redis | None = None,
        durable_replicas: int = 0,
        durable_timeout: float = 1.0,
    ) -> None:
        self.target = parse_url(redis_url)
        self.keys = KeySpace(prefix)
        if type(max_payload) is not int or max_payload < 64:
            raise ConfigError(f"max_payload must be an int >= 64 bytes, got {max_payload!r}")
        self.max_payload = max_payload
        self.durable = durability(durable_replicas, durable_timeout)
        self.redis = redis if redis is not None else async_client(self.target)
        self._owns_redis = redis is None
        self._lean: Link | None = None  # enqueues of a client that owns its connection go here
        self._lean_opening: asyncio.Lock | None = None
        self._known_queues: set[str] = set()
        self.logger = default_logger("fencekit.queue.client")

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool (when this client created it)."""
        if self._lean is not None:
            await self._lean.aclose()
            self._lean = None
        if self._owns_redis:
            await aclose_client(self.redis)

    def queue(self, name: str) -> Queue:
        """The handle of queue ``name``."""
        return Queue(self.redis, self.keys, name)

    async def enqueue(self, task: Task, *, delay: float | timedelta | None = None) -> str:
        """Accept ``task`` and return its jid; ``delay`` defers it (seconds or timedelta)."""
        (jid,) = await self.enqueue_many((task,), delay=delay)
        if self.logger.isEnabledFor(logging.INFO):
            self.logger.info("task %s accepted: %s/%s", jid, task.queue, task.operation)
        return jid

    async def enqueue_many(
        self, tasks: Iterable[Task], *, delay: float | timedelta | None = None
    ) -> list[str]:
        """Accept many tasks in one round trip; all are validated before any is sent."""
        delay_ms = _delay_ms(delay)
        tasks = list(tasks)
        by_queue: dict[str, list[bytes]] = {}
        for task in tasks:
            if not isinstance(task, Task):
                raise PayloadError(f"enqueue takes Task objects, got {type(task).__name__}")
            by_queue.setdefault(task.queue, []).append(task.envelope(self.max_payload))
        if not by_queue:
            return []
        calls = []
        for queue, envelopes in by_queue.items():
            qk = self.keys.queue(queue)
            calls.append(
                scripts.enqueue(
                    pending=qk.pending,
                    scheduled=qk.scheduled,
                    stats=qk.stats,
                    wake=qk.wake,
                    delay_ms=delay_ms,
                    envelopes=envelopes,
                )
            )
        new = [q for q in by_queue if q not in self._known_queues]
        if new:
            await self._register_queues(new)
        if self._owns_redis:
            link = await self._link()
            results = await link.pipeline(calls) if len(calls) > 1 else [await link.call(calls[0])]
            if self.durable is not None:  # scripts cannot WAIT: it follows them on the same connection
                replicas, timeout_ms = self.durable
                results.append(
                    await link.execute("WAIT", replicas, timeout_ms, timeout=timeout_ms / 1000 + 5)
                )
        else:
            results = await apipeline(self.redis, calls, wait=self.durable)
        if self.durable is not None:
            confirmed = int(results.pop())
        for result in results:
            if isinstance(result, BaseException):
                raise result
        if self.durable is not None and confirmed < self.durable[0]:
            raise DurabilityError(
                f"{len(tasks)} task(s) accepted by the master but confirmed by {confirmed} of "
                f"{self.durable[0]} replicas within {self.durable[1]} ms: a failover now could lose them",
                confirmed,
            )
        return [t.jid for t in tasks if t.jid is not None]

    async def _link(self) -> Link:
        """The lean connection for enqueues (opened on first use, again after a failure)."""
        if self._lean is None or self._lean.closed:
            if self._lean_opening is None:
                self._lean_opening = asyncio.Lock()
            async with self._lean_opening:
                if self._lean is None or self._lean.closed:
                    self._lean = await open_link(self.target, name="fencekit-client")
        return self._lean

    async def _register_queues(self, queues: Sequence[str]) -> None:
        with translated():
            await self.redis.sadd(self.keys.queues, *queues)
        self._known_queues.update(queues)

    async def queues(self) -> list[str]:
        """Every queue name ever used with this prefix."""
        with translated():
            return sorted(as_text(q) for q in await self.redis.smembers(self.keys.queues))

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


def durability(replicas: int, timeout: float) -> tuple[int, int] | None:
    """``(replicas, timeout_ms)`` for ``WAIT`` after writes, or None when off (``replicas`` 0)."""
    if type(replicas) is not int or replicas < 0:
        raise ConfigError(f"durable_replicas must be an int >= 0, got {replicas!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigError(f"durable_timeout must be a positive number of seconds, got {timeout!r}")
    return (replicas, max(1, round(timeout * 1000))) if replicas else None


def _delay_ms(delay: float | timedelta | None) -> int:
    if delay is None:
        return 0
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
        raise ConfigError(f"delay must be a non-negative number of seconds or a timedelta, got {delay!r}")
    return round(seconds * 1000)
