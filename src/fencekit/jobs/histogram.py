"""Job-duration histograms, cheap enough for the hot path.

A job's duration costs a bisect and two additions; the counts only grow, as
Prometheus counters must, and histograms of several processes (pool
children writing to shared memory) add up bucket by bucket.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from fencekit.errors import ConfigError

DEFAULT_BUCKETS: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


class DurationHistogram:
    """Cumulative job-duration histogram (seconds), fed by the process that runs jobs.

    A histogram rather than a list of recent values because Prometheus needs
    counts that only grow between scrapes, and because it costs a bisect and
    two additions per job however many jobs run between two scrapes.
    """

    __slots__ = ("_counts", "bounds", "count", "sum")

    def __init__(self, buckets: Sequence[float] = DEFAULT_BUCKETS) -> None:
        bounds = sorted(float(b) for b in buckets if not math.isinf(b))
        if not bounds or bounds[0] < 0:
            raise ConfigError(f"buckets must be non-negative and not empty, got {buckets!r}")
        self.bounds: tuple[float, ...] = tuple(bounds)
        self._counts = [0] * (len(self.bounds) + 1)  # last slot: above every bound (+Inf)
        self.count = 0
        self.sum = 0.0

    @classmethod
    def from_counts(
        cls, counts: Sequence[int], total: float, buckets: Sequence[float] = DEFAULT_BUCKETS
    ) -> DurationHistogram:
        """A histogram from per-bucket counts (one more than ``buckets``: the last is +Inf).

        For a host whose jobs run elsewhere (pool children writing counts to
        shared memory): sum the counts per bucket and build one histogram.
        """
        histogram = cls(buckets)
        if len(counts) != len(histogram._counts):
            raise ConfigError(f"expected {len(histogram._counts)} counts, got {len(counts)}")
        histogram._counts = [int(n) for n in counts]
        histogram.count = sum(histogram._counts)
        histogram.sum = float(total)
        return histogram

    @property
    def counts(self) -> tuple[int, ...]:
        """Jobs per bucket (not cumulative), the last one above every bound."""
        return tuple(self._counts)

    def observe(self, seconds: float) -> None:
        """Record one job that ran for ``seconds``."""
        self._counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.count += 1
        self.sum += seconds

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, jobs at or below it)`` pairs, ending with ``(inf, count)``."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, math.inf), self._counts):
            running += n
            out.append((bound, running))
        return out

    def quantile_bound(self, q: float) -> float | None:
        """Upper bound of the bucket holding the ``q`` quantile (``inf`` above the last bound).

        A bound rather than an interpolated value: with fixed buckets that is
        all the histogram knows, and "p95 <= 250 ms" is honest where "p95 =
        183 ms" would be invented. None before the first job.
        """
        if self.count == 0:
            return None
        rank = q * self.count
        for bound, cum in self.cumulative():
            if cum >= rank:
                return bound
        return math.inf

    def __add__(self, other: DurationHistogram) -> DurationHistogram:
        """Bucket-by-bucket sum (histograms of several processes add up)."""
        if self.bounds != other.bounds:
            raise ConfigError("cannot add histograms with different buckets")
        total = DurationHistogram(self.bounds)
        total._counts = [a + b for a, b in zip(self._counts, other._counts)]
        total.count = self.count + other.count
        total.sum = self.sum + other.sum
        return total

    def __sub__(self, other: DurationHistogram) -> DurationHistogram:
        """What this histogram counted since ``other`` (an earlier reading of it); never negative."""
        if self.bounds != other.bounds:
            raise ConfigError("cannot subtract histograms with different buckets")
        delta = DurationHistogram(self.bounds)
        delta._counts = [max(0, a - b) for a, b in zip(self._counts, other._counts)]
        delta.count = sum(delta._counts)
        delta.sum = max(0.0, self.sum - other.sum) if delta.count else 0.0
        return delta

    def copy(self) -> DurationHistogram:
        """An independent copy (a reading that later observations do not change)."""
        return DurationHistogram.from_counts(self._counts, self.sum, self.bounds)


class QueueDurations:
    """One :class:`DurationHistogram` per queue, for the per-queue history.

    The consumer observes each job under its queue (a dict lookup more than a
    single histogram); the process-wide histogram of ``/metrics`` is their
    sum, taken when it is read.
    """

    __slots__ = ("_by_queue",)

    def __init__(self, by_queue: dict[str, DurationHistogram] | None = None) -> None:
        self._by_queue: dict[str, DurationHistogram] = by_queue if by_queue is not None else {}

    def observe(self, queue: str, seconds: float) -> None:
        """Record one job of ``queue`` that ran for ``seconds``."""
        histogram = self._by_queue.get(queue)
        if histogram is None:
            histogram = self._by_queue[queue] = DurationHistogram()
        # DurationHistogram.observe, inlined: this runs once per job
        histogram._counts[bisect.bisect_left(histogram.bounds, seconds)] += 1
        histogram.count += 1
        histogram.sum += seconds

    def get(self, queue: str) -> DurationHistogram:
        """The histogram of ``queue`` (empty if none of its jobs ran here)."""
        histogram = self._by_queue.get(queue)
        return histogram if histogram is not None else DurationHistogram()

    def queues(self) -> list[str]:
        """The queues with a histogram, in the order their first job ran."""
        return list(self._by_queue)

    def total(self) -> DurationHistogram:
        """Every queue's histogram summed: the process-wide one."""
        total = DurationHistogram()
        for histogram in self._by_queue.values():
            total = total + histogram
        return total

    def copy(self) -> QueueDurations:
        """An independent reading of every queue's histogram."""
        return QueueDurations({q: h.copy() for q, h in self._by_queue.items()})

    def __add__(self, other: QueueDurations) -> QueueDurations:
        """Queue-by-queue sum (several processes' readings add up)."""
        out = {q: h.copy() for q, h in self._by_queue.items()}
        for queue, histogram in other._by_queue.items():
            mine = out.get(queue)
            out[queue] = histogram.copy() if mine is None else mine + histogram
        return QueueDurations(out)
