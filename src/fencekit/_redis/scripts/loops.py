"""Builders of the maintenance loops' scripts: the consumer registry (heartbeat, reaper),
the scheduler, the per-queue history, the periodic ticker and the outbox relay.
"""

from __future__ import annotations

from collections.abc import Sequence

from fencekit._redis.scripts._load import Arg, Call, call

# -- registry: heartbeat and reaper ------------------------------------------------


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


# -- scheduler ---------------------------------------------------------------------


def schedule(*, scheduled: str, pending: str, wake: str, limit: int) -> Call:
    """Move due scheduled tasks into the queue; reply count (``schedule.lua``)."""
    return call("schedule", (scheduled, pending, wake), (limit,))


# -- history -----------------------------------------------------------------------


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


# -- periodic jobs -----------------------------------------------------------------


def periodic_enqueue(
    *,
    last: str,
    pending: str,
    stats: str,
    wake: str,
    floor_ms: int,
    keep_ms: int,
    collapse: bool,
    ticks: Sequence[tuple[int, bytes, str]],
) -> Call:
    """Enqueue the ticks newer than the newest enqueued, each ``(tick ms, envelope, record key)``,
    ascending; with ``collapse``, of those already past on Redis's clock only the newest;
    reply ``{enqueued, newest}`` (``periodic_enqueue.lua``)."""
    keys = (last, pending, stats, wake, *(record for _, _, record in ticks))
    args: list[Arg] = [floor_ms, keep_ms, 1 if collapse else 0]
    for tick, envelope, _ in ticks:
        args += (tick, envelope)
    return call("periodic_enqueue", keys, args)


# -- the outbox relay ----------------------------------------------------------------


def outbox_push(
    *,
    pending: str,
    scheduled: str,
    stats: str,
    wake: str,
    marker_ms: int,
    tasks: Sequence[tuple[str, str, int, int, bytes | str]],
) -> Call:
    """Accept relayed tasks, each once; reply the number created (``outbox_push.lua``).

    ``tasks``: (record key, marker key, delay ms, retention ms or 0, envelope) per task.
    """
    keys = [pending, scheduled, stats, wake]
    args: list[Arg] = [marker_ms]
    for record, marker, delay_ms, keep_ms, envelope in tasks:
        keys += (record, marker)
        args += (delay_ms, keep_ms, envelope)
    return call("outbox_push", keys, args)


def outbox_forget(*, markers: Sequence[str]) -> Call:
    """Remove relayed tasks' markers (one queue's); reply the count (``outbox_forget.lua``)."""
    return call("outbox_forget", markers, ())
