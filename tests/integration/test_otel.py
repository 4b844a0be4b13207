"""fencekit.integrations.otel on the OpenTelemetry SDK's in-memory exporter, with a real Redis and Server.

A job's spans must form one trace with the request that enqueued it: the
W3C ``traceparent`` travels through Redis inside the task's envelope, so
``claim``, ``perform`` and ``ack`` are children of the producer's
``enqueue`` span, which is a child of the request's span; a span the job
opens is a child of ``perform``. Failures, retries, fenced-out and reaped
deliveries show as span status and span events.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from tests.queue_helpers import eventually, new_server, reaped_while_running, running, worker

from fencekit import Client, DistributedLock, FencedOutError, FenceGate, FenceToken, Task, current_job
from fencekit.integrations.otel import otel_hooks
from fencekit.jobs import codec


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def by_name(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def one(exporter: InMemorySpanExporter, prefix: str) -> ReadableSpan:
    (span,) = by_name(exporter, prefix)
    return span


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_a_jobs_spans_are_children_of_the_request_that_enqueued_it(
    redis_url: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    hooks = otel_hooks(tracer_provider=provider)
    tracer = provider.get_tracer("test")

    async def perform(payload: dict[str, Any]) -> str:
        with tracer.start_as_current_span("inside the job"):
            return f"analysed {payload['game']}"

    server = new_server(redis_url, worker("ot", "analyse", perform), hooks=hooks)
    async with Client(redis_url=redis_url, hooks=hooks) as client, running(server):
        with tracer.start_as_current_span("POST /games") as request:
            jid = await client.enqueue(Task("ot", "analyse", {"game": 7}))
        await eventually(lambda: by_name(exporter, "fencekit.ack"), what="the ack span")
    request_ctx = request.get_span_context()
    enqueue = one(exporter, "fencekit.enqueue ot")
    claim = one(exporter, "fencekit.claim ot")
    run = one(exporter, "fencekit.perform ot/analyse")
    ack = one(exporter, "fencekit.ack ot")
    inner = one(exporter, "inside the job")
    trace_ids = {s.context.trace_id for s in (enqueue, claim, run, ack, inner)}
    assert trace_ids == {request_ctx.trace_id}
    assert parent_of(enqueue) == request_ctx.span_id
    assert parent_of(claim) == parent_of(run) == parent_of(ack) == enqueue.context.span_id
    assert parent_of(inner) == run.context.span_id
    assert (enqueue.kind, run.kind) == (SpanKind.PRODUCER, SpanKind.CONSUMER)
    assert run.attributes is not None
    assert run.attributes["messaging.message.id"] == jid
    assert run.attributes["messaging.destination.name"] == "ot"
    assert run.attributes["fencekit.token"] > 0
    assert run.status.status_code is StatusCode.UNSET
    assert enqueue.end_time is not None
    assert claim.start_time is not None
    assert claim.end_time == run.start_time
    assert run.end_time is not None
    assert ack.start_time is not None
    assert ack.end_time is not None
    assert run.end_time <= ack.start_time <= ack.end_time


async def test_the_envelope_carries_the_traceparent_through_redis_and_retries(
    redis_url: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    hooks = otel_hooks(tracer_provider=provider)

    async def perform(payload: dict[str, Any]) -> None:
        if current_job().attempt == 0:
            raise ValueError("first attempt fails")

    async with Client(redis_url=redis_url, hooks=hooks) as client:
        jid = await client.enqueue(Task("otr", "flaky", {}))
    r = redis.Redis.from_url(redis_url)
    try:
        (raw,) = r.lrange("fencekit:{otr}:pending", 0, -1)
    finally:
        r.close()
    stored = codec.decode(raw)
    enqueue = one(exporter, "fencekit.enqueue otr")
    version, trace_id, span_id, flags = str(stored.trace).split("-")
    assert version == "00"
    assert int(flags, 16) & 1  # sampled
    assert int(trace_id, 16) == enqueue.context.trace_id
    assert int(span_id, 16) == enqueue.context.span_id
    assert stored.next_attempt(1) == stored._replace(attempt=1).encode()
    assert codec.decode(stored.next_attempt(1)).trace == stored.trace  # a retry keeps its trace

    server = new_server(redis_url, worker("otr", "flaky", perform, retry_count=1), hooks=hooks)
    async with running(server):
        await eventually(lambda: len(by_name(exporter, "fencekit.perform")) == 2, timeout=15)
    first, second = sorted(by_name(exporter, "fencekit.perform"), key=lambda s: s.start_time or 0)
    assert first.status.status_code is StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception"]
    assert first.attributes is not None
    assert first.attributes["fencekit.retry_delay"] == pytest.approx(1.0)
    assert second.status.status_code is StatusCode.UNSET
    assert {parent_of(first), parent_of(second)} == {enqueue.context.span_id}
    assert first.attributes["messaging.message.id"] == jid


async def test_fenced_out_and_reaped_deliveries_are_span_events(
    redis_url: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    hooks = otel_hooks(tracer_provider=provider)
    await reaped_while_running(redis_url, "otf", hooks, lambda: by_name(exporter, "fencekit.ack"), hooks)
    enqueue = one(exporter, "fencekit.enqueue otf")
    reap = one(exporter, "fencekit.reap otf")
    assert [e.name for e in reap.events] == ["reaped"]
    assert parent_of(reap) == enqueue.context.span_id
    fenced, ok = sorted(by_name(exporter, "fencekit.perform"), key=lambda s: s.start_time or 0)
    assert [e.name for e in fenced.events] == ["fenced_out"]
    assert fenced.status.status_code is StatusCode.ERROR
    assert ok.status.status_code is StatusCode.UNSET


def test_the_primitives_spans_keep_the_0_6_1_names(
    spans: tuple[TracerProvider, InMemorySpanExporter], redis_url: str
) -> None:
    provider, exporter = spans
    hooks = otel_hooks(tracer_provider=provider)
    client = redis.Redis.from_url(redis_url)
    try:
        lock = DistributedLock(client, prefix="otp", hooks=hooks)
        gate = FenceGate(client, prefix="otp", hooks=hooks)
        with lock.hold("res", ttl=timedelta(seconds=5)) as handle:
            gate.set_if_fresh(handle.token, "{res}:v", "1")
            with pytest.raises(FencedOutError):
                gate.check_and_advance(FenceToken(handle.token.value - 1, "res"))
    finally:
        client.close()
    names = [s.name for s in exporter.get_finished_spans()]
    assert names == [
        "fencekit.lock.acquire",
        "fencekit.fence.advance",
        "fencekit.fence.reject",
        "fencekit.lock.release",
    ]
    acquire = exporter.get_finished_spans()[0]
    assert acquire.attributes is not None
    assert acquire.attributes["fencekit.fence.token"] == handle.token.value


def test_without_a_configured_sdk_nothing_is_carried() -> None:
    # The global provider of this test process is the API's default (no SDK set up): its
    # no-op spans have invalid contexts, which are not propagated.
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)
    hooks = otel_hooks()
    assert hooks.trace_enqueue is not None
    assert hooks.trace_of("q", "op", "jid-1") is None
