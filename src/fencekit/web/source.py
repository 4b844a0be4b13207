"""What the web pages show: one read of Redis turned into a :class:`Snapshot`.

:class:`AdminSource` is the only part of the web layer that talks to Redis.
It reads the same keys the queue uses (``keys.py``) through an asyncio
redis-py client, in three pipelined round trips, so ``/admin`` and
``/metrics`` show exactly what ``Client``/``Queue`` would report:

1. the registry: known queues, registered consumers with their info, their
   last beats, and Redis's own clock (beat ages are measured on the clock
   that wrote them, so host clock skew does not make consumers look dead);
2. per queue: counters, pending, scheduled and dead-letter counts, and per
   consumer the size of its in-flight hash for each queue it polls;
3. the newest dead letters of the queues that have any.

Two things live outside Redis and are handed in by whoever hosts the web
app: pool children (a callable the supervisor provides, returning dicts
with ``pid``, ``slot``, ``restarts``, ``uptime``) and job durations (a
:class:`DurationHistogram` the host feeds with :meth:`DurationHistogram.observe`,
or a callable called at every read, returning either a list of fresh
durations that is drained into the histogram or a whole histogram, as the
pool would build from its children's bucket counts with
:meth:`DurationHistogram.from_counts`).

:meth:`AdminSource.ready` answers the readiness probe with a PING bounded by
its own short timeout, so ``/ready`` stays fast while Redis hangs (SIGSTOP)
instead of waiting on a socket that never answers.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis.asyncio
from redis.exceptions import RedisError

from fencekit._redis.keys import DEFAULT_PREFIX, KeySpace, validate_queue
from fencekit._redis.store import RedisTarget, aclose_client, as_text, async_client, parse_url, translated
from fencekit.errors import ConfigError, StoreError
from fencekit.queue.client import DeadLetter, Queue, QueueStats
from fencekit.queue.histogram import DurationHistogram

__all__ = [
    "AdminSource",
    "ChildView",
    "ConsumerView",
    "DurationHistogram",
    "QueueView",
    "Snapshot",
]

DEFAULT_READY_TIMEOUT = 0.5
DEFAULT_SNAPSHOT_TIMEOUT = 5.0
DEFAULT_DEAD_LETTERS = 20

ChildInfo = Mapping[str, Any]
ChildrenSource = Callable[[], Iterable[ChildInfo] | Awaitable[Iterable[ChildInfo]]]


#: Upper bounds (seconds) of the job-duration buckets: Prometheus's defaults
#: stretched to a minute, since background jobs are often slower than requests.
@dataclass(frozen=True, slots=True)
class QueueView:
    """One queue as shown on /admin and /metrics."""

    name: str
    stats: QueueStats
    pending: int
    scheduled: int
    in_flight: int
    dead_letters: int


@dataclass(frozen=True, slots=True)
class ConsumerView:
    """One registered consumer: its registry info, last beat and current load."""

    id: str
    host: str
    pid: int | None
    kind: str
    queues: tuple[str, ...]
    concurrency: int | None
    started: float | None
    beat_age: float | None  # seconds since its last beat, on Redis's clock
    in_flight: int
    alive: bool  # beat younger than the heartbeat TTL


@dataclass(frozen=True, slots=True)
class ChildView:
    """One pool child as reported by the supervisor."""

    pid: int
    slot: int
    restarts: int
    uptime: float
    alive: bool = True
    processed: int | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the pages show, read at ``taken_at`` (Unix seconds)."""

    queues: tuple[QueueView, ...]
    totals: QueueStats
    consumers: tuple[ConsumerView, ...]
    dead_letters: tuple[DeadLetter, ...]
    children: tuple[ChildView, ...] | None
    durations: DurationHistogram
    taken_at: float = field(default_factory=time.time)


class AdminSource:
    """Reads what /admin and /metrics show (see the module docstring).

    ``queues`` are the polled queues shown in the table; ``None`` shows every
    queue ever used with the prefix. The totals always cover every known
    queue, like ``Client.stats()``. The source does not own ``redis`` unless
    it was made by :meth:`from_url`.
    """

    def __init__(
        self,
        redis: redis.asyncio.Redis,
        keys: KeySpace,
        queues: Sequence[str] | None = None,
        *,
        children: ChildrenSource | None = None,
        durations: DurationHistogram | Callable[[], list[float] | DurationHistogram] | None = None,
        target: RedisTarget | None = None,
        heartbeat_ttl: float = 30.0,
        dead_letter_limit: int = DEFAULT_DEAD_LETTERS,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        snapshot_timeout: float = DEFAULT_SNAPSHOT_TIMEOUT,
        logger: logging.Logger | None = None,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.queues: tuple[str, ...] | None = (
            tuple(validate_queue(q) for q in queues) if queues is not None else None
        )
        self.children = children
        if isinstance(durations, DurationHistogram):
            self.durations = durations
            self._drain: Callable[[], list[float] | DurationHistogram] | None = None
        else:
            self.durations = DurationHistogram()
            self._drain = durations
        self.target = target
        self.heartbeat_ttl = heartbeat_ttl
        self.dead_letter_limit = dead_letter_limit
        self.ready_timeout = ready_timeout
        self.snapshot_timeout = snapshot_timeout
        self.logger = logger or logging.getLogger("fencekit.web")
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
        with translated():
            return sorted(as_text(q) for q in await self.redis.smembers(self.keys.queues))

    async def snapshot(self) -> Snapshot:
        """Read everything the pages show; raises :class:`StoreError` (also on timeout)."""
        self.feed_durations()
        try:
            return await asyncio.wait_for(self._read(), self.snapshot_timeout)
        except asyncio.TimeoutError:
            raise StoreError(f"Redis did not answer within {self.snapshot_timeout:g}s") from None

    def feed_durations(self) -> None:
        """Bring :attr:`durations` up to date from the ``durations`` callable, if one was given.

        A list it returns is drained into the histogram; a histogram it
        returns (say, the pool summing its children's counts) replaces it.
        """
        if self._drain is None:
            return
        fresh = self._drain()
        if isinstance(fresh, DurationHistogram):
            self.durations = fresh
        else:
            self.durations.drain(fresh)

    async def pool_children(self) -> tuple[ChildView, ...] | None:
        """The supervisor's children, or None when there is no pool."""
        if self.children is None:
            return None
        result = self.children()
        items = await result if inspect.isawaitable(result) else result
        return tuple(
            ChildView(
                pid=int(c.get("pid", 0)),
                slot=int(c.get("slot", 0)),
                restarts=int(c.get("restarts", 0)),
                uptime=float(c.get("uptime", 0.0)),
                alive=bool(c.get("alive", True)),
                processed=_opt_int(c.get("processed")),
            )
            for c in items
        )

    async def _read(self) -> Snapshot:
        keys = self.keys
        with translated():
            pipe = self.redis.pipeline(transaction=False)
            pipe.smembers(keys.queues)
            pipe.hgetall(keys.consumers)
            pipe.zrange(keys.beats, 0, -1, withscores=True)
            pipe.time()
            known_raw, consumers_raw, beats_raw, (now_s, now_us) = await pipe.execute()
        known = {as_text(q) for q in known_raw}
        shown = list(self.queues) if self.queues is not None else sorted(known)
        every = sorted(known | set(shown))
        now_ms = int(now_s) * 1000 + int(now_us) // 1000
        beats = {as_text(cid): float(score) for cid, score in beats_raw}
        infos = {as_text(cid): _info(raw) for cid, raw in consumers_raw.items()}
        consumer_ids = sorted(set(infos) | set(beats))

        with translated():
            pipe = self.redis.pipeline(transaction=False)
            for q in every:
                pipe.hgetall(keys.queue(q).stats)
            for q in shown:
                qk = keys.queue(q)
                pipe.llen(qk.pending)
                pipe.zcard(qk.scheduled)
                pipe.zcard(qk.dead_index)
            slots: list[tuple[str, str]] = []
            for cid in consumer_ids:
                for q in _consumer_queues(infos.get(cid, {}), shown):
                    slots.append((cid, q))
                    pipe.hlen(keys.queue(q).inflight(cid))
            replies = list(await pipe.execute())

        stats = {q: QueueStats.from_hash(replies[i]) for i, q in enumerate(every)}
        at = len(every)
        counts: dict[str, tuple[int, int, int]] = {}
        for q in shown:
            counts[q] = (int(replies[at]), int(replies[at + 1]), int(replies[at + 2]))
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
            QueueView(q, stats[q], counts[q][0], counts[q][1], queue_inflight[q], counts[q][2]) for q in shown
        )
        consumers = tuple(
            _consumer_view(
                cid, infos.get(cid, {}), beats.get(cid), now_ms, consumer_inflight[cid], self.heartbeat_ttl
            )
            for cid in consumer_ids
        )
        letters = await self._latest_dead([v.name for v in views if v.dead_letters])
        return Snapshot(
            queues=views,
            totals=totals,
            consumers=consumers,
            dead_letters=letters,
            children=await self.pool_children(),
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


def _info(raw: bytes | str) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _consumer_queues(info: Mapping[str, Any], shown: Sequence[str]) -> list[str]:
    queues = info.get("queues")
    if isinstance(queues, list) and all(isinstance(q, str) for q in queues):
        valid = []
        for q in queues:
            try:
                valid.append(validate_queue(q))
            except ConfigError:
                continue
        return valid
    return list(shown)


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _consumer_view(
    cid: str, info: Mapping[str, Any], beat_ms: float | None, now_ms: int, in_flight: int, ttl: float
) -> ConsumerView:
    age = max(0.0, (now_ms - beat_ms) / 1000) if beat_ms is not None else None
    queues = info.get("queues")
    return ConsumerView(
        id=cid,
        host=str(info.get("host", "")),
        pid=_opt_int(info.get("pid")),
        kind=str(info.get("kind", "")),
        queues=tuple(str(q) for q in queues) if isinstance(queues, list) else (),
        concurrency=_opt_int(info.get("concurrency")),
        started=_opt_float(info.get("started")),
        beat_age=age,
        in_flight=in_flight,
        alive=age is not None and age <= ttl,
    )
