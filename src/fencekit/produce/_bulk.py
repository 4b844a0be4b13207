"""Operations over every dead letter or kept failure of a queue, in pipelined batches.

An operator may revive 100,000 dead letters after a fix: one round trip per
letter would take minutes and load Redis with as many script calls. Here a
run reads what exists when it starts (one ``ZRANGE`` of the dead-letter
index, or one ``LRANGE`` of the failed index), then handles it ``batch`` at a
time: one read of the batch (``HMGET`` of the payloads, or a pipeline of
``HGET env``) and one script call (``dead_revive_many.lua``,
``failed_retry_many.lua``) that acts on the whole batch atomically. So a run
costs about ``2 * n / batch`` round trips and as many script calls.

Working from the snapshot bounds the run: a revived task that fails again
becomes a new dead letter, which this run does not revive again. An item
that another client handled meanwhile is skipped by the script. ``progress``
is called after each batch with ``(handled, total)``: the items looked at so far
(re-enqueued or skipped) out of the snapshot's.

Each operation is a steps generator (:mod:`fencekit._redis.steps`), driven
by :class:`~fencekit.produce.handle.Queue` on asyncio and by
:class:`~fencekit.produce.sync_handle.SyncQueue` synchronously.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from fencekit._redis import scripts
from fencekit._redis.keys import QueueKeys, is_jid
from fencekit._redis.run import as_text
from fencekit._redis.steps import Batch, Steps, cmd
from fencekit.errors import PayloadError
from fencekit.jobs import codec, records

__all__ = ["DEFAULT_BATCH", "Progress", "purge_dead", "retry_all_failed", "revive_all"]

DEFAULT_BATCH = 1000
"""Items per batch: one read and one script call each (a script call blocks Redis for ~ms)."""

Progress = Callable[[int, int], None]
"""Told ``(handled, total)`` after each batch."""

_T = TypeVar("_T")


def _chunks(items: Sequence[_T], size: int) -> list[Sequence[_T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _one(op: Any) -> Steps[Any]:
    (reply,) = yield Batch((op,))
    return reply


def _check_batch(batch: int) -> int:
    if type(batch) is not int or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    return batch


def revive_all(qk: QueueKeys, *, batch: int = DEFAULT_BATCH, progress: Progress | None = None) -> Steps[int]:
    """Re-enqueue every dead letter present now, oldest first; returns how many were re-enqueued."""
    _check_batch(batch)
    ids = [as_text(i) for i in cast("list[bytes]", (yield from _one(cmd("zrange", qk.dead_index, 0, -1))))]
    done = handled = 0
    for chunk in _chunks(ids, batch):
        handled += len(chunk)
        raws = yield from _one(cmd("hmget", qk.dead, list(chunk)))
        letters: list[tuple[str, str | None]] = []
        for dead_id, raw in zip(chunk, raws):
            if raw is None:
                continue  # gone meanwhile
            jid = codec.peek_jid(raw)
            letters.append((dead_id, qk.job(jid) if is_jid(jid) else None))
        if letters:
            call = scripts.dead_revive_many(
                dead=qk.dead,
                dead_index=qk.dead_index,
                pending=qk.pending,
                stats=qk.stats,
                wake=qk.wake,
                letters=letters,
            )
            done += int((yield from _one(call)))
        if progress is not None:
            progress(handled, len(ids))
    return done


def purge_dead(qk: QueueKeys) -> Steps[int]:
    """Drop every dead letter of the queue in one script call; returns how many there were."""
    return int((yield from _one(scripts.dead_purge(dead=qk.dead, dead_index=qk.dead_index))))


def envelope_of(fields: Any) -> bytes | None:
    """The envelope of a record read with ``HGETALL`` (its field names as bytes or str)."""
    return cast("bytes | None", records.record_envelope({as_text(k): v for k, v in (fields or {}).items()}))


def fresh_attempt(raw: bytes | None, default_keep_ms: int) -> tuple[bytes, int] | None:
    """A kept failure's envelope made new (attempt 0) and its record's retention in ms, or None.

    The retention is the first attempt's, else ``default_keep_ms`` (0: no
    record); None when the failure has no readable envelope (it stays kept).
    """
    if raw is None:
        return None
    try:
        envelope = codec.decode(raw)
    except PayloadError:
        return None
    keep = envelope.keep if envelope.keep is not None else (default_keep_ms or None)
    return envelope._replace(attempt=0, keep=keep).encode(), keep or 0


def retry_all_failed(
    qk: QueueKeys,
    *,
    default_keep_ms: int = 0,
    batch: int = DEFAULT_BATCH,
    progress: Progress | None = None,
) -> Steps[int]:
    """Run every kept failure present now again from attempt 0, oldest first; returns how many.

    The new attempt keeps a record for the first one's retention, else
    ``default_keep_ms`` (0: none). A record without a readable envelope is
    left where it is (``Queue.failed`` still shows it).
    """
    _check_batch(batch)
    records = [as_text(k) for k in cast("list[bytes]", (yield from _one(cmd("lrange", qk.failed, 0, -1))))]
    records = list(dict.fromkeys(reversed(records)))  # oldest first: each LREM from the tail finds
    # its record at once; a key listed twice (its jid failed again after a new enqueue) runs once
    done = handled = 0
    for chunk in _chunks(records, batch):
        handled += len(chunk)
        raws = [envelope_of(fields) for fields in (yield Batch([cmd("hgetall", record) for record in chunk]))]
        retries: list[tuple[str, bytes, int]] = []
        for record, raw in zip(chunk, raws):
            fresh = fresh_attempt(raw, default_keep_ms)
            if fresh is not None:
                retries.append((record, *fresh))
        if retries:
            call = scripts.failed_retry_many(
                failed=qk.failed, pending=qk.pending, stats=qk.stats, wake=qk.wake, retries=retries
            )
            done += int((yield from _one(call)))
        if progress is not None:
            progress(handled, len(records))
    return done
