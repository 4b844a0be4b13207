"""The kickdown README's examples, run unchanged against fencekit (seed 004), and the
behaviours its prose promises: Queue handle semantics, lifecycle hooks, logging.

Outcomes are read from Redis directly (tests/queue_helpers.py), not from the
queue's own accessors, except where the accessor itself is under test.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import pytest
from tests.queue_helpers import (
    BEATS,
    CONSUMERS,
    capture_logger,
    eventually,
    inflight_count,
    messages,
    new_server,
    pending,
    qkey,
    running,
    scheduled,
    stats,
)
from tests.servers import direct

import fencekit
from fencekit import Client, ConfigError, Queue, Server, StoreError, Task, Worker


@pytest.fixture
def r(redis_url: str) -> Any:
    client = direct(redis_url)
    yield client
    client.close()


def test_the_public_names_of_the_seed_are_importable() -> None:
    for name in ("Client", "Server", "Task", "Queue", "Worker", "StoreError"):
        assert hasattr(fencekit, name), name


# -- "Defining a worker" / "Running the server" / "Enqueueing jobs" ------------------------


def test_the_running_the_server_example_runs_unchanged(redis_url: str, r: Any) -> None:
    """``asyncio.run(server.run())`` as in the README; a startup hook enqueues, the last task stops it."""
    done: list[str] = []

    class SendEmailWorker:
        queue = "emails"
        operation = "send_email"

        @classmethod
        async def perform(cls, payload: dict) -> None:
            recipient = payload["to"]
            done.append(recipient)
            if len(done) == 2:
                server.stop()

    class ExportReportWorker:
        queue = "reports"
        operation = "export"

        def __init__(self) -> None:
            self.exported: list[Any] = []

        async def perform(self, payload: dict) -> None:
            self.exported.append(payload["id"])
            done.append(f"report-{payload['id']}")
            if len(done) == 2:
                server.stop()

    exporter = ExportReportWorker()
    server = Server(
        redis_url=redis_url,  # or redis+sentinel://..., see below
        concurrency=5,  # optional, default: 1 - max tasks processed concurrently
    )
    server.add_workers(SendEmailWorker, exporter)

    @server.on_startup
    async def enqueue_work() -> None:
        task = Task(queue="emails", operation="send_email", params={"to": "user@example.com"})
        await server.enqueue(task)
        await server.enqueue(Task(queue="reports", operation="export", params={"id": 7}))

    asyncio.run(server.run())

    assert sorted(done) == ["report-7", "user@example.com"]
    assert exporter.exported == [7]
    assert stats(r, "emails")["processed"] == 1
    assert stats(r, "reports")["processed"] == 1
    assert r.llen(qkey("emails", "pending")) == 0
    assert inflight_count(r, "emails") == 0
    # run() returned: the consumer deregistered itself.
    assert r.hlen(CONSUMERS) == 0
    assert r.zcard(BEATS) == 0


async def test_client_enqueue_returns_a_time_sortable_uuid7_jid(redis_url: str, r: Any) -> None:
    client = Client(redis_url=redis_url)
    task = Task(
        queue="emails",
        operation="send_email",
        params={"to": "user@example.com"},
    )
    jid = await client.enqueue(task)
    assert uuid.UUID(jid).version == 7
    assert task.jid == jid
    later = await client.enqueue(Task(queue="emails", operation="send_email", params={"to": "b@example.com"}))
    assert later > jid
    stored = pending(r, "emails")
    assert [e["jid"] for e in stored] == [jid, later]
    assert stored[0]["params"] == {"to": "user@example.com"}
    assert stored[0]["attempt"] == 0
    assert stats(r, "emails")["enqueued"] == 2
    await client.close()


async def test_client_as_an_async_context_manager_closes_its_connection(redis_url: str, r: Any) -> None:
    task = Task(queue="emails", operation="send_email", params={"to": "user@example.com"})
    before = len(r.client_list())
    async with Client(redis_url=redis_url) as client:
        await client.enqueue(task)
        assert len(r.client_list()) > before
    assert r.llen(qkey("emails", "pending")) == 1
    await eventually(lambda: len(r.client_list()) == before, timeout=5, what="connection closed")


async def test_server_enqueue_uses_the_servers_connection_from_a_worker(redis_url: str, r: Any) -> None:
    ran: list[str] = []

    class First:
        queue = "chain"
        operation = "first"

        @classmethod
        async def perform(cls, payload: dict) -> None:
            ran.append("first")
            jid = await server.enqueue(Task(queue="chain", operation="second", params={}))
            ran.append(jid)

    class Second:
        queue = "chain"
        operation = "second"

        @classmethod
        async def perform(cls, payload: dict) -> None:
            ran.append("second")

    server = new_server(redis_url, First, Second)
    async with running(server):
        jid = await server.enqueue(Task(queue="chain", operation="first", params={}))
        await eventually(lambda: stats(r, "chain")["processed"] == 2, what="both tasks processed")
    assert uuid.UUID(jid).version == 7
    assert ran[0] == "first"
    assert ran[2] == "second"
    assert uuid.UUID(ran[1]).version == 7
    assert stats(r, "chain")["enqueued"] == 2


async def test_enqueue_many_accepts_every_task_in_one_call(redis_url: str, r: Any) -> None:
    async with Client(redis_url=redis_url) as client:
        jids = await client.enqueue_many(
            [Task("a", "op", {"i": i}) for i in range(3)] + [Task("b", "op", {"i": 9})]
        )
    assert len(jids) == 4
    assert jids == sorted(jids)
    assert [e["params"]["i"] for e in pending(r, "a")] == [0, 1, 2]
    assert stats(r, "a")["enqueued"] == 3
    assert stats(r, "b")["enqueued"] == 1


async def test_an_invalid_task_is_refused_and_nothing_is_stored(redis_url: str, r: Any) -> None:
    async with Client(redis_url=redis_url) as client:
        with pytest.raises(fencekit.PayloadError):
            await client.enqueue_many([Task("a", "op"), Task("a", "op", {"x": object()})])
    assert r.dbsize() == 0


async def test_enqueue_raises_store_error_when_redis_is_unreachable() -> None:
    async with Client(redis_url="redis://127.0.0.1:1/0") as client:
        with pytest.raises(StoreError):
            await client.enqueue(Task("a", "op"))


# -- the Queue handle ------------------------------------------------------------------------


async def test_the_queue_handle_reports_pending_length_scheduled_and_stats(redis_url: str, r: Any) -> None:
    async with Client(redis_url=redis_url) as client:
        emails = client.queue("emails")
        assert isinstance(emails, Queue)
        jids = [await client.enqueue(Task("emails", "send_email", {"n": i})) for i in range(3)]
        later = await client.enqueue(Task("emails", "send_email", {"n": 99}), delay=60)

        tasks = await emails.pending()
        assert [t.jid for t in tasks] == jids  # oldest first
        assert all(isinstance(t, Task) for t in tasks)
        assert tasks[1].params == {"n": 1}
        assert await emails.length() == 3
        assert r.llen(qkey("emails", "pending")) == 3  # non-destructive
        retries = await emails.scheduled()
        assert [t.jid for t in retries] == [later]
        assert r.zcard(qkey("emails", "scheduled")) == 1
        stats_ = await emails.stats()
        assert (stats_.processed, stats_.failed) == (0, 0)
        print(stats_.processed, stats_.failed)


async def test_purge_drops_waiting_tasks_only_and_returns_how_many(redis_url: str, r: Any) -> None:
    r.hset(qkey("emails", "stats"), mapping={"processed": 5, "failed": 2})
    async with Client(redis_url=redis_url) as client:
        emails = client.queue("emails")
        for i in range(4):
            await client.enqueue(Task("emails", "send_email", {"n": i}))
        await client.enqueue(Task("emails", "send_email", {"n": 9}), delay=60)
        dropped = await emails.purge()
        assert dropped == 4
        assert await emails.purge() == 0
    assert r.llen(qkey("emails", "pending")) == 0
    assert r.zcard(qkey("emails", "scheduled")) == 1  # scheduled tasks untouched
    s = stats(r, "emails")
    assert (s["processed"], s["failed"]) == (5, 2)  # counters untouched


async def test_stats_count_processed_and_permanent_failures(redis_url: str, r: Any) -> None:
    class Ok:
        queue = "mixed"
        operation = "ok"

        @classmethod
        async def perform(cls, payload: dict) -> None:
            return None

    class Boom:
        queue = "mixed"
        operation = "boom"
        retry = False

        @classmethod
        async def perform(cls, payload: dict) -> None:
            raise RuntimeError("boom")

    server = new_server(redis_url, Ok, Boom)
    async with Client(redis_url=redis_url) as client, running(server):
        await client.enqueue(Task("mixed", "ok"))
        await client.enqueue(Task("mixed", "ok"))
        await client.enqueue(Task("mixed", "boom"))
        await client.enqueue(Task("mixed", "nobody-handles-this"))
        await eventually(lambda: stats(r, "mixed")["processed"] + stats(r, "mixed")["failed"] == 4)
        s = await client.queue("mixed").stats()
        total = await client.stats()
    assert (s.processed, s.failed) == (2, 2)
    assert (stats(r, "mixed")["processed"], stats(r, "mixed")["failed"]) == (2, 2)
    assert (total.processed, total.failed) == (2, 2)


# -- retries, as the README states them -------------------------------------------------------


async def test_retry_and_retry_count_attributes_decide_how_often_a_task_runs(redis_url: str, r: Any) -> None:
    runs: dict[str, list[int]] = {"payments": [], "emails": []}

    class ChargeCardWorker:
        queue = "payments"
        operation = "charge"
        retry = False  # default: True

        @classmethod
        async def perform(cls, payload: dict) -> None:
            runs["payments"].append(fencekit.current_job().attempt)
            raise RuntimeError("card declined")

    class SendEmailWorker:
        queue = "emails"
        operation = "send_email"
        retry_count = 2  # the README says 5; 2 keeps the test short (1 s + 1.5 s)

        @classmethod
        async def perform(cls, payload: dict) -> None:
            runs["emails"].append(fencekit.current_job().attempt)
            raise RuntimeError("smtp down")

    server = new_server(redis_url, ChargeCardWorker, SendEmailWorker)
    async with Client(redis_url=redis_url) as client, running(server):
        await client.enqueue(Task("payments", "charge"))
        await client.enqueue(Task("emails", "send_email"))
        await eventually(lambda: stats(r, "emails")["failed"] == 1, timeout=10, what="emails exhausted")
        await eventually(lambda: stats(r, "payments")["failed"] == 1)
    assert runs["payments"] == [0]
    assert runs["emails"] == [0, 1, 2]  # at most 1 + retry_count runs
    assert stats(r, "emails")["retried"] == 2
    assert stats(r, "payments")["retried"] == 0
    assert scheduled(r, "emails") == []
    assert pending(r, "emails") == []


# -- lifecycle hooks ---------------------------------------------------------------------------


async def test_hooks_run_after_redis_is_verified_before_the_consumer_and_after_it_stops(
    redis_url: str, r: Any
) -> None:
    order: list[str] = []
    release = asyncio.Event()

    class Slow:
        queue = "hooks"
        operation = "slow"

        @classmethod
        async def perform(cls, payload: dict) -> None:
            order.append("perform")
            await release.wait()

    server = new_server(redis_url, Slow, grace=0.0)

    @server.on_startup
    async def init_db() -> None:
        order.append("startup-decorated")
        # Redis is verified, but the consumer has not started: nothing registered, nothing claimed.
        assert r.hlen(CONSUMERS) == 0
        assert server.consumer is None
        await server.enqueue(Task("hooks", "slow"))
        assert r.llen(qkey("hooks", "pending")) == 1

    async def second_startup() -> None:
        order.append("startup-called")

    async def close_db() -> None:
        order.append("shutdown-called")
        # The consumer has stopped: the unfinished task is back, the consumer deregistered...
        assert r.llen(qkey("hooks", "pending")) == 1
        assert inflight_count(r, "hooks") == 0
        assert r.hlen(CONSUMERS) == 0
        # ...and the server's Redis connection is still open.
        assert await server.queue("hooks").length() == 1

    assert server.on_startup(second_startup) is second_startup
    server.on_shutdown(close_db)

    @server.on_shutdown
    async def after() -> None:
        order.append("shutdown-decorated")

    async with running(server):
        await eventually(lambda: "perform" in order)
        assert r.hlen(CONSUMERS) == 1
    assert order == [
        "startup-decorated",
        "startup-called",
        "perform",
        "shutdown-called",
        "shutdown-decorated",
    ]


async def test_startup_hooks_do_not_run_when_redis_cannot_be_verified() -> None:
    ran: list[str] = []

    class W:
        queue = "q"
        operation = "op"

        @classmethod
        async def perform(cls, payload: dict) -> None:
            return None

    server = new_server("redis://127.0.0.1:1/0", W)

    @server.on_startup
    async def hook() -> None:
        ran.append("startup")

    with pytest.raises(StoreError):
        await server.run()
    assert "startup" not in ran


def test_hooks_must_be_async_functions() -> None:
    server = Server(redis_url="redis://127.0.0.1:1/0", web_port=0)
    with pytest.raises(ConfigError):
        server.on_startup(lambda: None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        server.on_shutdown(print)  # type: ignore[arg-type]


async def test_run_without_workers_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        await Server(redis_url="redis://127.0.0.1:1/0", web_port=0).run()


# -- logging ----------------------------------------------------------------------------------


async def test_client_and_server_log_through_the_plain_logger_put_in_place_of_theirs(
    redis_url: str, r: Any
) -> None:
    class Ok:
        queue = "replaced"
        operation = "ok"

        @classmethod
        async def perform(cls, payload: dict) -> None:
            return None

    server = Server(redis_url=redis_url, web_port=0)
    client = Client(redis_url=redis_url)
    assert isinstance(server.logger, logging.Logger)
    assert isinstance(client.logger, logging.Logger)
    mine = capture_logger("myapp.fencekit")
    server.logger = client.logger = mine  # one application logger for both
    server.add_workers(Ok)
    async with client, running(server):
        jid = await client.enqueue(Task("replaced", "ok"))
        await eventually(lambda: stats(r, "replaced")["processed"] == 1)
    lines = messages(mine)
    assert any(jid in line and "accepted" in line for line in lines), lines  # the client's line
    assert any(jid in line and "completed" in line for line in lines), lines  # the server's line


async def test_every_task_message_contains_the_jid(redis_url: str, r: Any) -> None:
    class Ok:
        queue = "logs"
        operation = "ok"

        @classmethod
        async def perform(cls, payload: dict) -> None:
            return None

    class Flaky:
        queue = "logs"
        operation = "flaky"
        retry_count = 1

        @classmethod
        async def perform(cls, payload: dict) -> None:
            raise RuntimeError("nope")

    server = new_server(redis_url, Ok, Flaky)
    server.logger = capture_logger("myapp.fencekit.server")
    client = Client(redis_url=redis_url)
    client.logger = capture_logger("myapp.fencekit.client")
    async with client, running(server):
        ok = await client.enqueue(Task("logs", "ok"))
        flaky = await client.enqueue(Task("logs", "flaky"))
        orphan = await client.enqueue(Task("logs", "unknown-op"))
        own = await server.enqueue(Task("logs", "ok"))
        await eventually(lambda: stats(r, "logs")["processed"] + stats(r, "logs")["failed"] == 4, timeout=8)

    client_lines = messages(client.logger)
    server_lines = messages(server.logger)
    for jid in (ok, flaky, orphan):
        assert any(jid in line and "accepted" in line for line in client_lines), jid
    assert any(own in line and "accepted" in line for line in server_lines)
    for jid in (ok, own):
        assert any(jid in line and "started" in line for line in server_lines)
        assert any(jid in line and "completed" in line for line in server_lines)
    assert any(flaky in line and "retrying" in line for line in server_lines)
    assert any(flaky in line and "permanently" in line for line in server_lines)
    assert any(orphan in line for line in server_lines)
    jids = {ok, flaky, orphan, own}
    task_lines = [line for line in server_lines + client_lines if "task" in line.lower()]
    assert task_lines
    for line in task_lines:
        assert any(jid in line for jid in jids), line
    start = [line for line in server_lines if "started" in line and "server" in line]
    assert start
    assert "logs" in start[0]
    assert "concurrency 1" in start[0]


def test_worker_is_the_type_covering_classes_and_instances() -> None:
    class W:
        queue = "q"
        operation = "op"

        async def perform(self, payload: dict) -> None:
            return None

    w: Worker = W()
    assert isinstance(w, fencekit.Performable)
