"""Builders of the operator's and the reader's scripts: a job's record, cancel, run now, the
pending listing, purge, dead letters and kept failures (one and in bulk), burst mode's probe.
"""

from __future__ import annotations

from collections.abc import Sequence

from fencekit._redis.scripts._load import Arg, Call, call

# -- one job -----------------------------------------------------------------------


def job_info(*, record: str, inflight: Sequence[str], jid: str) -> Call:
    """A task's record and its running delivery, if any; reply ``{fields, token, env}`` (``job_info.lua``)."""
    return call("job_info", (record, *inflight), (jid,))


def cancel(
    *,
    record: str,
    pending: str,
    scheduled: str,
    stats: str,
    finished: str,
    inflight: Sequence[str],
    jid: str,
    channel: str,
    keep_finished: int,
    done: str,
) -> Call:
    """Cancel a task wherever it is; reply ``{cancelled, where}`` (``cancel.lua``)."""
    return call(
        "cancel",
        (record, pending, scheduled, stats, finished, *inflight),
        (jid, channel, keep_finished, done),
    )


def run_now(*, scheduled: str, pending: str, wake: str, record: str, jid: str) -> Call:
    """Move scheduled task ``jid`` to the head of its queue; reply 1 or 0 (``run_now.lua``)."""
    return call("run_now", (scheduled, pending, wake, record), (jid,))


def failed_retry(
    *, failed: str, record: str, pending: str, stats: str, wake: str, envelope: bytes, keep_ms: int
) -> Call:
    """Enqueue a kept failure again; reply 1 or 0 (``failed_retry.lua``)."""
    return call("failed_retry", (failed, record, pending, stats, wake), (envelope, keep_ms))


# -- a queue's contents ------------------------------------------------------------


def pending_read(*, pending: str, envelopes: bool) -> Call:
    """The tasks of every priority list: count, and with ``envelopes`` them in claim order."""
    return call("pending_read", (pending,), ("list" if envelopes else "len",))


def purge(*, pending: str, stats: str, record_prefix: str) -> Call:
    """Drop every waiting task and their records; reply count (``purge.lua``)."""
    return call("purge", (pending, stats), (record_prefix,))


def drain_probe(*, pending: str, scheduled: str, stats: str, inflight: Sequence[str]) -> Call:
    """What one queue holds: ``{pending, scheduled, inflight, next_due_ms, stats}`` (``drain_probe.lua``)."""
    return call("drain_probe", (pending, scheduled, stats, *inflight), ())


def backlog(*, pending: str, scheduled: str) -> Call:
    """What waits in one queue: ``{pending, due, oldest_ms, now_ms}`` (``backlog.lua``)."""
    return call("backlog", (pending, scheduled), ())


# -- dead letters and failures, in bulk --------------------------------------------


def dead_revive(
    *,
    dead: str,
    dead_index: str,
    pending: str,
    stats: str,
    wake: str,
    dead_id: str,
    envelope: bytes,
    record: str | None = None,
) -> Call:
    """Re-enqueue a dead letter (its record pending again); reply 1 or 0 (``dead_revive.lua``)."""
    keys: tuple[str, ...] = (dead, dead_index, pending, stats, wake)
    if record is not None:
        keys = (*keys, record)
    return call("dead_revive", keys, (dead_id, envelope))


def dead_revive_many(
    *,
    dead: str,
    dead_index: str,
    pending: str,
    stats: str,
    wake: str,
    letters: Sequence[tuple[str, str | None]],
) -> Call:
    """Re-enqueue dead letters, each ``(id, its record key or None)``, oldest first; reply count
    (``dead_revive_many.lua``)."""
    keys: list[str] = [dead, dead_index, pending, stats, wake]
    args: list[Arg] = []
    for dead_id, record in letters:
        if record is not None:
            keys.append(record)
        args += (dead_id, len(keys) if record is not None else 0)
    return call("dead_revive_many", keys, args)


def dead_drop(*, dead: str, dead_index: str, dead_id: str) -> Call:
    """Drop one dead letter; reply 1 when it was there (``dead_drop.lua``)."""
    return call("dead_drop", (dead, dead_index), (dead_id,))


def record_drop(*, index: str, record: str) -> Call:
    """Forget one kept record (and its unique key); reply 1 when it existed (``record_drop.lua``)."""
    return call("record_drop", (index, record), ())


def dead_purge(*, dead: str, dead_index: str) -> Call:
    """Drop every dead letter of a queue; reply count (``dead_purge.lua``)."""
    return call("dead_purge", (dead, dead_index), ())


def failed_retry_many(
    *, failed: str, pending: str, stats: str, wake: str, retries: Sequence[tuple[str, bytes, int]]
) -> Call:
    """Enqueue kept failures again, each ``(record key, envelope, keep_ms)``, oldest first; reply count
    (``failed_retry_many.lua``)."""
    keys = (failed, pending, stats, wake, *(record for record, _, _ in retries))
    args = [arg for _, envelope, keep_ms in retries for arg in (envelope, keep_ms)]
    return call("failed_retry_many", keys, args)
