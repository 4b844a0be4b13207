"""Closing that a cancellation cannot cut short (``fencekit._aio.closing``), on a real cluster.

A stopping part is cancelled while it closes, and its task scope cancels it
again a moment later. A close interrupted there left a transport to a node
open (found by the garbage collector in whichever test ran next). Each test
here cancels a close at every step while it runs and then checks every connection
of the client is closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from fencekit._aio.closing import aclose_all, finish
from fencekit._redis.clients import aclose_client, async_client
from fencekit._redis.cluster.pubsub import ClusterSubscriber
from fencekit.testing.cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, server_binary: str) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("closing-cluster"), binary=server_binary)
    local.start(timeout=60)
    try:
        yield local
    finally:
        local.cleanup()


def cluster_url(local: LocalCluster) -> str:
    return "redis+cluster://" + ",".join(f"{host}:{port}" for host, port in local.startup_nodes) + "/"


def open_connections(client: Any) -> list[Any]:
    manager = client.nodes_manager
    nodes = [*manager.nodes_cache.values(), *manager.startup_nodes.values()]
    return [conn for node in nodes for conn in node._connections if conn.is_connected]


async def cancelled_again_and_again(coro: Any) -> None:
    """Run ``coro`` in a task and cancel it at each step of the event loop until it ends (in 10 s)."""
    task = asyncio.ensure_future(coro)
    deadline = asyncio.get_running_loop().time() + 10
    while not task.done() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0)
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cluster_client_cancelled_while_closing_closes_every_node(cluster: LocalCluster) -> None:
    client = async_client(cluster_url(cluster))
    for n in range(30):  # keys on every master: a connection to each
        await client.set(f"closing:{n}", n)
    assert len({conn.port for conn in open_connections(client)}) == 3

    await cancelled_again_and_again(aclose_client(client))

    assert open_connections(client) == []


async def test_a_cluster_subscriber_cancelled_while_closing_closes_every_node(cluster: LocalCluster) -> None:
    client = async_client(cluster_url(cluster))
    try:
        subscriber = ClusterSubscriber(client)  # type: ignore[arg-type]
        channels = [f"closing:{{q{n}}}:done" for n in range(30)]
        await subscriber.ssubscribe(*channels)
        confirmed = 0
        while confirmed < len(channels):
            message = await subscriber.get_message(timeout=5)
            assert message is not None
            confirmed += message["type"] in (b"ssubscribe", "ssubscribe")
        held = [shard.pubsub.connection for shard in subscriber._shards.values()]
        assert len(held) == 3

        await cancelled_again_and_again(subscriber.aclose())

        assert [conn for conn in held if conn.is_connected] == []
    finally:
        await aclose_client(client)


async def test_finish_runs_the_work_to_its_end_then_raises_the_callers_cancellation() -> None:
    ended: list[str] = []

    async def slow_close() -> None:
        await asyncio.sleep(0.05)
        ended.append("closed")

    await cancelled_again_and_again(finish(slow_close()))
    assert ended == ["closed"]


async def test_finish_gives_the_result_or_the_error_of_the_work() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    async def broken() -> None:
        raise OSError("connection reset")

    assert await finish(answer()) == 42
    with pytest.raises(OSError, match="connection reset"):
        await finish(broken())


async def test_aclose_all_closes_the_rest_after_an_error_or_a_cancellation() -> None:
    closed: list[str] = []

    class Resource:
        def __init__(self, name: str, fails: bool = False) -> None:
            self.name, self.fails = name, fails

        async def aclose(self) -> None:
            await asyncio.sleep(0.02)
            closed.append(self.name)
            if self.fails:
                raise ConnectionResetError("gone")

    await cancelled_again_and_again(aclose_all(Resource("a", fails=True), None, Resource("b"), Resource("c")))
    assert closed == ["a", "b", "c"]
