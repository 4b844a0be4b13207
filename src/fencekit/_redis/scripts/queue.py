"""Builders of one job's path through its queue: enqueue, claim (with the acks), settle, fenced writes.

These are the scripts of the hot path (the consumer's turn, the producer's
enqueue) and of a running job (its progress, its fenced SETs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from fencekit._redis.scripts._load import Arg, Call, call

# -- enqueue -----------------------------------------------------------------------


def enqueue(
    *, pending: str, scheduled: str, stats: str, wake: str, delay_ms: int, envelopes: Sequence[bytes]
) -> Call:
    """Accept tasks now or after a delay; reply count (``enqueue.lua``)."""
    return call("enqueue", (pending, scheduled, stats, wake), (delay_ms, *envelopes))


def enqueue_tracked(
    *,
    pending: str,
    scheduled: str,
    stats: str,
    wake: str,
    delay_ms: int,
    keep_ms: int,
    envelopes: Sequence[bytes],
    records: Sequence[str],
) -> Call:
    """Accept tasks and write each one's record; reply count (``enqueue_tracked.lua``)."""
    return call(
        "enqueue_tracked", (pending, scheduled, stats, wake, *records), (delay_ms, keep_ms, *envelopes)
    )


def enqueue_unique(
    *,
    pending: str,
    scheduled: str,
    stats: str,
    wake: str,
    record: str,
    unique: str,
    delay_ms: int,
    keep_ms: int,
    envelope: bytes,
    jid: str,
    record_prefix: str,
    unique_for_ms: int,
) -> Call:
    """Accept a task unless its unique key is held; reply ``{created, jid}`` (``enqueue_unique.lua``)."""
    return call(
        "enqueue_unique",
        (pending, scheduled, stats, wake, record, unique),
        (delay_ms, keep_ms, envelope, jid, record_prefix, unique_for_ms),
    )


def enqueue_debounce(
    *,
    scheduled: str,
    stats: str,
    record: str,
    debounce: str,
    window_ms: int,
    max_ms: int,
    envelope: bytes,
    jid: str,
    record_prefix: str,
    keep_ms: int,
) -> Call:
    """Accept a debounced task, or let it replace the one its key holds while that one waits;
    reply ``{created, jid}`` (``enqueue_debounce.lua``)."""
    return call(
        "enqueue_debounce",
        (scheduled, stats, record, debounce),
        (window_ms, max_ms, envelope, jid, record_prefix, keep_ms),
    )


# -- claim and settle --------------------------------------------------------------


class RecordedAck(NamedTuple):
    """An ack whose task keeps a record: the result lands in it (``ack_claim.lua``)."""

    record: str
    token: int
    jid: str
    result: bytes
    keep_ms: int
    envelope: bytes  # b"" when the record exists already (written at enqueue)
    unique: str = ""  # the unique key the task holds, "" for none
    batch: str = ""  # the batch the task is a child of, "" for none (its note rides the ack)


class StagedWrite(NamedTuple):
    """A job's fenced write that rides its ack (``current_job().set_on_ack``, ``ack_claim.lua``)."""

    token: int  # the delivery whose ack carries it
    fence: str  # its job's fence key
    target: str
    value: str | bytes | int | float


def ack_claim(
    *,
    pending: str,
    inflight: str,
    token_counter: str,
    stats: str,
    wake: str,
    want: int,
    acks: Sequence[Arg],
    recorded: Sequence[RecordedAck] = (),
    finished: str = "",
    channel: str = "",
    keep_finished: int = 0,
    flow: str = "",
    writes: Sequence[StagedWrite] = (),
) -> Call:
    """Acknowledge ``acks`` and ``recorded``, claim up to ``want``; reply ``{fenced, first, lost, envs…}``.

    ``writes`` land with the acks of their deliveries, only if those are accepted.

    With ``flow`` (the queue's rate limits, :func:`fencekit.jobs.flow.flow_specs`)
    the reply is ``{fenced, first, lost, wait_ms, envs…}``. See ``ack_claim.lua``.
    """
    keys: tuple[str, ...] = (pending, inflight, token_counter, stats, wake)
    args: tuple[Arg, ...] = (f"{want} {flow}" if flow else want, len(acks), *acks)
    if recorded:
        keys = (*keys, finished, *(r.record for r in recorded))
        extra: list[Arg] = [channel, keep_finished]
        for r in recorded:
            extra += (r.token, r.jid, r.result, r.keep_ms, r.envelope, r.unique, r.batch)
        args = (*args, *extra)
    if writes:
        wkeys: list[str] = []
        wargs: list[Arg] = []
        for w in writes:
            wkeys += (w.fence, w.target)
            wargs += (w.token, w.value)
        keys = (*keys, *wkeys)
        args = (args[0], f"{len(acks)} {len(writes)}", *args[2:], *wargs)
    return call("ack_claim", keys, args)


def has_work(pendings: Sequence[str]) -> Call:
    """Which queues of ``pendings`` have a task waiting: the reply's 1-based indexes (``has_work.lua``).

    One call per slot on a Redis Cluster (the keys of several queues are in several slots).
    """
    return call("has_work", tuple(pendings), ())


def retry(
    *,
    inflight: str,
    scheduled: str,
    stats: str,
    token: int,
    delay_ms: int,
    envelope: bytes,
    record: str | None = None,
    error: bytes = b"",
) -> Call:
    """Schedule the next attempt (and note it in ``record``); error ``FENCED`` (``retry.lua``)."""
    keys = (inflight, scheduled, stats) if record is None else (inflight, scheduled, stats, record)
    return call("retry", keys, (token, delay_ms, envelope, error))


def requeue(
    *,
    inflight: str,
    pending: str,
    stats: str,
    wake: str,
    fence: str,
    token: int,
    envelope: bytes,
    counter: str,
    fence_ttl_ms: int,
    record: str | None = None,
    run: str = "",
) -> Call:
    """Return a delivery to the head of its queue; error ``FENCED`` (``requeue.lua``). ``run``:
    how the record's runs line names it (``interrupted``), else by ``counter``."""
    keys: tuple[str, ...] = (inflight, pending, stats, wake, fence)
    if record is not None:
        keys = (*keys, record)
    args: tuple[Arg, ...] = (token, envelope, counter, fence_ttl_ms)
    return call("requeue", keys, (*args, run) if run else args)


class JobRecordKeys(NamedTuple):
    """A task's record, the indexes of finished and failed records of its queue, and its done channel.

    ``done``/``jid``: a script that makes the record final publishes the jid
    on the queue's done channel, where ``result()`` waits.
    """

    record: str
    finished: str
    failed: str
    done: str
    jid: str


def fail(
    *,
    inflight: str,
    stats: str,
    dead: str,
    dead_index: str,
    token: int | str,
    record: bytes,
    dead_id: str,
    keep_dead: int,
    job: JobRecordKeys | None = None,
    error: bytes = b"",
    keep_failed: int = 0,
    keep_finished: int = 0,
) -> Call:
    """Finish a delivery as failed (``record`` non-empty: dead letter); error ``FENCED`` (``fail.lua``).

    With ``job`` the failure is kept as the task's record (``error`` in it).
    """
    keys: tuple[str, ...] = (inflight, stats, dead, dead_index)
    args: tuple[Arg, ...] = (token, record, dead_id, keep_dead, error, keep_failed, keep_finished)
    if job is not None:
        keys = (*keys, job.record, job.failed, job.finished)
        args = (*args, job.done, job.jid)
    return call("fail", keys, args)


def drop(
    *,
    inflight: str,
    stats: str,
    token: int,
    counter: str,
    job: JobRecordKeys | None = None,
    keep_finished: int = 0,
) -> Call:
    """Finish a delivery unrun, counted under ``counter``; error ``FENCED`` (``drop.lua``)."""
    keys: tuple[str, ...] = (inflight, stats)
    args: tuple[Arg, ...] = (token, counter, keep_finished)
    if job is not None:
        keys = (*keys, job.record, job.finished)
        args = (*args, job.done, job.jid)
    return call("drop", keys, args)


# -- a running job -----------------------------------------------------------------


def job_progress(*, inflight: str, record: str, token: int, progress: bytes) -> Call:
    """A running job's progress; reply 1 or 0, error ``FENCED`` (``job_progress.lua``)."""
    return call("job_progress", (inflight, record), (token, progress))


def checkpoint(
    *,
    inflight: str,
    fence: str,
    state: str,
    stats: str,
    token: int,
    value: bytes,
    ttl_ms: int,
    record: str | None = None,
    progress: bytes = b"",
) -> Call:
    """Store a running job's state while its delivery is current (``checkpoint.lua``); ``FENCED`` else.
    With ``record``, ``progress`` lands in the task's record too (``iterate``)."""
    keys = (inflight, fence, state, stats) if record is None else (inflight, fence, state, stats, record)
    return call(
        "checkpoint", keys, (token, value, ttl_ms, progress) if record is not None else (token, value, ttl_ms)
    )


def job_set(*, inflight: str, fence: str, target: str, token: int, value: Arg) -> Call:
    """A running job's fenced SET of ``target``; error ``FENCED`` (``job_set.lua``)."""
    return call("job_set", (inflight, fence, target), (token, value))


def job_set_many(writes: Sequence[tuple[str, str, str, int, Arg]]) -> Call:
    """Several fenced SETs, each ``(inflight, fence, target, token, value)``; reply one 1 or
    ``FENCED`` error per write (``job_set_many.lua``)."""
    keys = [key for inflight, fence, target, _, _ in writes for key in (inflight, fence, target)]
    args = [arg for _, _, _, token, value in writes for arg in (token, value)]
    return call("job_set_many", keys, args)
