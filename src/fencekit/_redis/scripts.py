"""The Lua scripts, loaded from ``lua/*.lua``, and one typed builder per script.

Each ``.lua`` file is one atomic state transition and opens with a header that
lists its KEYS, ARGV and replies. A line ``--!include other.lua`` is replaced by
that file's text (shared helpers such as token issuance live once).

Python never spells KEYS/ARGV positions anywhere else: every script has one
builder here, taking keys then arguments as named parameters and returning a
:class:`Call`. Runners (:func:`fencekit._redis.run.run`, :func:`fencekit._redis.run.arun`,
the lean connection) execute a ``Call`` by SHA and load the script on
``NOSCRIPT``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import NamedTuple

from fencekit.errors import ConfigError

Arg = bytes | str | int | float

_INCLUDE = re.compile(r"^--!include (\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script: its name, expanded source and SHA1 (for EVALSHA)."""

    name: str
    source: str
    sha: str


@dataclass(frozen=True, slots=True)
class Call:
    """One script invocation: which script, its KEYS and its ARGV, in order."""

    script: Script
    keys: tuple[str, ...]
    args: tuple[Arg, ...]


def _read(name: str) -> str:
    return resources.files("fencekit._redis").joinpath("lua").joinpath(name).read_text("utf-8")


def _expand(source: str, seen: frozenset[str] = frozenset()) -> str:
    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in seen:
            raise ConfigError(f"recursive --!include of {name}")
        return _expand(_read(name), seen | {name})

    return _INCLUDE.sub(include, source)


def load(name: str) -> Script:
    """Load ``lua/<name>.lua`` with its includes expanded."""
    source = _expand(_read(f"{name}.lua"))
    return Script(name, source, hashlib.sha1(source.encode("utf-8")).hexdigest())


def script_names() -> list[str]:
    """Every script file (not include-only helpers, whose names start with ``_``)."""
    lua_dir = resources.files("fencekit._redis").joinpath("lua")
    return sorted(
        entry.name[:-4]
        for entry in lua_dir.iterdir()
        if entry.name.endswith(".lua") and not entry.name.startswith("_")
    )


class _Scripts:
    """Lazily loaded scripts, one attribute per ``lua/<name>.lua``."""

    def __getattr__(self, name: str) -> Script:
        script = load(name)
        setattr(self, name, script)
        return script


SCRIPTS = _Scripts()


def call(name: str, keys: Sequence[str], args: Sequence[Arg]) -> Call:
    """Build a :class:`Call` of script ``name`` (used by the typed builders)."""
    return Call(getattr(SCRIPTS, name), tuple(keys), tuple(args))


# -- primitives: locks -------------------------------------------------------------


def lock_acquire(*, lock: str, seq: str, owner: str, ttl_ms: int) -> Call:
    """Grant a lease and issue its token; reply token or nil (``lock_acquire.lua``)."""
    return call("lock_acquire", (lock, seq), (owner, ttl_ms))


def lock_release(*, lock: str, owner: str, token: int) -> Call:
    """Release one grant; error ``NOTOWNED`` when gone (``lock_release.lua``)."""
    return call("lock_release", (lock,), (owner, token))


def lock_extend(*, lock: str, owner: str, token: int, ttl_ms: int) -> Call:
    """Extend one grant; error ``NOTOWNED`` when gone (``lock_extend.lua``)."""
    return call("lock_extend", (lock,), (owner, token, ttl_ms))


# -- primitives: fences ------------------------------------------------------------


def fence_check(*, fence: str, token: int) -> Call:
    """Diagnostic check; reply current max, error ``FENCED`` (``fence_check.lua``)."""
    return call("fence_check", (fence,), (token,))


def fence_advance(*, fence: str, token: int, fence_ttl_ms: int) -> Call:
    """Accept and record a token; error ``FENCED`` (``fence_advance.lua``)."""
    return call("fence_advance", (fence,), (token, fence_ttl_ms))


def fence_set(*, fence: str, target: str, token: int, value: Arg, fence_ttl_ms: int) -> Call:
    """Fenced SET of ``target``; error ``FENCED`` (``fence_set.lua``)."""
    return call("fence_set", (fence, target), (token, value, fence_ttl_ms))


# -- primitives: idempotency -------------------------------------------------------


def idem_begin(*, key: str, result: str, owner: str, ttl_s: int) -> Call:
    """SET NX the pending marker; reply 1 begun / 0 exists (``idem_begin.lua``)."""
    return call("idem_begin", (key, result), (owner, ttl_s))


def idem_done(*, key: str, result: str, owner: str, ttl_s: int, store: bool, memo: str) -> Call:
    """Owner-checked done (+ memo); error ``IDEMNOTOWNED`` (``idem_done.lua``)."""
    return call("idem_done", (key, result), (owner, ttl_s, 1 if store else 0, memo))


def idem_reclaim(*, key: str, result: str, lock: str, owner: str, ttl_s: int, reserve_ms: int) -> Call:
    """Begin or take over a stale pending key, reserving the lock (``idem_reclaim.lua``)."""
    return call("idem_reclaim", (key, result, lock), (owner, ttl_s, reserve_ms))


# -- queue -----------------------------------------------------------------------------


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


class RecordedAck(NamedTuple):
    """An ack whose task keeps a record: the result lands in it (``ack_claim.lua``)."""

    record: str
    token: int
    jid: str
    result: bytes
    keep_ms: int
    envelope: bytes  # b"" when the record exists already (written at enqueue)
    unique: str = ""  # the unique key the task holds, "" for none


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
) -> Call:
    """Acknowledge ``acks`` and ``recorded``, claim up to ``want``; reply ``{fenced, first, lost, envs…}``.

    With ``flow`` (the queue's rate limits, :func:`fencekit.queue.flow.flow_specs`)
    the reply is ``{fenced, first, lost, wait_ms, envs…}``. See ``ack_claim.lua``.
    """
    keys: tuple[str, ...] = (pending, inflight, token_counter, stats, wake)
    args: tuple[Arg, ...] = (f"{want} {flow}" if flow else want, len(acks), *acks)
    if recorded:
        keys = (*keys, finished, *(r.record for r in recorded))
        extra: list[Arg] = [channel, keep_finished]
        for r in recorded:
            extra += (r.token, r.jid, r.result, r.keep_ms, r.envelope, r.unique)
        args = (*args, *extra)
    return call("ack_claim", keys, args)


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
) -> Call:
    """Return a delivery to the head of its queue; error ``FENCED`` (``requeue.lua``)."""
    keys: tuple[str, ...] = (inflight, pending, stats, wake, fence)
    if record is not None:
        keys = (*keys, record)
    return call("requeue", keys, (token, envelope, counter, fence_ttl_ms))


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


def drain_probe(*, pending: str, scheduled: str, stats: str, inflight: Sequence[str]) -> Call:
    """What one queue holds: ``{pending, scheduled, inflight, next_due_ms, stats}`` (``drain_probe.lua``)."""
    return call("drain_probe", (pending, scheduled, stats, *inflight), ())


def run_now(*, scheduled: str, pending: str, wake: str, record: str, jid: str) -> Call:
    """Move scheduled task ``jid`` to the head of its queue; reply 1 or 0 (``run_now.lua``)."""
    return call("run_now", (scheduled, pending, wake, record), (jid,))


def job_progress(*, inflight: str, record: str, token: int, progress: bytes) -> Call:
    """A running job's progress; reply 1 or 0, error ``FENCED`` (``job_progress.lua``)."""
    return call("job_progress", (inflight, record), (token, progress))


def failed_retry(
    *, failed: str, record: str, pending: str, stats: str, wake: str, envelope: bytes, keep_ms: int
) -> Call:
    """Enqueue a kept failure again; reply 1 or 0 (``failed_retry.lua``)."""
    return call("failed_retry", (failed, record, pending, stats, wake), (envelope, keep_ms))


def job_set(*, inflight: str, fence: str, target: str, token: int, value: Arg) -> Call:
    """A running job's fenced SET of ``target``; error ``FENCED`` (``job_set.lua``)."""
    return call("job_set", (inflight, fence, target), (token, value))


def job_set_many(writes: Sequence[tuple[str, str, str, int, Arg]]) -> Call:
    """Several fenced SETs, each ``(inflight, fence, target, token, value)``; reply one 1 or
    ``FENCED`` error per write (``job_set_many.lua``)."""
    keys = [key for inflight, fence, target, _, _ in writes for key in (inflight, fence, target)]
    args = [arg for _, _, _, token, value in writes for arg in (token, value)]
    return call("job_set_many", keys, args)


def schedule(*, scheduled: str, pending: str, wake: str, limit: int) -> Call:
    """Move due scheduled tasks into the queue; reply count (``schedule.lua``)."""
    return call("schedule", (scheduled, pending, wake), (limit,))


def pending_read(*, pending: str, envelopes: bool) -> Call:
    """The tasks of every priority list: count, and with ``envelopes`` them in claim order."""
    return call("pending_read", (pending,), ("list" if envelopes else "len",))


def purge(*, pending: str, stats: str, record_prefix: str) -> Call:
    """Drop every waiting task and their records; reply count (``purge.lua``)."""
    return call("purge", (pending, stats), (record_prefix,))


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


def history_sample(
    *,
    stats: str,
    pending: str,
    last: str,
    minutes: str,
    hours: str,
    now_ms: int | None,
    back_ms: int,
    minute_tier: tuple[int, int],
    hour_tier: tuple[int, int],
    durations: str,
) -> Call:
    """Book a queue's counters, depth and durations into its history; reply [processed, depth].

    ``*_tier``: (step in seconds, buckets kept); ``now_ms`` None uses the Redis
    clock; ``durations``: "" or "sum_us c1 ... c15" (``history_sample.lua``).
    """
    return call(
        "history_sample",
        (stats, pending, last, minutes, hours),
        ("" if now_ms is None else now_ms, back_ms, *minute_tier, *hour_tier, durations),
    )


# -- registry ------------------------------------------------------------------------


def heartbeat(
    *, consumers: str, beats: str, store: str, new_store_id: str, entries: Sequence[tuple[str, bytes]]
) -> Call:
    """Register consumers, stamp their beats, read the store id; reply [server ms, id] (``heartbeat.lua``)."""
    flat: list[Arg] = [new_store_id]
    for consumer_id, info in entries:
        flat += (consumer_id, info)
    return call("heartbeat", (consumers, beats, store), flat)


def expired(*, beats: str, ttl_ms: int, limit: int) -> Call:
    """Consumers whose beat is older than the TTL (``expired.lua``)."""
    return call("expired", (beats,), (ttl_ms, limit))


def forget(*, consumers: str, beats: str, consumer_id: str, ttl_ms: int) -> Call:
    """Forget a consumer if its beat is still missing (``forget.lua``)."""
    return call("forget", (consumers, beats), (consumer_id, ttl_ms))


# -- upgrade from the published fencekit 0.1-0.6 -----------------------------------------


def upgrade_move(*, kind: str, keys: Sequence[str], delete: bool, dry_run: bool) -> Call:
    """Carry one old-layout key (with its memo or counter) to ours (``upgrade_move.lua``).

    ``kind`` is ``"idem"`` (old marker, old memo, our marker, our memo),
    ``"lock"`` (old lock, old counter, our lock) or ``"counter"`` (old, ours);
    reply ``migrated`` / ``current`` / ``kept`` / ``gone`` / ``foreign``.
    """
    return call("upgrade_move", keys, (kind, 1 if delete else 0, 1 if dry_run else 0))


# -- periodic jobs ---------------------------------------------------------------------


def periodic_enqueue(
    *,
    last: str,
    pending: str,
    stats: str,
    wake: str,
    floor_ms: int,
    keep_ms: int,
    ticks: Sequence[tuple[int, bytes, str]],
) -> Call:
    """Enqueue the ticks newer than the newest enqueued, each ``(tick ms, envelope, record key)``,
    ascending; reply ``{enqueued, newest}`` (``periodic_enqueue.lua``)."""
    keys = (last, pending, stats, wake, *(record for _, _, record in ticks))
    args: list[Arg] = [floor_ms, keep_ms]
    for tick, envelope, _ in ticks:
        args += (tick, envelope)
    return call("periodic_enqueue", keys, args)
