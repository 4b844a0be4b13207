"""``otel_metrics`` (fencekit.integrations.otel) on the SDK's in-memory reader, a real Redis and Server.

Each test gives ``otel_metrics`` a ``MeterProvider`` of its own (never the global one) and
reads it with ``InMemoryMetricReader``: exact counter values per queue and operation for
tasks that succeed, fail for good, are retried and are fenced out; the duration histogram
per outcome; the in-flight gauge while tasks wait on an ``asyncio.Event`` and after; the
backlog gauge read by ``start_backlog``. Without a configured SDK the hooks work and show
nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import metrics
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from tests.docs_blocks import block_with, with_url
from tests.queue_helpers import eventually, new_server, reaped_while_running, running, worker

from fencekit import Client, FenceKitHooks, JobEvent, Task, current_job
from fencekit.integrations.otel import otel_metrics

QUEUE, OPERATION, OUTCOME = "messaging.destination.name", "fencekit.operation", "fencekit.outcome"


@pytest.fixture
def meter() -> Iterator[tuple[MeterProvider, InMemoryMetricReader]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield provider, reader
    provider.shutdown()


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    """Metric name -> its data points, collected now."""
    out: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def counts(found: dict[str, list[Any]], name: str) -> dict[tuple[str, str], int]:
    """(queue, operation) -> the counter's value."""
    return {(p.attributes[QUEUE], p.attributes[OPERATION]): p.value for p in found.get(name, ())}


def gauge(reader: InMemoryMetricReader, name: str) -> dict[str, int]:
    """Queue -> the gauge's reading, collected now."""
    return {p.attributes[QUEUE]: p.value for p in points(reader).get(name, ())}


async def test_outcomes_are_counted_and_timed_by_queue_and_operation(
    redis_url: str, meter: tuple[MeterProvider, InMemoryMetricReader]
) -> None:
    provider, reader = meter
    hooks = otel_metrics(provider)

    async def ok(payload: dict[str, Any]) -> str:
        return "ok"

    async def bad(payload: dict[str, Any]) -> None:
        raise ValueError("for good")

    async def flaky(payload: dict[str, Any]) -> str:
        if current_job().attempt == 0:
            raise RuntimeError("once")
        return "ok"

    workers = [worker("omo", "ok", ok), worker("omo", "bad", bad, retry=False)]
    server = new_server(redis_url, *workers, worker("omo", "flaky", flaky, retry_count=1), hooks=hooks)
    async with Client(redis_url=redis_url) as client, running(server):
        for operation in ("ok", "bad", "flaky"):
            await client.enqueue(Task("omo", operation, {}))
        settled = {("omo", "ok"): 1, ("omo", "flaky"): 1}
        await eventually(
            lambda: counts(points(reader), "fencekit.jobs.finished") == settled, timeout=15, what="acks"
        )
        await eventually(lambda: counts(points(reader), "fencekit.jobs.failed"), what="the failure")
    await reaped_while_running(
        redis_url, "omf", hooks, lambda: ("omf", "slow") in counts(points(reader), "fencekit.jobs.finished")
    )
    found = points(reader)
    assert counts(found, "fencekit.jobs.finished") == {
        ("omo", "ok"): 1,
        ("omo", "flaky"): 1,
        ("omf", "slow"): 1,
    }
    assert counts(found, "fencekit.jobs.failed") == {("omo", "bad"): 1}
    assert counts(found, "fencekit.jobs.retried") == {("omo", "flaky"): 1}
    assert counts(found, "fencekit.jobs.fenced_out") == {("omf", "slow"): 1}
    durations = {
        (p.attributes[QUEUE], p.attributes[OPERATION], p.attributes[OUTCOME]): p
        for p in found["fencekit.job.duration"]
    }
    assert {key: p.count for key, p in durations.items()} == {
        ("omo", "ok", "succeeded"): 1,
        ("omo", "bad", "failed"): 1,
        ("omo", "flaky", "retried"): 1,
        ("omo", "flaky", "succeeded"): 1,
        ("omf", "slow", "fenced_out"): 1,
        ("omf", "slow", "succeeded"): 1,
    }
    assert all(0 <= p.sum < 10 for p in durations.values())
    assert gauge(reader, "fencekit.jobs.in_flight") == {"omo": 0, "omf": 0}
    assert gauge(reader, "fencekit.queue.backlog") == {}  # nothing reads it here


async def test_the_gauges_read_the_running_tasks_and_the_backlog(
    redis_url: str, meter: tuple[MeterProvider, InMemoryMetricReader]
) -> None:
    provider, reader = meter
    hooks = otel_metrics(provider, backlog_interval=0.05)
    gate = asyncio.Event()

    async def hold(payload: dict[str, Any]) -> None:
        await gate.wait()

    server = new_server(redis_url, worker("omg", "hold", hold), hooks=hooks, concurrency=2)
    server.on_startup(hooks.start_backlog)
    server.on_shutdown(hooks.stop_backlog)
    async with Client(redis_url=redis_url) as client, running(server):
        await client.enqueue(Task("omg-idle", "nobody", {}))  # a queue no one serves
        await client.enqueue_many([Task("omg", "hold", {}) for _ in range(3)])
        await eventually(lambda: gauge(reader, "fencekit.jobs.in_flight") == {"omg": 2}, what="two running")
        await eventually(
            lambda: gauge(reader, "fencekit.queue.backlog") == {"omg": 1, "omg-idle": 1}, what="the backlog"
        )
        gate.set()
        await eventually(lambda: counts(points(reader), "fencekit.jobs.finished") == {("omg", "hold"): 3})
        assert gauge(reader, "fencekit.jobs.in_flight") == {"omg": 0}
        await eventually(lambda: gauge(reader, "fencekit.queue.backlog") == {"omg": 0, "omg-idle": 1})
    assert gauge(reader, "fencekit.queue.backlog") == {}  # stop_backlog: no reading past the stop


async def test_stop_backlog_ends_when_the_reader_loses_its_first_cancel(
    meter: tuple[MeterProvider, InMemoryMetricReader], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader's ``asyncio.wait_for`` swallows a cancel that meets a reply on Python < 3.12; a CI
    run's Server then never stopped. Here the reader loses its first cancel on purpose: the stop
    cancels it again and ends, where a single cancel and an endless wait would hang."""
    hooks = otel_metrics(meter[0], backlog_interval=0.01)
    cancels = []

    async def swallowing(client: object) -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                cancels.append(1)
                if len(cancels) == 1:
                    continue  # lost, as wait_for loses it
                raise

    monkeypatch.setattr(hooks, "_read_backlog", swallowing)
    await hooks.start_backlog(None)  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    await asyncio.wait_for(hooks.stop_backlog(), 30)
    assert len(cancels) == 2
    assert hooks._reader is None


def test_without_a_configured_sdk_the_metrics_cost_nothing_visible(caplog: pytest.LogCaptureFixture) -> None:
    # The global provider of this test process is the API's default (no SDK set up).
    assert not isinstance(metrics.get_meter_provider(), MeterProvider)
    threads = threading.active_count()
    event = JobEvent("q", "op", "jid-1", 1, 7, started_ns=1_000, finished_ns=2_000, at_ns=3_000)
    with caplog.at_level(logging.DEBUG):
        for hooks in (otel_metrics(), otel_metrics(NoOpMeterProvider())):
            assert hooks.trace_enqueue is None  # producers pay nothing
            assert hooks.on_enqueued is None
            for stage in ("started", "succeeded", "started", "failed", "retried", "fenced_out", "returned"):
                hooks.job(stage, event)
            assert hooks._errors == {}
    assert caplog.records == []
    assert threading.active_count() == threads


def test_combine_calls_each_set_in_turn_and_keeps_a_raising_one_apart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[JobEvent] = []
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    def boom(event: JobEvent) -> None:
        raise RuntimeError("boom")

    first = FenceKitHooks(on_started=boom, trace_enqueue=lambda queue, operation, jid: None)
    second = FenceKitHooks(
        on_started=seen.append, on_failed=seen.append, trace_enqueue=lambda *a: traceparent
    )
    both = FenceKitHooks.combine(first, None, second)
    event = JobEvent("q", "op", "jid-1")
    with caplog.at_level(logging.WARNING, logger="fencekit.hooks"):
        both.job("started", event)
    assert seen == [event]
    assert first._errors == {"on_started": 1}
    assert both._errors == {}
    assert both.on_failed is second.on_failed  # one set: its own callback, no wrapper
    assert both.on_succeeded is None
    assert both.on_lock_acquired is None
    assert both.trace_of("q", "op", "jid-1") == traceparent
    assert FenceKitHooks.combine().trace_enqueue is None


async def test_the_hooks_pages_metrics_example(redis_url: str) -> None:
    namespace: dict[str, Any] = {}
    exec(with_url(block_with("metrics.start_backlog"), redis_url), namespace)
    server, reader = namespace["server"], namespace["reader"]

    async def build(payload: dict[str, Any]) -> str:
        return "built"

    server.add_workers(worker("reports", "build", build))
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("reports", "build", {}))
        assert await client.result(jid, timeout=10) == "built"
        await eventually(
            lambda: counts(points(reader), "fencekit.jobs.finished") == {("reports", "build"): 1}
        )
        await eventually(lambda: "reports" in gauge(reader, "fencekit.queue.backlog"), what="the backlog")
    assert namespace["app"].hooks.trace_enqueue is not None  # the spans too
    namespace["provider"].shutdown()
