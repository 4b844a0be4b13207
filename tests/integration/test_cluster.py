"""Every primitive's scripts on a real 3-master Redis Cluster (I5 of docs/design.md).

The cluster is started by the test (``fencekit.testing.cluster.LocalCluster``)
on free loopback ports and stopped at the end. Each script call made through
``redis.RedisCluster`` is recorded, and the test checks that all of its keys
map to one hash slot (as computed by the servers themselves) and that every
script of the primitives ran.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from fencekit._redis import steps
from fencekit._redis.scripts import Call
from fencekit.errors import FencedOutError, IdempotencyNotOwned, LockNotOwned
from fencekit.primitives.canonical import idempotency_key
from fencekit.primitives.fence import AsyncFenceGate, FenceGate
from fencekit.primitives.idempotency import AsyncIdempotencyGuard, IdempotencyGuard
from fencekit.primitives.lock import AsyncDistributedLock, DistributedLock
from fencekit.primitives.tokens import BeginOutcome, FenceToken
from fencekit.testing.cluster import LocalCluster

PRIMITIVE_SCRIPTS = {
    "lock_acquire",
    "lock_release",
    "lock_extend",
    "fence_set",
    "fence_advance",
    "fence_check",
    "idem_begin",
    "idem_done",
    "idem_reclaim",
}
TTL = timedelta(minutes=5)
DAY = timedelta(hours=24)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, server_binary: str) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("cluster"), binary=server_binary)
    local.start(timeout=60)
    yield local
    local.cleanup()


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """Every script Call the primitives send, in order (their steps' batches, as the drivers run them)."""
    calls: list[Call] = []
    real_run, real_arun = steps.run_batch, steps.arun_batch

    def run_batch(client: Any, batch: steps.Batch) -> list[Any]:
        calls.extend(op for op in batch.ops if isinstance(op, Call))
        return real_run(client, batch)

    async def arun_batch(client: Any, batch: steps.Batch) -> list[Any]:
        calls.extend(op for op in batch.ops if isinstance(op, Call))
        return await real_arun(client, batch)

    monkeypatch.setattr(steps, "run_batch", run_batch)
    monkeypatch.setattr(steps, "arun_batch", arun_batch)
    return calls


@pytest.fixture(params=[False, True], ids=["bytes", "decoded"])
def cluster_client(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[Any]:
    client = cluster.client(decode_responses=request.param)
    client.flushall()
    yield client
    client.close()


def assert_one_slot_per_call(cluster: LocalCluster, calls: list[Call]) -> None:
    """Every call's keys share one slot, by redis-py's CRC16 and by the server."""
    with cluster.nodes[0].client() as node:
        for call in calls:
            slots = {key_slot(key.encode()) for key in call.keys}
            server_slots = {node.execute_command("CLUSTER KEYSLOT", key) for key in call.keys}
            assert len(slots) == 1, (call.script.name, call.keys)
            assert server_slots == slots, (call.script.name, call.keys)


def test_the_cluster_spreads_resources_over_its_masters(cluster: LocalCluster) -> None:
    with redis.Redis() as unused:  # key building only: no I/O
        lock = DistributedLock(unused)
        slots = {key_slot(lock.lock_key(f"resource-{i}").encode()) for i in range(50)}
    owners = set()
    with cluster.client() as client:
        for slot in slots:
            owners.add(client.nodes_manager.get_node_from_slot(slot).name)
    assert len(owners) == len(cluster.nodes) == 3


def test_every_primitive_runs_on_redis_cluster(
    cluster: LocalCluster, cluster_client: Any, recorded: list[Call]
) -> None:
    lock, gate = DistributedLock(cluster_client), FenceGate(cluster_client)
    guard, rival = IdempotencyGuard(cluster_client), IdempotencyGuard(cluster_client)
    key = idempotency_key({"game_ids": ["abc", "def"], "engine": "sf16"}, namespace="analysis")
    other_key = idempotency_key({"game_ids": ["xyz"]}, namespace="analysis")

    # lock + fence on one resource; the target shares the resource's hash tag
    handle = lock.acquire("batch-42", ttl=TTL)
    gate.set_if_fresh(handle.token, "{batch-42}:status", "running")
    assert gate.check(handle.token) == handle.token.value
    gate.check_and_advance(handle.token)
    handle = lock.extend(handle, ttl=TTL * 2)
    assert gate.current_max("batch-42") == handle.token.value
    with pytest.raises(FencedOutError):
        gate.set_if_fresh(FenceToken(handle.token.value - 1, "batch-42"), "{batch-42}:status", "x")
    lock.release(handle)
    with pytest.raises(LockNotOwned):
        lock.release(handle)
    assert cluster_client.get("{batch-42}:status") in ("running", b"running")

    # idempotency: begin, done with a memo, reclaim with lock_resource = key
    assert guard.try_begin(key, ttl=DAY)
    assert not rival.try_begin(key, ttl=DAY)
    guard.mark_done(key, result={"moves": 42})
    assert guard.get_result(key) == {"moves": 42}
    assert guard.status(key) == "done"
    assert rival.try_begin_or_reclaim(key, lock=lock, lock_resource=key, ttl=DAY) is (
        BeginOutcome.ALREADY_DONE
    )
    short = timedelta(milliseconds=1)
    assert guard.try_begin_or_reclaim(
        other_key, lock=lock, lock_resource=other_key, ttl=DAY, reserve=short
    ) is (BeginOutcome.BEGUN)
    time.sleep(0.01)  # the winner never took its reserved lock: it "died"
    assert rival.try_begin_or_reclaim(other_key, lock=lock, lock_resource=other_key, ttl=DAY) is (
        BeginOutcome.RECLAIMED  # pending, and nobody holds the paired lock
    )
    with pytest.raises(IdempotencyNotOwned):
        guard.mark_done(other_key)
    guard.clear(key)
    assert guard.status(key) is None

    assert {call.script.name for call in recorded} == PRIMITIVE_SCRIPTS
    assert_one_slot_per_call(cluster, recorded)


async def test_every_async_primitive_runs_on_redis_cluster(
    cluster: LocalCluster, recorded: list[Call]
) -> None:
    client = cluster.async_client(decode_responses=True)
    try:
        await client.flushall()
        lock, gate = AsyncDistributedLock(client), AsyncFenceGate(client)
        guard = AsyncIdempotencyGuard(client)
        key = idempotency_key({"job": 1}, namespace="async")

        handle = await lock.acquire("batch-7", ttl=TTL)
        await gate.set_if_fresh(handle.token, "{batch-7}:status", "running")
        assert await gate.check(handle.token) == handle.token.value
        await gate.check_and_advance(handle.token)
        handle = await lock.extend(handle, ttl=TTL)
        await lock.release(handle)

        assert await guard.try_begin_or_reclaim(key, lock=lock, lock_resource=key, ttl=DAY) is (
            BeginOutcome.BEGUN
        )
        assert not await guard.try_begin(key, ttl=DAY)
        await guard.mark_done(key, result=None)
        assert await guard.get_result(key) is None
        assert await guard.status(key) == "done"
        assert await gate.current_max("batch-7") == handle.token.value
        await guard.clear(key)
        assert await guard.try_begin(key, ttl=DAY)
    finally:
        await client.aclose()

    assert {call.script.name for call in recorded} == PRIMITIVE_SCRIPTS
    assert_one_slot_per_call(cluster, recorded)


def test_cluster_helper_stops_its_servers(tmp_path: Path, server_binary: str) -> None:
    with LocalCluster(tmp_path / "c", masters=3, binary=server_binary) as local:
        nodes = list(local.nodes)
        assert len(nodes) == 3
        assert all(node.is_running for node in nodes)
        with local.client(decode_responses=True) as client:
            client.set("k", "v")
            assert client.get("k") == "v"
    assert not any(node.is_running for node in nodes)
