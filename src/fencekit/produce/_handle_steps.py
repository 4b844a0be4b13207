"""A queue's reads and operator actions as I/O-free steps, and the values they return.

Each function here is a steps generator (:mod:`fencekit._redis.steps`) over
one queue's keys (``fencekit._redis.keys``): :class:`~fencekit.produce.handle.Queue`
drives them on an asyncio client and :class:`~fencekit.produce.sync_handle.SyncQueue`
on a synchronous one, so every rule (what is left out, the order, what a
retry keeps) is written once. Nothing is cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, cast

import orjson

from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace, QueueKeys, is_jid, jid_error
from fencekit._redis.run import as_text
from fencekit._redis.steps import Batch, Steps, cmd
from fencekit.errors import ConfigError, PayloadError
from fencekit.jobs import codec
from fencekit.jobs._registry import queue_names
from fencekit.jobs.history import History, histories_steps
from fencekit.jobs.records import JobInfo, parse
from fencekit.jobs.task import Task
from fencekit.produce import _bulk as bulk

__all__ = [
    "DeadLetter",
    "QueueStats",
    "ScheduledTask",
    "dead_count",
    "dead_letters",
    "failed",
    "failed_count",
    "history",
    "in_flight",
    "is_paused",
    "length",
    "pause",
    "paused_queues",
    "pending",
    "purge",
    "retry_failed",
    "revive",
    "run_now",
    "scheduled",
    "stats",
    "total_stats",
]


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


def _one(op: Any) -> Steps[Any]:
    (reply,) = yield Batch((op,))
    return reply


def pending(qk: QueueKeys) -> Steps[list[Task]]:
    """Tasks waiting to be claimed, in claim order (highest priority first, oldest first within one).

    Entries that are not envelopes are left out.
    """
    reply = yield from _one(scripts.pending_read(pending=qk.pending, envelopes=True))
    tasks = []
    for raw in reply[1:]:
        try:
            tasks.append(Task.from_envelope(codec.decode(raw)))
        except PayloadError:
            continue
    return tasks


def length(qk: QueueKeys) -> Steps[int]:
    """Tasks waiting on every priority list of the queue."""
    reply = yield from _one(scripts.pending_read(pending=qk.pending, envelopes=False))
    return int(reply[0])


def scheduled(qk: QueueKeys, limit: int | None) -> Steps[list[ScheduledTask]]:
    """Tasks in the scheduled set, earliest first (the first ``limit``)."""
    end = -1 if limit is None else max(0, limit - 1)
    entries = yield from _one(cmd("zrange", qk.scheduled, 0, end, withscores=True))
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


def stats(qk: QueueKeys) -> Steps[QueueStats]:
    return QueueStats.from_hash((yield from _one(cmd("hgetall", qk.stats))))


def total_stats(keys: KeySpace) -> Steps[QueueStats]:
    """The counters of every known queue, summed."""
    total = QueueStats()
    queues = yield from queue_names(keys)
    if queues:
        for raw in (yield Batch([cmd("hgetall", keys.queue(q).stats) for q in queues])):
            total = total + QueueStats.from_hash(raw)
    return total


def history(keys: KeySpace, queues: Sequence[str], window: str) -> Steps[History]:
    """The history of ``queues`` summed bucket by bucket (:mod:`fencekit.jobs.history`)."""
    return History.combine((yield from histories_steps(keys, queues, window)), window)


def purge(qk: QueueKeys) -> Steps[int]:
    call = scripts.purge(pending=qk.pending, stats=qk.stats, record_prefix=qk.job(""))
    return int((yield from _one(call)))


def pause(keys: KeySpace, name: str, paused: bool) -> Steps[bool]:
    """Pause (or resume) queue ``name`` on every host: True if this changed it (``QueueHolds``)."""
    return bool(int((yield from _one(cmd("sadd" if paused else "srem", keys.paused, name)))))


def is_paused(keys: KeySpace, name: str) -> Steps[bool]:
    return bool(int((yield from _one(cmd("sismember", keys.paused, name)))))


def paused_queues(keys: KeySpace) -> Steps[list[str]]:
    """The names of the paused queues, sorted."""
    names = yield from _one(cmd("smembers", keys.paused))
    return sorted(as_text(n) for n in names)


def in_flight(keys: KeySpace, qk: QueueKeys) -> Steps[int]:
    """How many tasks of the queue registered consumers hold now."""
    consumers = yield from _one(cmd("hkeys", keys.consumers))
    if not consumers:
        return 0
    return sum(int(n) for n in (yield Batch([cmd("hlen", qk.inflight(as_text(c))) for c in consumers])))


def dead_letters(qk: QueueKeys, name: str, limit: int) -> Steps[list[DeadLetter]]:
    """The newest dead letters first, with their reasons."""
    raw_ids = yield from _one(cmd("zrevrange", qk.dead_index, 0, limit - 1))
    ids = [as_text(i) for i in cast("list[bytes | str]", raw_ids)]
    if not ids:
        return []
    values = yield from _one(cmd("hmget", qk.dead, [x for i in ids for x in (i, f"{i}:why")]))
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
                queue=name,
                reason=str(meta.get("reason", "")),
                raw=raw.encode() if isinstance(raw, str) else raw,
                at=float(meta.get("at", 0)) / 1000,
                jid=meta.get("jid"),
                extra={k: v for k, v in meta.items() if k not in ("reason", "jid", "at")},
            )
        )
    return letters


def dead_count(qk: QueueKeys) -> Steps[int]:
    return int((yield from _one(cmd("zcard", qk.dead_index))))


def run_now(qk: QueueKeys, jid: str) -> Steps[bool]:
    if (problem := jid_error(jid)) is not None:
        raise ConfigError(problem)
    call = scripts.run_now(
        scheduled=qk.scheduled, pending=qk.pending, wake=qk.wake, record=qk.job(jid), jid=jid
    )
    return bool((yield from _one(call)))


def failed(qk: QueueKeys, name: str, limit: int) -> Steps[list[JobInfo]]:
    """The tasks kept after they failed for good, newest first, with their errors."""
    keys = [
        as_text(k) for k in cast("list[bytes]", (yield from _one(cmd("lrange", qk.failed, 0, limit - 1))))
    ]
    hashes = (yield Batch([cmd("hgetall", key) for key in keys])) if keys else []
    out = []
    prefix = len(qk.job(""))
    for key, values in zip(keys, hashes):
        flat = [x for pair in values.items() for x in pair]
        info = parse(key[prefix:], name, (flat, 0, ""))
        if info is not None:
            out.append(info)
    return out


def failed_count(qk: QueueKeys) -> Steps[int]:
    return int((yield from _one(cmd("llen", qk.failed))))


def retry_failed(qk: QueueKeys, jid: str | None, keep_result: float | None) -> Steps[int]:
    """Run kept failures again from attempt 0 (``jid``, or every one); how many.

    ``keep_result``: the producer's retention, for a failure whose envelope
    carries none (None: no producer, keep none).
    """
    default_keep_ms = round(keep_result * 1000) if keep_result is not None else 0
    if jid is None:
        return (yield from bulk.retry_all_failed(qk, default_keep_ms=default_keep_ms))
    record = qk.job(jid)
    fresh = bulk.fresh_attempt(bulk.envelope_of((yield from _one(cmd("hgetall", record)))), default_keep_ms)
    if fresh is None:
        return 0
    envelope, keep_ms = fresh
    call = scripts.failed_retry(
        failed=qk.failed,
        record=record,
        pending=qk.pending,
        stats=qk.stats,
        wake=qk.wake,
        envelope=envelope,
        keep_ms=keep_ms,
    )
    return int((yield from _one(call)))


def revive(
    qk: QueueKeys,
    dead_id: str,
    task: Task | None,
    default_keep: float = 0.0,
    max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
) -> Steps[bool]:
    """Enqueue a dead letter again (as stored, or as ``task``); False if it is gone.

    A replacement ``task`` that sets no ``keep_result`` keeps the letter's own record retention
    (else ``default_keep``, the producer's): the record the revive makes pending again is then
    finished by the new run's ack, as an enqueued task's is.
    """
    stored = yield from _one(cmd("hget", qk.dead, dead_id))
    envelope = b""
    if task is not None:
        keep = default_keep
        if task.keep_result is None and stored is not None:
            try:
                kept = codec.decode(stored).keep
            except PayloadError:  # a raw poison payload: no retention of its own
                kept = None
            if kept is not None:
                keep = kept / 1000
        envelope = task.envelope(max_payload=max_payload, keep_result=keep)
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
    return bool((yield from _one(call)))
