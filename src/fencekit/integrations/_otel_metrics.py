"""OpenTelemetry metrics for fencekit: :class:`OtelMetrics`, made by ``otel.otel_metrics()``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fencekit._aio.scope import TaskScope
from fencekit.hooks import FenceKitHooks, JobEvent

if TYPE_CHECKING:
    from fencekit.produce.client import Client

__all__ = ["BACKLOG_TIMEOUT", "DURATION_BUCKETS", "OtelMetrics"]

QUEUE, OPERATION, OUTCOME = "messaging.destination.name", "fencekit.operation", "fencekit.outcome"

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)
"""The bucket bounds (s) ``fencekit.job.duration`` advises (API >= 1.23; a view may override them)."""

BACKLOG_TIMEOUT = 5.0
"""Seconds one backlog reading may take before it counts as failed (the gauge then reports none)."""

_log = logging.getLogger("fencekit.otel")


class OtelMetrics(FenceKitHooks):
    """:class:`~fencekit.hooks.FenceKitHooks` that record OpenTelemetry metrics, and the backlog reader.

    Made by :func:`~fencekit.integrations.otel.otel_metrics`. The instruments, on the meter
    ``fencekit`` of the given (else the global) meter provider:

    - counters (unit ``{job}``, attributes ``messaging.destination.name`` (the queue) and
      ``fencekit.operation``): ``fencekit.jobs.finished`` (succeeded: the ack landed),
      ``fencekit.jobs.failed`` (for good: retries spent, a timeout, a dead letter),
      ``fencekit.jobs.retried`` (a retry was scheduled) and ``fencekit.jobs.fenced_out``
      (Redis refused the outcome: the delivery was reaped or returned while it ran);
    - the histogram ``fencekit.job.duration`` (unit ``s``; the same attributes and
      ``fencekit.outcome``: succeeded, failed, retried, fenced_out, cancelled, returned,
      interrupted): how long ``perform`` ran, for every run that started;
    - the observable gauge ``fencekit.jobs.in_flight`` (per queue): the jobs of this process
      started and not ended yet, counted by the hooks themselves (started, then an outcome);
    - the observable gauge ``fencekit.queue.backlog`` (per queue): tasks that could run now,
      pending plus due scheduled, as ``/metrics``' ``fencekit_queue_backlog``. Hooks see no
      Redis, so this one needs the process to read it: register
      :meth:`OtelMetrics.start_backlog` and :meth:`OtelMetrics.stop_backlog` as startup and
      shutdown hooks of *one* process (a ``Server``'s ``on_startup``/``on_shutdown``; a
      pool's ``App(on_pool_startup=..., on_pool_shutdown=...)``, which run in the
      supervisor only). It then reads every queue's backlog each ``backlog_interval``
      seconds in one round trip on the event loop, and the gauge reports the last reading:
      an export never waits on Redis. A process that does not read it reports no backlog.

    The gauges' callbacks run in the SDK's export thread and only copy numbers the event
    loop keeps. A settle Redis answered with an error (not a refusal, which is
    ``fenced_out``) stays counted in flight, as Redis keeps the delivery in flight for the
    reaper.
    """

    def __init__(self, meter: Any, backlog_interval: float) -> None:
        from opentelemetry.metrics import Observation

        self._observation = Observation
        self.backlog_interval = backlog_interval
        job = "{job}"
        self._counters = {  # outcome -> its counter (not attributes: FenceKitHooks has _failed)
            outcome: meter.create_counter(f"fencekit.jobs.{name}", unit=job, description=text)
            for outcome, name, text in (
                ("succeeded", "finished", "Jobs that succeeded (their ack landed)."),
                ("failed", "failed", "Jobs that failed for good."),
                ("retried", "retried", "Failed runs whose retry was scheduled."),
                ("fenced_out", "fenced_out", "Outcomes Redis refused: reaped or returned while running."),
            )
        }
        self._duration = _histogram(meter)
        meter.create_observable_gauge(
            "fencekit.jobs.in_flight",
            callbacks=[self._observe_in_flight],
            unit=job,
            description="Jobs of this process started and not ended yet.",
        )
        meter.create_observable_gauge(
            "fencekit.queue.backlog",
            callbacks=[self._observe_backlog],
            unit=job,
            description="Tasks that could run now: pending plus due scheduled.",
        )
        self._open: set[tuple[str, int]] = set()  # (queue, token) of the jobs started here
        self._in_flight: dict[str, int] = {}  # queue -> started, not ended (kept at 0)
        self._backlog: dict[str, int] = {}  # replaced whole by each reading
        self._reader: asyncio.Task[None] | None = None
        # the reader's owner: a close cancels it again should a cancel be lost in its
        # asyncio.wait_for (Python < 3.12 swallows one that meets a reply; a Server's stop hung)
        self._scope = TaskScope("otel metrics backlog", logger=_log)
        super().__init__(
            on_started=self._started,
            on_succeeded=lambda e: self._ended(e, "succeeded"),
            on_failed=lambda e: self._ended(e, "failed"),
            on_retried=lambda e: self._ended(e, "retried"),
            on_fenced_out=lambda e: self._ended(e, "fenced_out"),
            on_cancelled=lambda e: self._ended(e, "cancelled"),
            on_returned=lambda e: self._ended(e, "returned"),
            on_interrupted=lambda e: self._ended(e, "interrupted"),
        )

    # the hooks ------------------------------------------------------------------------
    def _started(self, event: JobEvent) -> None:
        key = (event.queue, event.token or 0)
        if key not in self._open:
            self._open.add(key)
            self._in_flight[event.queue] = self._in_flight.get(event.queue, 0) + 1

    def _ended(self, event: JobEvent, outcome: str) -> None:
        attributes = {QUEUE: event.queue, OPERATION: event.operation}
        counter = self._counters.get(outcome)
        if counter is not None:
            counter.add(1, attributes)
        if event.started_ns is not None and event.finished_ns is not None:
            seconds = max(0, event.finished_ns - event.started_ns) / 1e9
            self._duration.record(seconds, {**attributes, OUTCOME: outcome})
        key = (event.queue, event.token or 0)
        if key in self._open:
            self._open.discard(key)
            self._in_flight[event.queue] -= 1

    # the gauges (called in the SDK's export thread) -------------------------------------
    def _observe_in_flight(self, options: Any) -> Iterable[Any]:
        return [self._observation(n, {QUEUE: q}) for q, n in list(self._in_flight.items())]

    def _observe_backlog(self, options: Any) -> Iterable[Any]:
        return [self._observation(n, {QUEUE: q}) for q, n in self._backlog.items()]

    # the backlog reader -----------------------------------------------------------------
    async def start_backlog(self, client: Client) -> None:
        """A startup hook: read every queue's backlog now and each ``backlog_interval`` s after.

        Register it in one process only (``server.on_startup(metrics.start_backlog)``, or
        ``App(on_pool_startup=[metrics.start_backlog])``), with :meth:`stop_backlog` as
        the matching shutdown hook.
        """
        await self.stop_backlog()
        self._reader = self._scope.start(self._read_backlog(client), name="fencekit-otel-backlog")

    async def stop_backlog(self) -> None:
        """A shutdown hook: stop reading the backlog; the gauge reports none from here on."""
        self._reader = None
        await self._scope.aclose()
        self._backlog = {}

    async def _read_backlog(self, client: Client) -> None:
        from fencekit.services.backlog import read_backlog

        failing = False
        while True:
            try:
                queues = await asyncio.wait_for(client.queues(), BACKLOG_TIMEOUT)
                read = await asyncio.wait_for(
                    read_backlog(client.redis, client.keys, queues), BACKLOG_TIMEOUT
                )
            except Exception as exc:  # Redis down or slow: no reading rather than a stale one
                self._backlog = {}
                if not failing:
                    _log.warning("otel metrics: could not read the backlog: %s: %s", type(exc).__name__, exc)
                failing = True
            else:
                self._backlog = {queue: backlog.total for queue, backlog in read.items()}
                if failing:
                    _log.info("otel metrics: the backlog is read again")
                failing = False
            await asyncio.sleep(self.backlog_interval)


def _histogram(meter: Any) -> Any:
    name, description = "fencekit.job.duration", "How long perform ran, by outcome."
    try:
        return meter.create_histogram(
            name, unit="s", description=description, explicit_bucket_boundaries_advisory=DURATION_BUCKETS
        )
    except TypeError:  # opentelemetry-api before 1.23: no advisory
        return meter.create_histogram(name, unit="s", description=description)
