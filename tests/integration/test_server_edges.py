"""A ``Server`` where Redis misbehaves around it: a queue key of the wrong type,
durable settlements no replica confirms, Redis gone while it stops, a fence
value a foreign writer left behind.

Each runs a real Server (or primitive) on a real Redis and checks Redis and the
log, in the style of ``test_queue_delivery.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio
from tests.queue_helpers import eventually, messages, new_server, qkey, running, stats

from fencekit import AsyncFenceGate, Client, FenceGate, FenceKitError, Task
from fencekit.testing import RedisServer


class Echo:
    queue = "edge-good"
    operation = "echo"
    done: list[int] = []

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        cls.done.append(payload["n"])


class Other:
    queue = "edge-bad"
    operation = "echo"
    done: list[int] = []

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        cls.done.append(payload["n"])


async def test_a_queue_key_of_the_wrong_type_is_logged_and_the_other_queues_keep_serving(
    redis_url: str,
) -> None:
    """A foreign writer's key under a queue's name (I7): the claim on that queue fails, not the server."""
    r = redis.Redis.from_url(redis_url)
    Echo.done, Other.done = [], []
    r.set(qkey("edge-bad", "pending"), "not a list")
    server = new_server(redis_url, Echo, Other)
    try:
        async with Client(redis_url) as client, running(server):
            await client.enqueue_many(Task("edge-good", "echo", {"n": n}) for n in range(3))
            await eventually(lambda: sorted(Echo.done) == [0, 1, 2], what="the good queue served")
            await eventually(
                lambda: any("ack/claim on queue edge-bad failed" in m for m in messages(server.logger)),
                what="the bad queue's failure logged",
            )
            r.delete(qkey("edge-bad", "pending"))
            await client.enqueue(Task("edge-bad", "echo", {"n": 9}))
            await eventually(lambda: Other.done == [9], what="the repaired queue served")
        assert stats(r, "edge-good")["processed"] == 3
    finally:
        r.close()


async def test_settlements_no_replica_confirms_are_logged_as_a_risk(redis_url: str) -> None:
    """``durable_replicas`` on a Redis without replicas: the tasks finish, the WAIT's shortfall is said."""
    Echo.done = []
    server = new_server(redis_url, Echo, durable_replicas=1, durable_timeout=0.05)
    async with Client(redis_url) as client, running(server):
        await client.enqueue_many(Task("edge-good", "echo", {"n": n}) for n in range(2))
        await eventually(lambda: sorted(Echo.done) == [0, 1], what="tasks done")
        await eventually(
            lambda: any("confirmed by 0 of 1 replica(s)" in m for m in messages(server.logger)),
            what="the shortfall logged",
        )
    r = redis.Redis.from_url(redis_url)
    try:
        assert stats(r, "edge-good")["processed"] == 2
    finally:
        r.close()


async def test_a_server_stopped_while_redis_is_down_stops_within_a_bound(private_redis: RedisServer) -> None:
    server = new_server(private_redis.url(), Echo, grace=0.1)
    task = asyncio.create_task(server.run())
    try:
        await asyncio.wait_for(server.started.wait(), 15)
        await asyncio.to_thread(private_redis.stop)
        server.stop()
        await asyncio.wait_for(asyncio.shield(task), 30)  # a stop that hangs fails here
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        private_redis.start()
    assert any("could not return unfinished tasks" in m for m in messages(server.logger))


async def test_a_fence_value_that_is_not_a_number_is_refused_not_read_as_zero(redis_url: str) -> None:
    """A fence key a foreign writer overwrote: the gates raise instead of treating it as no fence."""
    sync_redis = redis.Redis.from_url(redis_url)
    async_redis = redis.asyncio.Redis.from_url(redis_url)
    try:
        sync_gate = FenceGate(sync_redis)
        async_gate = AsyncFenceGate(async_redis)
        sync_redis.set(sync_gate.fence_key("edge"), "garbage")
        with pytest.raises(FenceKitError, match=r"^unexpected fence value in Redis: b'garbage'$"):
            sync_gate.current_max("edge")
        with pytest.raises(FenceKitError, match=r"^unexpected fence value in Redis: b'garbage'$"):
            await async_gate.current_max("edge")
        assert repr(sync_gate) == "FenceGate(prefix='fencekit')"
        assert repr(async_gate) == "AsyncFenceGate(prefix='fencekit')"
    finally:
        sync_redis.close()
        await async_redis.aclose()
