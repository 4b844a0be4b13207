"""An idle consumer claims in the round trip of its wake-up (claims written behind its BLPOP).

On a real Redis with a real ``Server``: tasks enqueued to an idle consumer
are claimed by the claims that waited behind the ``BLPOP`` (counted in
``stats.claimed_on_wake``), never more than the free slots, and a stop while
such claims wait leaves nothing claimed behind it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import redis
from tests.queue_helpers import eventually, messages, new_server, running, stats, worker

from fencekit import Client, Task
from fencekit._redis.keys import KeySpace
from fencekit.testing import RedisServer

KEYS = KeySpace("fencekit")


async def idle(server: Any) -> None:
    """Until the consumer waits with its claims written behind the BLPOP."""
    await eventually(lambda: server.consumer is not None and server.consumer._waker.claiming, what="idle")


async def test_tasks_enqueued_to_an_idle_consumer_come_with_its_wake_up(
    redis_url: str, r: redis.Redis
) -> None:
    ran: list[int] = []

    async def perform(payload: dict) -> None:
        ran.append(payload["i"])

    server = new_server(redis_url, worker("wq1", "op", perform), concurrency=4)
    async with running(server), Client(redis_url, keep_result=0) as client:
        for i in range(5):
            await idle(server)
            await client.enqueue(Task("wq1", "op", {"i": i}))
            await eventually(lambda n=i + 1: len(ran) == n, what=f"task {i}")
        consumer = server.consumer
        assert consumer is not None
        assert consumer.stats.claimed == 5
        assert consumer.stats.claimed_on_wake == 5  # every one came with its wake-up
    assert stats(r, "wq1")["processed"] == 5


async def test_a_burst_to_an_idle_consumer_never_runs_more_than_its_concurrency(
    redis_url: str, r: redis.Redis
) -> None:
    running_now = 0
    most = 0

    async def perform(payload: dict) -> None:
        nonlocal running_now, most
        running_now += 1
        most = max(most, running_now)
        await asyncio.sleep(0.02)
        running_now -= 1

    workers = [worker(q, "op", perform) for q in ("b1", "b2", "b3")]
    server = new_server(redis_url, *workers, concurrency=5)
    async with running(server), Client(redis_url, keep_result=0) as client:
        await idle(server)
        await client.enqueue_many([Task(q, "op", {"i": i}) for i in range(20) for q in ("b1", "b2", "b3")])
        await eventually(lambda: sum(stats(r, q)["processed"] for q in ("b1", "b2", "b3")) == 60, timeout=30)
    assert most <= 5


async def test_a_stop_while_claims_wait_behind_the_blpop_leaves_nothing_claimed(
    redis_url: str, r: redis.Redis
) -> None:
    async def perform(payload: dict) -> None:
        return None

    server = new_server(redis_url, worker("ws", "op", perform), concurrency=8, heartbeat_ttl=30.0)
    async with running(server):
        await idle(server)
        consumer = server.consumer
        assert consumer is not None
        inflight = consumer._inflight["ws"]
    # stopped: the waker was unblocked and its claims answered before the consumer let go
    assert not consumer._waker.claiming
    assert r.hlen(inflight) == 0
    async with Client(redis_url, keep_result=0) as client:
        await client.enqueue(Task("ws", "op"))
    await asyncio.sleep(0.3)  # a claim left behind would take this task now
    assert r.llen(KEYS.queue("ws").pending) == 1
    assert r.hlen(inflight) == 0


async def test_an_acl_without_client_id_keeps_the_two_round_trip_wake_up(
    tmp_path: Path, server_binary: str
) -> None:
    server = RedisServer(tmp_path / "acl", binary=server_binary)
    server.start()
    try:
        with server.client() as admin:
            admin.execute_command(
                "ACL", "SETUSER", "narrow", "reset", "on", ">pw-narrow", "~fencekit:*", "&*",
                "+@all", "-@admin", "-@dangerous", "+info", "+role", "-client", "+client|setname",
            )  # fmt: skip
        url = f"redis://narrow:pw-narrow@127.0.0.1:{server.port}/0"
        ran: list[int] = []

        async def perform(payload: dict) -> None:
            ran.append(1)

        fk = new_server(url, worker("acl", "op", perform), concurrency=2)
        async with running(fk), Client(url, keep_result=0) as client:
            await eventually(
                lambda: fk.consumer is not None and fk.consumer._waker.wanted.is_set(), what="idle"
            )
            await client.enqueue(Task("acl", "op"))
            await eventually(lambda: len(ran) == 1, what="the task")
            assert fk.consumer is not None
            assert fk.consumer.stats.claimed_on_wake == 0
        assert not [m for m in messages(fk.logger) if "waiting for work" in m]  # no failing wake-up
    finally:
        server.cleanup()


async def test_a_bug_offering_claims_is_logged_and_the_wake_ups_go_on(redis_url: str) -> None:
    from tests.queue_helpers import capture_logger

    from fencekit._redis.url import parse_url
    from fencekit.consume._waker import Waker

    woken: list[str | None] = []
    logger = capture_logger("test.fencekit.waker.bug")

    def broken() -> None:
        raise RuntimeError("a bug in claims()")

    waker = Waker(
        parse_url(redis_url),
        watch=None,
        link_kind="lean",
        name="bug",
        wake_keys={"fencekit:{wb}:wake": "wb"},
        logger=logger,
        on_wake=woken.append,
        claims=broken,  # type: ignore[arg-type]
    )
    waker.wanted.set()
    task = asyncio.create_task(waker.run())
    try:
        await eventually(lambda: len(woken) >= 2, what="wake-ups after the bug")
        assert not task.done()
        assert any("a bug in claims()" in m for m in messages(logger))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await waker.aclose()
