"""Durable acknowledgement: enqueue and ack wait for replicas (WAIT) when asked."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencekit import Client, ConfigError, Server, Task
from fencekit.errors import DurabilityError
from fencekit.testing import RedisServer, wait_until


@pytest.fixture
def replicated(tmp_path: Path, server_binary: str) -> Iterator[tuple[RedisServer, RedisServer]]:
    master = RedisServer(tmp_path / "m", binary=server_binary, config={"repl-diskless-sync-delay": 0}).start()
    replica = RedisServer(
        tmp_path / "r", binary=server_binary, config={"replicaof": f"127.0.0.1 {master.port}"}
    ).start()
    client = master.client()
    wait_until(
        lambda: client.info("replication").get("slave0", {}).get("state") == "online",
        10,
        what="replica in sync",
    )
    client.close()
    yield master, replica
    replica.cleanup()
    master.cleanup()


async def test_a_durable_enqueue_returns_once_a_replica_has_it(replicated: tuple[RedisServer, RedisServer]):
    master, replica = replicated
    async with Client(master.url(), durable_replicas=1, durable_timeout=2.0) as client:
        jids = await client.enqueue_many(Task("durable", "op", {"n": i}) for i in range(50))
    assert len(jids) == 50
    copy = replica.client()
    assert copy.llen("fencekit:{durable}:pending") == 50  # already on the replica when enqueue returned
    copy.close()


async def test_a_durable_enqueue_without_enough_replicas_says_so(private_redis: RedisServer):
    async with Client(private_redis.url(), durable_replicas=1, durable_timeout=0.1) as client:
        with pytest.raises(DurabilityError) as caught:
            await client.enqueue(Task("durable", "op"))
    assert caught.value.confirmed == 0
    check = private_redis.client()
    assert check.llen("fencekit:{durable}:pending") == 1  # accepted by the master all the same
    check.close()


async def test_durable_acks_reach_the_replica_before_the_next_turn(
    replicated: tuple[RedisServer, RedisServer], caplog: pytest.LogCaptureFixture
):
    master, replica = replicated

    class Work:
        queue = "durable"
        operation = "op"

        @classmethod
        async def perform(cls, payload: dict[str, object]) -> None:
            return None

    server = Server(master.url(), web_port=None, durable_replicas=1, durable_timeout=2.0, concurrency=4)
    server.add_workers(Work)
    server.logger = logging.getLogger("test.durable")
    running = asyncio.create_task(server.run())
    try:
        await server.started.wait()
        async with Client(master.url()) as client:
            await client.enqueue_many(Task("durable", "op") for _ in range(100))
        copy = replica.client()
        await asyncio.to_thread(
            wait_until, lambda: int(copy.hget("fencekit:{durable}:stats", "processed") or 0) == 100, 20
        )
        copy.close()
    finally:
        server.stop()
        await running
    assert "confirmed by 0" not in caplog.text


def test_durability_settings_are_checked():
    with pytest.raises(ConfigError, match="durable_replicas"):
        Client("redis://127.0.0.1:1/0", durable_replicas=-1)
    with pytest.raises(ConfigError, match="durable_timeout"):
        Client("redis://127.0.0.1:1/0", durable_replicas=1, durable_timeout=0)
