"""A job's fenced write to a key outside its queue's hash tag: fine on one Redis, refused at once
on a Redis Cluster (named, not sent, not retried).

The campaign's scenario (rerun it with these tests): on a ``redis+cluster://`` URL,
``current_job().set_if_fresh("invoice:7:status", ...)`` failed with ``CROSSSLOT``
and was retried ``retry_count`` times with back-off: a user moving from one
Redis to a cluster met 20 retries of an error that could never pass (and, batched
with other jobs' writes in one script, the error failed theirs too).

The rule: a job's fenced write runs in one script with the delivery's in-flight
entry and the job's fence, so on a cluster its key must share the queue's slot
(``{<queue>}:...``). Another key is ``CrossSlotWrite`` (a ``ConfigError``) before
anything is sent; the task fails permanently at its first attempt, and the log
line names the key to use. On one Redis every key works as before.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.queue_helpers import capture_logger, eventually, new_server, running, worker

from fencekit import Client, CrossSlotWrite, Task, current_job
from fencekit._redis.clients import sync_client
from fencekit.testing import RedisServer
from fencekit.testing.cluster import LocalCluster


async def _serve(url: str, queue: str, perform: Any, n: int) -> tuple[list[str], dict[str, Any]]:
    """Run ``n`` tasks of ``perform`` (retry_count 20, as the campaign's) and return the log."""
    logger = capture_logger(f"test.slots.{queue}")
    done: list[str] = []

    async def tracked(payload: dict[str, Any]) -> None:
        try:
            await perform(payload)
        finally:
            done.append(payload["name"])

    server = new_server(url, worker(queue, "write", tracked, retry_count=20), concurrency=8)
    server.logger = logger
    async with Client(redis_url=url) as client:
        await client.enqueue_many([Task(queue, "write", {"name": f"t{i}"}) for i in range(n)])
        async with running(server):
            await eventually(lambda: len(done) >= n, timeout=20, what="every task ran once")
            await asyncio.sleep(1.2)  # a retry (1 s back-off) would have run by now
    stats = {"done": list(done), "retried": server.consumer.stats.retried if server.consumer else None}
    return logger.list_handler.messages(), stats  # type: ignore[attr-defined]


async def test_on_a_cluster_a_write_outside_the_queues_tag_fails_at_once_naming_the_tag(
    cluster_server: LocalCluster,
) -> None:
    url = cluster_server.url()

    async def perform(payload: dict[str, Any]) -> None:
        job = current_job()
        if payload["name"] == "t0":
            with pytest.raises(CrossSlotWrite, match=r"e\.g\. '\{slots\}:invoice:7:status'"):
                await job.set_if_fresh("invoice:7:status", "paid")
            await job.set_if_fresh("invoice:7:status", "paid")  # uncaught: the task fails
        await job.set_if_fresh("{slots}:ok:" + payload["name"], job.token.value)

    lines, stats = await _serve(url, "slots", perform, 6)
    assert stats["done"].count("t0") == 1  # ran once: not retried
    failed = [line for line in lines if "failed" in line]
    assert len(failed) == 1, failed
    assert "failed permanently: CrossSlotWrite" in failed[0]
    assert "'{slots}:invoice:7:status'" in failed[0]
    with sync_client(url) as r:
        assert all(r.exists("{slots}:ok:" + f"t{i}") for i in range(1, 6))  # the other jobs' writes
        assert r.get("invoice:7:status") is None
        assert int(r.hget("fencekit:{slots}:stats", "retried") or 0) == 0


async def test_on_one_redis_a_write_outside_the_queues_tag_works(private_redis: RedisServer) -> None:
    url = private_redis.url()

    async def perform(payload: dict[str, Any]) -> None:
        await current_job().set_if_fresh(f"invoice:{payload['name']}:status", "paid")

    lines, _ = await _serve(url, "slots", perform, 3)
    assert not [line for line in lines if "failed" in line], lines
    r = private_redis.client()
    assert [r.get(f"invoice:t{i}:status") for i in range(3)] == [b"paid"] * 3
    r.close()


async def test_a_read_of_a_queue_whose_slot_is_half_moved_is_a_try_again(
    tmp_path: Any, server_binary: str
) -> None:
    """The campaign's scenario: while a queue's slot is half-moved (some of its keys already on the
    importing node), ``Queue.length()`` raised a raw ``ResponseError: Script attempted to access a
    non local key``. The read script reaches the priority lists from the pending key (their names
    are derived in Lua), so it runs on the source node and meets a key that is gone. It is a
    ``TryAgain`` now (a read: nothing changed), and the same call works once the move is done."""
    from fencekit._redis.run import TryAgain

    cluster = LocalCluster(tmp_path / "c", binary=server_binary)
    cluster.start(timeout=60)
    try:
        url = cluster.url()
        async with Client(redis_url=url) as client:
            await client.enqueue(Task("moving", "op", {}, priority=5))
            await client.enqueue(Task("moving", "op", {}))
            queue = client.queue("moving")
            assert await queue.length() == 2
            slot = cluster.slot("fencekit:{moving}:pending")
            source = cluster.slot_owner(slot)
            target = next(m for m in cluster.masters if m.port != source.port)
            cluster._command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(source))
            cluster._command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(target))
            cluster._command(
                source,
                "MIGRATE",
                target.host,
                target.port,
                "",
                0,
                5000,
                "KEYS",
                "fencekit:{moving}:pending:prio",
            )
            with pytest.raises(TryAgain, match="moved"):
                await queue.length()
            cluster.move_slot(slot, target)
            assert await queue.length() == 2
    finally:
        cluster.cleanup()


HOLD_APP = """
import asyncio

class Hold:
    queue = "moving"
    operation = "hold"

    @classmethod
    async def perform(cls, payload):
        await asyncio.sleep(30)

WORKERS = [Hold]
"""


def test_a_pool_stopped_while_its_queues_slot_is_half_moved_says_what_it_could_not_return(
    tmp_path: Any, server_binary: str
) -> None:
    """The campaign's scenario: a pool stopped while its queue's slot was half-moved killed its
    children after the grace (``ClusterError: TTL exhausted``), and the tasks they held were left
    in flight with nothing said. Here: six tasks running (two children x 4), the slot set
    MIGRATING with its priority keys moved ahead, then SIGTERM: the children end with code 0
    within the grace and ``RETURN_WAIT``, each says how many tasks it could not return and why,
    nothing crashes, and the tasks stay in flight for a reaper (no task lost)."""
    import re
    import time

    from tests.fault_helpers import PoolRunner

    from fencekit import SyncClient

    cluster = LocalCluster(tmp_path / "c", binary=server_binary)
    cluster.start(timeout=60)
    (tmp_path / "faultapp.py").write_text(HOLD_APP)
    pool = None
    try:
        url = cluster.url()
        pool = PoolRunner(tmp_path, url, "--procs", "2", "--concurrency", "4", "--grace", "1")
        pool.wait_ready()
        with SyncClient(redis_url=url) as sc:
            for i in range(6):
                sc.enqueue(Task("moving", "hold", {}, priority=5 if i % 2 else 0))
        slot = cluster.slot("fencekit:{moving}:pending")
        source = cluster.slot_owner(slot)
        target = next(m for m in cluster.masters if m.port != source.port)
        with sync_client(url) as r:
            wait = time.monotonic() + 20
            while sum(r.hlen(k) for k in r.scan_iter(match="fencekit:{moving}:inflight:*")) < 6:
                assert time.monotonic() < wait, pool.output()[-2000:]
                time.sleep(0.05)
        cluster._command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(source))
        cluster._command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(target))
        cluster._command(
            source, "MIGRATE", target.host, target.port, "", 0, 5000, "KEYS",
            "fencekit:{moving}:pending", "fencekit:{moving}:pending:prio",
        )  # fmt: skip
        assert pool.stop(timeout=30) == 0
        log = pool.output()
        assert "crashed" not in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        assert "killed" not in log, log[-3000:]
        not_returned = [int(n) for n in re.findall(r"(\d+) task\(s\) not returned", log)]
        assert sum(not_returned) == 6, log[-3000:]
        inflight = [
            k for k in cluster._command(source, "CLUSTER", "GETKEYSINSLOT", slot, 100) if b"inflight" in k
        ]
        assert sum(cluster._command(source, "HLEN", k) for k in inflight) == 6  # kept for a reaper
    finally:
        if pool is not None:
            pool.stop()
        cluster.cleanup()
