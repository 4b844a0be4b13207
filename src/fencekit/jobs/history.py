"""Per-queue history in Redis: what each minute and each hour saw, kept for a bounded window.

Each queue keeps two tiers of buckets (``history_sample.lua``): the newest
2,880 minutes (48 h) and the newest 2,160 hours (90 days). A bucket holds
the counts of processed, failed, retried, fenced-out and dead-lettered tasks
booked in it, the deepest the queue's pending list was seen, and the job
durations as a :class:`~fencekit.jobs.histogram.DurationHistogram` (so the
p50/p95 of several hosts' jobs are read from their summed buckets, as
bounds, never averaged).

Nothing here runs per job: the buckets are booked by the host's history sampler
(:mod:`fencekit.services._sampler`); this module is their stored form and their reads.

Bytes: a bucket is one hash field of 22 integers (about 60 bytes with Redis's
per-field overhead); a queue busy in every minute and hour of both windows
holds 2,880 + 2,160 buckets, about 0.3 MB (298 KB measured by
``tests/integration/test_history.py``); a minute in which nothing finished
and nothing waited costs nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio

from fencekit._redis.keys import KeySpace, QueueKeys
from fencekit._redis.run import as_text
from fencekit._redis.steps import Batch, Steps, adrive, cmd
from fencekit.errors import ConfigError
from fencekit.jobs.histogram import DEFAULT_BUCKETS, DurationHistogram

__all__ = [
    "HOURS",
    "MINUTES",
    "WINDOWS",
    "History",
    "HistoryBucket",
    "Tier",
    "histories_steps",
    "read_histories",
    "read_history",
]


@dataclass(frozen=True, slots=True)
class Tier:
    """One resolution of the history: bucket width and how many buckets are kept."""

    name: str
    step: int  # seconds
    keep: int

    def key(self, qk: QueueKeys) -> str:
        return qk.history_minutes if self.name == "m" else qk.history_hours


MINUTES = Tier("m", 60, 2880)
HOURS = Tier("h", 3600, 2160)

#: The windows a reader may ask for: the tier read and how many of its buckets.
WINDOWS: dict[str, tuple[Tier, int]] = {
    "1h": (MINUTES, 60),
    "24h": (MINUTES, 1440),
    "48h": (MINUTES, 2880),
    "90d": (HOURS, 2160),
}

_COUNTS = ("processed", "failed", "retried", "fenced_out", "dead")
_WIDTH = len(_COUNTS) + 2 + len(DEFAULT_BUCKETS) + 1


@dataclass(frozen=True, slots=True)
class HistoryBucket:
    """What one minute (or hour) of one queue, or of several summed, saw."""

    at: float
    """Start of the bucket, Unix seconds."""
    processed: int = 0
    failed: int = 0
    retried: int = 0
    fenced_out: int = 0
    dead: int = 0
    depth: int = 0
    """The deepest the pending list was seen in the bucket (summed over queues)."""
    durations: DurationHistogram | None = None

    @property
    def p50(self) -> float | None:
        """Upper bound of the median job's duration bucket (None: no job timed here)."""
        return self.durations.quantile_bound(0.5) if self.durations is not None else None

    @property
    def p95(self) -> float | None:
        return self.durations.quantile_bound(0.95) if self.durations is not None else None

    @classmethod
    def parse(cls, at: float, raw: bytes | str) -> HistoryBucket:
        """A bucket from its stored form (``history_sample.lua``); ConfigError if it is not one."""
        try:
            values = [int(v) for v in as_text(raw).split()]
        except ValueError:
            raise ConfigError(f"not a history bucket: {raw!r}") from None
        if len(values) != _WIDTH:
            raise ConfigError(f"a history bucket has {_WIDTH} integers, got {len(values)}")
        counts = values[7:]
        durations = DurationHistogram.from_counts(counts, values[6] / 1e6) if any(counts) else None
        processed, failed, retried, fenced_out, dead, depth = values[:6]
        return cls(at, processed, failed, retried, fenced_out, dead, depth, durations)

    def __add__(self, other: HistoryBucket) -> HistoryBucket:
        """Two queues' buckets of the same time, summed (durations add, depths add)."""
        if self.durations is None or other.durations is None:
            durations = self.durations or other.durations
        else:
            durations = self.durations + other.durations
        return HistoryBucket(
            self.at,
            self.processed + other.processed,
            self.failed + other.failed,
            self.retried + other.retried,
            self.fenced_out + other.fenced_out,
            self.dead + other.dead,
            self.depth + other.depth,
            durations,
        )

    def to_json(self) -> dict[str, Any]:
        """The bucket as JSON-ready values (p50/p95 in seconds; ``null`` when no job was timed)."""

        def bound(value: float | None) -> float | str | None:
            return "+Inf" if value is not None and math.isinf(value) else value

        return {
            "at": self.at,
            "processed": self.processed,
            "failed": self.failed,
            "retried": self.retried,
            "fenced_out": self.fenced_out,
            "dead": self.dead,
            "depth": self.depth,
            "timed": self.durations.count if self.durations is not None else 0,
            "p50": bound(self.p50),
            "p95": bound(self.p95),
        }


@dataclass(frozen=True, slots=True)
class History:
    """The buckets of one window, oldest first; buckets in which nothing was booked are absent."""

    queues: tuple[str, ...]
    window: str
    step: int
    start: float
    end: float
    buckets: tuple[HistoryBucket, ...]
    unreadable: int = 0
    """Stored buckets left out because they did not parse."""

    @classmethod
    def combine(cls, histories: Mapping[str, History], name: str) -> History:
        """Several queues' histories of one window, summed bucket by bucket."""
        tier, count = window(name)
        summed: dict[float, HistoryBucket] = {}
        end = float((int(time.time()) // tier.step + 1) * tier.step)  # no queue: the window to now
        start = end - count * tier.step
        for history in histories.values():
            start, end = history.start, history.end
            for bucket in history.buckets:
                previous = summed.get(bucket.at)
                summed[bucket.at] = bucket if previous is None else previous + bucket
        return cls(
            tuple(histories),
            name,
            tier.step,
            start,
            end,
            tuple(summed[at] for at in sorted(summed)),
            sum(h.unreadable for h in histories.values()),
        )

    def at(self) -> list[float]:
        """The start of every bucket of the window, oldest first (those absent included)."""
        return [self.start + i * self.step for i in range(round((self.end - self.start) / self.step))]

    def totals(self) -> HistoryBucket:
        """The window's buckets summed (depth: the sum of the deepest each bucket saw)."""
        total = HistoryBucket(self.start)
        for bucket in self.buckets:
            total = total + bucket
        return total

    def to_json(self) -> dict[str, Any]:
        return {
            "queues": list(self.queues),
            "window": self.window,
            "step": self.step,
            "start": self.start,
            "end": self.end,
            "buckets": [b.to_json() for b in self.buckets],
            "unreadable": self.unreadable,
        }


def window(name: str) -> tuple[Tier, int]:
    """The tier and bucket count of window ``name``; ConfigError naming the known ones."""
    try:
        return WINDOWS[name]
    except KeyError:
        raise ConfigError(f"unknown history window {name!r}: one of {', '.join(WINDOWS)}") from None


async def read_history(
    client: redis.asyncio.Redis, keys: KeySpace, queues: Sequence[str], name: str = "1h"
) -> History:
    """The history of ``queues`` summed bucket by bucket, over window ``name`` up to now (Redis clock)."""
    return History.combine(await read_histories(client, keys, queues, name), name)


async def read_histories(
    client: redis.asyncio.Redis, keys: KeySpace, queues: Sequence[str], name: str = "1h"
) -> dict[str, History]:
    """:func:`histories_steps` on an asyncio client. Raises StoreError."""
    return await adrive(client, histories_steps(keys, queues, name))


def histories_steps(keys: KeySpace, queues: Sequence[str], name: str = "1h") -> Steps[dict[str, History]]:
    """The history of each of ``queues`` over window ``name`` up to now (Redis clock).

    Two round trips: the clock, then one ``HMGET`` per queue of exactly the
    buckets in the window. A bucket that does not parse (written by hand, or
    by a future version) is left out and counted in :attr:`History.unreadable`.
    """
    tier, count = window(name)
    ((now_s, _),) = yield Batch((cmd("time"),))
    newest = int(now_s) // tier.step
    numbers = list(range(newest - count + 1, newest + 1))
    replies: list[list[bytes | None]] = []
    if queues:
        replies = yield Batch([cmd("hmget", tier.key(keys.queue(queue)), numbers) for queue in queues])
    start, end = float(numbers[0] * tier.step), float((newest + 1) * tier.step)
    out: dict[str, History] = {}
    for queue, raw_values in zip(queues, replies):
        buckets: list[HistoryBucket] = []
        unreadable = 0
        for number, raw in zip(numbers, raw_values):
            if raw is None:
                continue
            try:
                buckets.append(HistoryBucket.parse(number * tier.step, raw))
            except ConfigError:
                unreadable += 1
        out[queue] = History((queue,), name, tier.step, start, end, tuple(buckets), unreadable)
    return out
