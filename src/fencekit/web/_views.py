"""What one read of Redis becomes: :class:`Snapshot` and the views it is made of.

A consumer's registry record is parsed leniently by
:meth:`~fencekit.jobs._registry.ConsumerRecord.from_json`, so one odd record
does not break the page: a field that is missing or of the wrong type shows
as unknown.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fencekit.jobs._registry import ConsumerRecord
from fencekit.jobs.histogram import DurationHistogram
from fencekit.jobs.records import JobInfo
from fencekit.produce.handle import DeadLetter, QueueStats, ScheduledTask
from fencekit.produce.schedules import ScheduleInfo
from fencekit.services.backlog import Backlog

__all__ = [
    "BatchCounts",
    "ChildView",
    "ConsumerView",
    "QueueView",
    "RunningView",
    "Snapshot",
    "consumer_view",
]


@dataclass(frozen=True, slots=True)
class QueueView:
    """One queue as shown on /admin and /metrics."""

    name: str
    stats: QueueStats
    pending: int
    scheduled: int
    in_flight: int
    dead_letters: int
    paused: bool = False
    """An operator paused it (``queue.pause()``): no consumer claims from it until it is resumed."""
    backlog: Backlog | None = None
    """Pending plus due scheduled tasks and the oldest one's age (``backlog.lua``, read in the same batch)."""


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
    state: str = ""  # where the child is in its life: "serving", "stalled", "starting", "hung" ...
    consumer_id: str = ""
    ready: bool = False  # serving (the state is "serving")
    stalled_for: float | None = None
    """Seconds its event loop has not ticked, when past the stall threshold (state "stalled")."""
    recycles: tuple[tuple[str, int], ...] = ()
    """Replacements of the slot's processes on purpose, by reason: ``("max_jobs", 3)`` ..."""
    loop_lag: float = 0.0
    """Seconds its event loop's ticks came late lately (a loop busy with CPU work; autoscaling reads it)."""


@dataclass(frozen=True, slots=True)
class LoopView:
    """One periodic loop of the host (heartbeat, reaper, scheduler, hang watch ...)."""

    name: str
    runs: int
    errors: int
    """Unexpected exceptions the loop logged and survived (bugs or bad data, not Redis failures)."""
    alive: bool


@dataclass(frozen=True, slots=True)
class BatchCounts:
    """What this process's batch loops (note mover, reconciler) did since it started."""

    applied: int
    """Notes that counted a child (each child once)."""
    finished: int
    """Batches finished here (callbacks enqueued, closed)."""
    malformed: int
    """Notes dropped unread (a bug, or a key written by hand)."""


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
    failed: tuple[JobInfo, ...] = ()
    """The newest tasks kept after they failed for good, over the queues shown."""
    running: tuple[RunningView, ...] = ()
    """Tasks in the consumers' in-flight hashes, longest-running first."""
    scheduled: tuple[ScheduledTask, ...] = ()
    """The scheduled tasks due soonest, over the queues shown."""
    schedules: tuple[ScheduleInfo, ...] = ()
    """The periodic schedules registered in the known queues, with their last and next run."""


@dataclass(frozen=True, slots=True)
class RunningView:
    """A task a consumer runs now: its delivery token tells when it was claimed (Redis clock, µs)."""

    queue: str
    jid: str | None
    operation: str | None
    attempt: int  # the run's number, from 1 (codec.run_number)
    consumer: str
    token: int
    runtime: float  # seconds since its claim
    recorded: bool = False  # it keeps a record: the dashboard links its page (none exists otherwise)


def consumer_view(
    record: ConsumerRecord, beat_ms: float | None, now_ms: int, in_flight: int, ttl: float
) -> ConsumerView:
    """A consumer from its registry ``record``, its last beat and Redis's ``now`` (both in ms)."""
    age = max(0.0, (now_ms - beat_ms) / 1000) if beat_ms is not None else None
    return ConsumerView(
        id=record.id,
        host=record.host,
        pid=record.pid,
        kind=record.kind,
        queues=record.queues or (),
        concurrency=record.concurrency,
        started=record.started,
        beat_age=age,
        in_flight=in_flight,
        alive=age is not None and age <= ttl,
    )
