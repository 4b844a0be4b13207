"""OpenTelemetry for fencekit: ``otel_hooks()`` (spans) and ``otel_metrics()`` (metrics), each a
:class:`~fencekit.hooks.FenceKitHooks` (``FenceKitHooks.combine`` makes one set of both).

Requires ``pip install 'fencekit-jobs[otel]'`` (``opentelemetry-api``) and a
tracer provider configured by the application (the SDK setup is yours)::

    app = fencekit.App([AnalyseGame], hooks=otel_hooks())
    client = fencekit.Client(url, hooks=otel_hooks())

What is traced:

- the primitives, as in fencekit 0.6.1 (same span names): ``fencekit.idempotency.begin``,
  ``.outcome``, ``.done``, ``fencekit.lock.acquire``, ``.acquire_failed``,
  ``.release``, ``fencekit.fence.advance``, ``fencekit.fence.reject``;
- a job, across processes: ``fencekit.enqueue <queue>`` (PRODUCER) in the
  producer, a child of the span current there (the web request); its W3C
  ``traceparent`` travels in the task's envelope, so in the worker
  ``fencekit.claim <queue>`` (from the claim sent to the start),
  ``fencekit.perform <queue>/<operation>`` (CONSUMER; current while
  ``perform`` runs, so spans the job opens are its children) and
  ``fencekit.ack <queue>`` (from the return to Redis accepting the ack) are
  children of that enqueue span;
- failures and retries set the perform span's status to ERROR with the
  exception recorded; a fenced-out delivery, a cancel, a return at a stop and
  a reap are span events (``fenced_out``, ``cancelled``, ``returned``,
  ``reaped``), a reap on a ``fencekit.reap <queue>`` span of the task's trace.

The spans of one process are kept until they end; a bound (``MAX_OPEN``)
drops the oldest should a stage never report (a producer that crashed
between encoding and sending).

``otel_metrics()``: counters of finished, failed, retried and fenced-out jobs, the
``fencekit.job.duration`` histogram, and the ``fencekit.jobs.in_flight`` and
``fencekit.queue.backlog`` gauges (:class:`OtelMetrics` has the names, units and
attributes, and how the backlog is read).
"""

from __future__ import annotations

import importlib.util
from collections import OrderedDict
from typing import Any

from fencekit.hooks import FenceKitHooks, JobEvent, key_label
from fencekit.integrations._otel_metrics import OtelMetrics
from fencekit.primitives.tokens import BeginOutcome

__all__ = ["MAX_OPEN", "OtelMetrics", "otel_hooks", "otel_metrics"]

MAX_OPEN = 100_000
"""Spans of one process waiting for their end; past this the oldest are dropped unended."""


def otel_hooks(*, tracer_name: str = "fencekit", tracer_provider: Any = None) -> FenceKitHooks:
    """Hooks that record OpenTelemetry spans (see the module docstring).

    ``tracer_provider``: the provider to take the tracer from (default: the
    global one, ``opentelemetry.trace.get_tracer_provider()``).
    """
    _require_api()
    return _Tracing(tracer_name, tracer_provider).hooks()


def otel_metrics(
    meter_provider: Any = None, *, meter_name: str = "fencekit", backlog_interval: float = 15.0
) -> OtelMetrics:
    """Hooks that record OpenTelemetry metrics; ``FenceKitHooks.combine`` them with :func:`otel_hooks`.

    ``meter_provider``: the provider to take the meter from (default: the global
    one, ``opentelemetry.metrics.get_meter_provider()``). The backlog gauge needs
    :meth:`OtelMetrics.start_backlog`/:meth:`~OtelMetrics.stop_backlog` registered as
    startup/shutdown hooks of one process; it then reads Redis every ``backlog_interval`` s.
    """
    _require_api()
    if not backlog_interval > 0:
        raise ValueError(f"backlog_interval must be > 0, got {backlog_interval!r}")
    from opentelemetry import metrics

    return OtelMetrics(metrics.get_meter(meter_name, meter_provider=meter_provider), backlog_interval)


def _require_api() -> None:
    if importlib.util.find_spec("opentelemetry") is None:
        raise ImportError(
            "fencekit.integrations.otel needs the otel extra: pip install 'fencekit-jobs[otel]'"
        ) from None


class _Tracing:
    """The tracer and the open spans behind one set of hooks."""

    def __init__(self, tracer_name: str, tracer_provider: Any) -> None:
        from opentelemetry import context, propagate, trace

        self.trace = trace
        self.context = context
        self.propagator = propagate.get_global_textmap()
        self.tracer = trace.get_tracer(tracer_name, tracer_provider=tracer_provider)
        self.enqueues: OrderedDict[str, Any] = OrderedDict()  # jid -> enqueue span
        self.runs: OrderedDict[tuple[str, int], Any] = OrderedDict()  # (queue, token) -> perform span

    # helpers ------------------------------------------------------------------------
    def _remember(self, table: OrderedDict[Any, Any], key: Any, span: Any) -> None:
        table[key] = span
        while len(table) > MAX_OPEN:
            table.popitem(last=False)

    def _parent(self, event: JobEvent) -> Any:
        """The context the task's trace carries (an empty one: a new trace)."""
        if event.trace is None:
            return self.context.Context()
        return self.propagator.extract({"traceparent": event.trace})

    @staticmethod
    def _attributes(event: JobEvent) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "messaging.system": "fencekit",
            "messaging.destination.name": event.queue,
            "fencekit.operation": event.operation,
            "fencekit.attempt": event.attempt,
        }
        if event.jid is not None:
            attributes["messaging.message.id"] = event.jid
        if event.token is not None:
            attributes["fencekit.token"] = event.token
        return attributes

    def _short(self, name: str, attributes: dict[str, Any]) -> None:
        with self.tracer.start_as_current_span(name, attributes=attributes):
            pass

    def _fail(self, span: Any, event: JobEvent, description: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        if event.error is not None:
            span.record_exception(event.error)
        span.set_status(Status(StatusCode.ERROR, description))

    def _end_run(self, event: JobEvent, end_ns: int | None) -> tuple[Any, int]:
        """The perform span of ``event`` (one made now when it never started), ended at ``end_ns``."""
        span = self.runs.pop((event.queue, event.token or 0), None)
        if span is None:
            span = self.tracer.start_span(
                f"fencekit.perform {event.queue}/{event.operation}",
                context=self._parent(event),
                kind=self.trace.SpanKind.CONSUMER,
                attributes=self._attributes(event),
                start_time=event.started_ns or event.at_ns,
            )
        return span, end_ns or event.at_ns

    # the queue's callbacks ----------------------------------------------------------
    def trace_enqueue(self, queue: str, operation: str, jid: str) -> str | None:
        span = self.tracer.start_span(
            f"fencekit.enqueue {queue}",
            kind=self.trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": "fencekit",
                "messaging.destination.name": queue,
                "fencekit.operation": operation,
                "messaging.message.id": jid,
            },
        )
        self._remember(self.enqueues, jid, span)
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=self.trace.set_span_in_context(span))
        return carrier.get("traceparent")

    def on_enqueued(self, event: JobEvent) -> None:
        span = self.enqueues.pop(event.jid or "", None)
        if span is None:
            return
        if event.error is not None:
            self._fail(span, event, f"enqueue refused: {type(event.error).__name__}")
        span.end(end_time=event.at_ns)

    def on_started(self, event: JobEvent) -> None:
        parent = self._parent(event)
        attributes = self._attributes(event)
        consumer = self.trace.SpanKind.CONSUMER
        self.tracer.start_span(
            f"fencekit.claim {event.queue}", parent, consumer, attributes, start_time=event.claimed_ns
        ).end(end_time=event.started_ns)
        name = f"fencekit.perform {event.queue}/{event.operation}"
        run = self.tracer.start_span(name, parent, consumer, attributes, start_time=event.started_ns)
        self._remember(self.runs, (event.queue, event.token or 0), run)
        # Called in the job's own task: its context copy makes the span current for perform only.
        self.context.attach(self.trace.set_span_in_context(run))

    def on_succeeded(self, event: JobEvent) -> None:
        run, end = self._end_run(event, event.finished_ns)
        run.end(end_time=end)
        ack = self.tracer.start_span(
            f"fencekit.ack {event.queue}",
            context=self._parent(event),
            attributes=self._attributes(event),
            start_time=end,
        )
        ack.end(end_time=event.at_ns)

    def on_failed(self, event: JobEvent) -> None:
        run, end = self._end_run(event, event.finished_ns)
        self._fail(run, event, "failed")
        run.end(end_time=end)

    def on_retried(self, event: JobEvent) -> None:
        run, end = self._end_run(event, event.finished_ns)
        self._fail(run, event, "failed, retried")
        if event.delay is not None:
            run.set_attribute("fencekit.retry_delay", event.delay)
        run.end(end_time=end)

    def _event_end(self, event: JobEvent, name: str) -> None:
        run, end = self._end_run(event, event.finished_ns)
        run.add_event(name, {"fencekit.token": event.token or 0}, timestamp=event.at_ns)
        if name == "fenced_out":
            self._fail(run, event, "fenced out: the delivery was reaped or returned while it ran")
        run.end(end_time=max(end, event.at_ns))

    def on_fenced_out(self, event: JobEvent) -> None:
        self._event_end(event, "fenced_out")

    def on_cancelled(self, event: JobEvent) -> None:
        self._event_end(event, "cancelled")

    def on_returned(self, event: JobEvent) -> None:
        self._event_end(event, "returned")

    def on_reaped(self, event: JobEvent) -> None:
        span = self.tracer.start_span(
            f"fencekit.reap {event.queue}",
            context=self._parent(event),
            attributes=self._attributes(event),
            start_time=event.at_ns,
        )
        span.add_event("reaped", {"fencekit.token": event.token or 0}, timestamp=event.at_ns)
        span.end(end_time=event.at_ns)

    # the primitives' (0.6.1's span names) -------------------------------------------
    def hooks(self) -> FenceKitHooks:
        short = self._short
        idem, lock, fence = "fencekit.idempotency.key", "fencekit.lock.resource", "fencekit.fence.resource"
        token = "fencekit.fence.token"
        return FenceKitHooks(
            on_idempotency_begin=lambda k, won: short(
                "fencekit.idempotency.begin", {idem: key_label(k), "fencekit.idempotency.won": won}
            ),
            on_idempotency_outcome=lambda k, outcome: short(
                "fencekit.idempotency.outcome",
                {idem: key_label(k), "fencekit.begin.outcome": _value(outcome)},
            ),
            on_idempotency_done=lambda k, stored: short(
                "fencekit.idempotency.done",
                {idem: key_label(k), "fencekit.idempotency.stored_result": stored},
            ),
            on_lock_acquired=lambda r, t: short("fencekit.lock.acquire", {lock: r, token: t}),
            on_lock_acquire_failed=lambda r: short("fencekit.lock.acquire_failed", {lock: r}),
            on_lock_released=lambda r: short("fencekit.lock.release", {lock: r}),
            on_fence_rejected=lambda r, t: short("fencekit.fence.reject", {fence: r, token: t}),
            on_fence_advanced=lambda r, t: short("fencekit.fence.advance", {fence: r, token: t}),
            on_enqueued=self.on_enqueued,
            on_started=self.on_started,
            on_succeeded=self.on_succeeded,
            on_failed=self.on_failed,
            on_retried=self.on_retried,
            on_fenced_out=self.on_fenced_out,
            on_cancelled=self.on_cancelled,
            on_returned=self.on_returned,
            on_reaped=self.on_reaped,
            trace_enqueue=self.trace_enqueue,
        )


def _value(outcome: BeginOutcome) -> str:
    return str(outcome.value)
