"""``/metrics``: the admin source's reading in Prometheus text format.

Counters and gauges per queue (``fencekit_queue_paused``: 1 while an operator
has it paused), the scaling signal (``fencekit_queue_backlog`` and
``fencekit_queue_oldest_age_seconds`` per queue; the tasks parked per queue and, for a
token, per operation -- never per key: the labels stay bounded -- and the fair-share
keys with work, ``fencekit_queue_fair_keys``; all read by ``backlog.lua`` in the
snapshot's per-queue batch: no round trip of their own, O(1) or O(log n) per
list; ``fencekit_desired_workers``, the placement's ``desired_workers()``),
the consumers with a fresh heartbeat, the p50/p95 and depth of
each queue's newest complete minute of history (over every host: what a
per-host histogram cannot give), the job-duration
histogram of this process, its periodic loops (unexpected errors survived,
alive), the batches not finished yet (every host's), what this process's batch
loops did (notes applied, batches finished) and, under a pool, its children
(restarts, uptime, seconds a stalled loop has been silent).
``fencekit_redis_up`` is 0 when Redis did not answer the scrape; the
histogram and the children, which do not live in Redis, are still reported.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from fencekit.errors import StoreError
from fencekit.jobs.history import HistoryBucket
from fencekit.services.backlog import Backlog
from fencekit.web.source import AdminSource, BatchCounts, ChildView, DurationHistogram, LoopView, Snapshot

if TYPE_CHECKING:
    from fencekit.services.relay import RelayStats

__all__ = ["Collector", "Metrics", "Reading", "RelayCollector", "read"]


@dataclass(frozen=True, slots=True)
class Reading:
    """What one scrape reports; ``snapshot`` is None when Redis did not answer."""

    snapshot: Snapshot | None
    children: tuple[ChildView, ...] | None
    durations: DurationHistogram
    loops: tuple[LoopView, ...] = ()
    last_minute: Mapping[str, HistoryBucket] = field(default_factory=dict)
    """Per queue, the newest complete minute of its history (every host's jobs)."""
    open_batches: int | None = None
    """Batches not finished yet (None: Redis did not answer)."""
    batches: BatchCounts | None = None
    """What this process's batch loops did (None: it runs none)."""
    backlog: Mapping[str, Backlog] = field(default_factory=dict)
    """Per queue, the scaling signal (:mod:`fencekit.services.backlog`), read in the snapshot's batch."""
    desired: int | None = None
    """The workers the host would run (its placement's ``desired_workers()``; None: not a host)."""


async def read(source: AdminSource) -> Reading:
    """Read ``source`` for one scrape, falling back to what lives outside Redis."""
    batches = source.batch_counts()
    try:
        snap = await source.snapshot()
        last_minute = await source.last_minute()
        open_batches = await source.open_batches()
    except StoreError as exc:
        source.logger.warning("metrics: Redis unavailable: %s", exc)
        return Reading(None, source.pool_children(), source.durations, source.loop_health(), batches=batches)
    backlog = {q.name: q.backlog for q in snap.queues if q.backlog is not None}  # read in the snapshot
    desired = source.desired_workers() if source.desired_workers is not None else None
    return Reading(
        snap,
        snap.children,
        snap.durations,
        source.loop_health(),
        last_minute,
        open_batches,
        batches,
        backlog,
        desired,
    )


_COUNTERS = (
    ("processed", "Tasks whose worker completed (each task counted once)."),
    ("failed", "Tasks permanently dropped: retries exhausted, no worker, malformed."),
    ("fenced_out", "Settlements refused because the delivery was no longer current."),
    ("dead", "Failed tasks kept as dead letters."),
    ("retried", "Attempts scheduled again after an exception, a timeout or a crash."),
    ("expired", "Tasks dropped unrun because their expires time had passed."),
    ("deduped", "Enqueues that returned the jid of the task holding their unique_key."),
    ("cancelled", "Tasks a client's cancel() took out, waiting or running."),
    ("enqueued", "Tasks accepted into the queue (revived ones included)."),
)


_GAUGES = (
    ("pending", "Tasks waiting in the queue."),
    ("scheduled", "Tasks waiting for a retry delay or a delayed start."),
    ("in_flight", "Tasks claimed by registered consumers and not settled yet."),
    ("dead_letters", "Dead letters currently kept for an operator."),
)


class Metrics:
    """The registry of /metrics, holding fencekit's collector (hosts may register their own)."""

    def __init__(self, source: AdminSource) -> None:
        self.source = source
        self.collector = Collector()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)

    async def scrape(self) -> bytes:
        """Read the source and render every collector of the registry in text format."""
        self.collector.reading = await read(self.source)
        try:
            return generate_latest(self.registry)
        finally:
            self.collector.reading = None


class Collector:
    """Turns the reading taken for one scrape into metric families.

    ``collect()`` is synchronous (prometheus_client calls it), while Redis is
    read asynchronously: the /metrics handler reads Redis, puts the reading
    here and renders at once, with no ``await`` in between, so concurrent
    scrapes on one event loop never see each other's readings.
    """

    def __init__(self) -> None:
        self.reading: Reading | None = None

    def collect(self) -> Iterable[Metric]:
        reading = self.reading
        if reading is None:
            return
        snap = reading.snapshot
        up = GaugeMetricFamily("fencekit_redis_up", "1 if Redis answered this scrape, else 0.")
        up.add_metric([], 1.0 if snap is not None else 0.0)
        yield up
        if snap is not None:
            yield from _queue_metrics(snap)
            yield from _scaling_metrics(reading.backlog, reading.desired)
            yield from _history_metrics(reading.last_minute)
        yield _histogram(reading.durations)
        if reading.loops:
            yield from _loop_metrics(reading.loops)
        yield from _batch_metrics(reading.open_batches, reading.batches)
        if reading.children is not None:
            yield from _child_metrics(reading.children)


def _queue_metrics(snap: Snapshot) -> Iterator[Metric]:
    for name, doc in _COUNTERS:
        family = CounterMetricFamily(f"fencekit_{name}", doc, labels=["queue"])
        for q in snap.queues:
            family.add_metric([q.name], float(getattr(q.stats, name)))
        yield family
    for name, doc in _GAUGES:
        gauge = GaugeMetricFamily(f"fencekit_{name}", doc, labels=["queue"])
        for q in snap.queues:
            gauge.add_metric([q.name], float(getattr(q, name)))
        yield gauge
    paused = GaugeMetricFamily(
        "fencekit_queue_paused",
        "1 while an operator has the queue paused (no consumer claims from it), else 0.",
        labels=["queue"],
    )
    for q in snap.queues:
        paused.add_metric([q.name], 1.0 if q.paused else 0.0)
    yield paused
    consumers = GaugeMetricFamily("fencekit_consumers", "Registered consumers with a fresh heartbeat.")
    consumers.add_metric([], float(sum(1 for c in snap.consumers if c.alive)))
    yield consumers


def _scaling_metrics(backlog: Mapping[str, Backlog], desired: int | None) -> Iterator[Metric]:
    """The scaling signal: what waits per queue, for how long, and the workers this host wants."""
    waiting = GaugeMetricFamily(
        "fencekit_queue_backlog", "Tasks that could run now: pending plus due scheduled.", labels=["queue"]
    )
    age = GaugeMetricFamily(
        "fencekit_queue_oldest_age_seconds",
        "Seconds the oldest pending task has waited (Redis clock); 0 when none waits.",
        labels=["queue"],
    )
    parked = GaugeMetricFamily(
        "fencekit_queue_parked",
        "Tasks parked for a concurrency slot or a rate limit's token: waiting, not runnable now.",
        labels=["queue"],
    )
    by_operation = GaugeMetricFamily(
        "fencekit_queue_parked_for_token",
        "Tasks of a rate-limited operation parked until its bucket has a token.",
        labels=["queue", "operation"],
    )
    next_token = GaugeMetricFamily(
        "fencekit_queue_next_token_seconds",
        "Seconds until a parked rate-limited operation's next token (Redis clock; 0: due now).",
        labels=["queue", "operation"],
    )
    fair_keys = GaugeMetricFamily(
        "fencekit_queue_fair_keys", "Fair-share keys (fair_key) with tasks waiting.", labels=["queue"]
    )
    for queue, read in backlog.items():
        waiting.add_metric([queue], float(read.total))
        age.add_metric([queue], round(read.oldest_age, 3))
        parked.add_metric([queue], float(read.parked))
        fair_keys.add_metric([queue], float(read.fair_keys))
        for operation, count, due_ms in read.parked_ops:  # per operation: its keys together, no key label
            by_operation.add_metric([queue, operation], float(count))
            next_token.add_metric([queue, operation], max(0.0, (due_ms - read.now_ms) / 1000))
    yield waiting
    yield age
    yield parked
    yield by_operation
    yield next_token
    yield fair_keys
    if desired is not None:
        wanted = GaugeMetricFamily(
            "fencekit_desired_workers", "Worker processes this host would run now (autoscaling's decision)."
        )
        wanted.add_metric([], float(desired))
        yield wanted


def _history_metrics(last_minute: Mapping[str, HistoryBucket]) -> Iterator[Metric]:
    quantiles = GaugeMetricFamily(
        "fencekit_minute_duration_seconds",
        "Upper bound of the duration bucket holding the quantile of the jobs of the newest complete "
        "minute, over every host (+Inf above the last bucket).",
        labels=["queue", "quantile"],
    )
    depth = GaugeMetricFamily(
        "fencekit_minute_depth",
        "The deepest a queue's pending list was seen in the newest complete minute.",
        labels=["queue"],
    )
    for queue, bucket in sorted(last_minute.items()):
        for q, value in (("0.5", bucket.p50), ("0.95", bucket.p95)):
            if value is not None:
                quantiles.add_metric([queue, q], value)
        depth.add_metric([queue], float(bucket.depth))
    yield quantiles
    yield depth


def _histogram(durations: DurationHistogram) -> Metric:
    buckets = [("+Inf" if math.isinf(b) else repr(b), float(n)) for b, n in durations.cumulative()]
    return HistogramMetricFamily(
        "fencekit_job_duration_seconds",
        "Time spent in perform() per job, in this process.",
        buckets=buckets,
        sum_value=durations.sum,
    )


def _loop_metrics(loops: tuple[LoopView, ...]) -> Iterator[Metric]:
    errors = CounterMetricFamily(
        "fencekit_loop_errors",
        "Unexpected errors a periodic loop logged with their traceback and survived.",
        labels=["loop"],
    )
    alive = GaugeMetricFamily("fencekit_loop_alive", "1 while a periodic loop runs, else 0.", labels=["loop"])
    for loop in loops:
        errors.add_metric([loop.name], float(loop.errors))
        alive.add_metric([loop.name], 1.0 if loop.alive else 0.0)
    yield errors
    yield alive


def _batch_metrics(open_batches: int | None, counts: BatchCounts | None) -> Iterator[Metric]:
    if open_batches is not None:
        gauge = GaugeMetricFamily(
            "fencekit_batches_open", "Batches not finished yet (open, armed or completing), every host's."
        )
        gauge.add_metric([], float(open_batches))
        yield gauge
    if counts is None:
        return
    for name, value, doc in (
        ("batches_finished", counts.finished, "Batches this process finished (callbacks enqueued, closed)."),
        ("batch_notes_applied", counts.applied, "Batch notes this process applied (each child once)."),
        ("batch_notes_malformed", counts.malformed, "Batch notes this process dropped as unreadable."),
    ):
        counter = CounterMetricFamily(f"fencekit_{name}", doc)
        counter.add_metric([], float(value))
        yield counter


def _child_metrics(children: tuple[ChildView, ...]) -> Iterator[Metric]:
    restarts = CounterMetricFamily(
        "fencekit_pool_child_restarts", "Times the pool restarted the child of a slot.", labels=["slot"]
    )
    uptime = GaugeMetricFamily(
        "fencekit_pool_child_uptime_seconds", "Seconds since the child of a slot started.", labels=["slot"]
    )
    stalled = GaugeMetricFamily(
        "fencekit_pool_child_stalled_seconds",
        "Seconds the event loop of a slot's child has not ticked, once past the stall threshold; else 0.",
        labels=["slot"],
    )
    lag = GaugeMetricFamily(
        "fencekit_pool_child_loop_lag_seconds",
        "How late the event loop of a slot's child ran its ticks over the last 2 s (CPU-bound loops).",
        labels=["slot"],
    )
    recycles = CounterMetricFamily(
        "fencekit_pool_child_recycles",
        "Times the child of a slot was replaced on purpose (reason: max_jobs, max_memory); "
        "counted in the restarts too.",
        labels=["slot", "reason"],
    )
    for child in children:
        restarts.add_metric([str(child.slot)], float(child.restarts))
        for reason in ("max_jobs", "max_memory"):
            recycles.add_metric([str(child.slot), reason], float(dict(child.recycles).get(reason, 0)))
        uptime.add_metric([str(child.slot)], child.uptime)
        stalled.add_metric([str(child.slot)], child.stalled_for or 0.0)
        lag.add_metric([str(child.slot)], child.loop_lag)
    yield restarts
    yield recycles
    yield uptime
    yield stalled
    yield lag
    count = GaugeMetricFamily("fencekit_pool_children", "Pool children running now.")
    count.add_metric([], float(len(children)))
    yield count


class RelayCollector:
    """The outbox relay's figures (``outbox_url``), registered by the host that runs it."""

    def __init__(self, stats: RelayStats) -> None:
        self.stats = stats

    def collect(self) -> Iterable[Metric]:
        stats = self.stats
        relayed = CounterMetricFamily("fencekit_outbox_relayed", "Outbox rows this relay enqueued as tasks.")
        relayed.add_metric([], float(stats.relayed))
        yield relayed
        deduped = CounterMetricFamily(
            "fencekit_outbox_deduped",
            "Outbox rows pushed again after a relay stopped before deleting them (enqueued once).",
        )
        deduped.add_metric([], float(stats.deduped))
        yield deduped
        if stats.backlog is not None:
            rows = GaugeMetricFamily(
                "fencekit_outbox_rows", "Committed outbox rows waiting for a relay (counted up to 100,000)."
            )
            rows.add_metric([], float(stats.backlog))
            yield rows
            lag = GaugeMetricFamily(
                "fencekit_outbox_lag_seconds",
                "How long the oldest waiting outbox row has waited (the database's clock), 0 when none.",
            )
            lag.add_metric([], stats.lag)
            yield lag
