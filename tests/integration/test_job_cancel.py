"""Cancel on a real Redis and real processes: a waiting task leaves its queue, a running
one is fenced out at once and its coroutine cancelled by its consumer (a Server, and a
pool child) as soon as the published cancel arrives."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from tests.queue_helpers import eventually, inflight_count, new_server, qkey, running, stats, worker
from tests.servers import node_of, nodes

from fencekit import Client, FencedOutError, JobCancelled, JobStatus, Task, current_job
from fencekit.testing import RedisServer, wait_until


@pytest.mark.parametrize("keep_result", [3600.0, 0.0], ids=["with-record", "without-record"])
async def test_a_waiting_task_leaves_its_queue(redis_url: str, r: Any, keep_result: float) -> None:
    async with Client(redis_url=redis_url, keep_result=keep_result) as client:
        keep = await client.enqueue(Task("wait", "op", {"n": 1}))
        gone = await client.enqueue(Task("wait", "op", {"n": 2}))
        later = await client.enqueue(Task("wait", "op", {"n": 3}), delay=60)
        assert await client.cancel(gone)
        assert await client.cancel(later, queue="wait")
        assert not await client.cancel(gone)  # once
        assert not await client.cancel("never-enqueued")
        assert [p["params"]["n"] for p in map(_decode, r.lrange(qkey("wait", "pending"), 0, -1))] == [1]
        assert r.zcard(qkey("wait", "scheduled")) == 0
        assert stats(r, "wait")["cancelled"] == 2
        if keep_result:
            info = await client.job(gone)
            assert info is not None
            assert info.status is JobStatus.CANCELLED
            with pytest.raises(JobCancelled, match=f"task {later} was cancelled"):
                await client.result(later)
            waiting = await client.job(keep)
            assert waiting is not None
            assert waiting.status is JobStatus.PENDING
        else:
            assert await client.job(gone) is None


def _decode(raw: bytes) -> dict[str, Any]:
    import orjson

    return dict(orjson.loads(raw))


async def test_a_running_task_is_fenced_at_once_and_its_coroutine_cancelled(redis_url: str, r: Any) -> None:
    seen: dict[str, Any] = {}
    started = asyncio.Event()

    class Analyse:
        queue = "analysis"
        operation = "run"

        @classmethod
        async def perform(cls, payload: dict[str, Any]) -> str:
            job = current_job()
            started.set()
            try:
                while True:
                    try:
                        await job.set_if_fresh("{analysis}:latest", time.time())
                    except FencedOutError:
                        # cancel.lua fenced the delivery in Redis before its message reached this
                        # consumer (the write's reply won the race): fenced at once, as promised;
                        # the coroutine's cancellation is still to come
                        seen["fenced_before_the_message"] = True
                    await asyncio.sleep(0.005)
            except asyncio.CancelledError:
                seen["cancelled_at"] = time.perf_counter()
                try:
                    await job.set_if_fresh("{analysis}:latest", "after the cancel")
                except FencedOutError as exc:
                    seen["refused"] = str(exc)
                raise

    server = new_server(redis_url, Analyse)
    channel = qkey("analysis", "cancel")
    async with Client(redis_url=redis_url) as client, running(server):
        # the consumer listens before the task starts (a cancel published earlier is lost: only time)
        await eventually(
            lambda: node_of(r, channel).execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1
        )
        jid = await client.enqueue(Task("analysis", "run"))
        await asyncio.wait_for(started.wait(), 10)
        await asyncio.sleep(0.05)
        asked = time.perf_counter()
        assert await client.cancel(jid)
        assert inflight_count(r, "analysis") == 0  # fenced out in Redis as cancel() returns
        await eventually(lambda: "cancelled_at" in seen, timeout=15, what="the coroutine's cancellation")
        with pytest.raises(JobCancelled):
            await client.result(jid, timeout=5)
        took = 1000 * (seen["cancelled_at"] - asked)
        print(f"\n[cancel, Server] coroutine cancelled {took:.2f} ms after cancel()")
        await asyncio.sleep(0.1)  # an ack on its way would land by now
    assert seen["refused"]  # refused by Redis (no longer in flight), or here once perform saw the cancel
    assert r.get("{analysis}:latest") != b"after the cancel"
    s = stats(r, "analysis")
    assert (s["cancelled"], s["processed"], s["failed"], s["retried"]) == (1, 0, 0, 0)
    assert server.consumer is not None
    assert server.consumer.stats.cancelled == 1


async def test_a_job_that_swallows_its_cancel_is_refused_by_redis(redis_url: str, r: Any) -> None:
    seen: dict[str, Any] = {}
    go_on = asyncio.Event()

    class Stubborn:
        queue = "stubborn-cancel"
        operation = "run"

        @classmethod
        async def perform(cls, payload: dict[str, Any]) -> None:
            job = current_job()
            seen["job"] = job
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                pass  # the job's bug
            await go_on.wait()

    server = new_server(redis_url, Stubborn)
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("stubborn-cancel", "run"))
        await eventually(lambda: "job" in seen, what="the run")
        assert await client.cancel(jid)
        go_on.set()
        consumer = server.consumer
        assert consumer is not None
        await eventually(lambda: consumer.stats.cancelled == 1, what="the consumer's count")
    with pytest.raises(FencedOutError):
        await seen["job"].set_if_fresh("{stubborn-cancel}:x", "late")
    assert r.get("{stubborn-cancel}:x") is None


POOL_APP = textwrap.dedent(
    """
    import asyncio, os, time
    import redis.asyncio

    class Long:
        queue = "long"
        operation = "run"

        @classmethod
        async def perform(cls, payload):
            r = redis.asyncio.Redis.from_url(os.environ["TEST_REDIS_URL"])
            await r.rpush("long:started", f"{os.getpid()} {time.time()}")
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                await r.rpush("long:cancelled", f"{os.getpid()} {time.time()}")
                raise
            finally:
                await r.aclose()

    WORKERS = [Long]
    """
)


def test_cancel_reaches_a_pool_child_and_the_child_keeps_serving(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    (tmp_path / "long_app.py").write_text(POOL_APP)
    url = private_redis.url(0)
    log = (tmp_path / "pool.log").open("wb")
    pool = subprocess.Popen(
        [sys.executable, "-m", "fencekit.pool", "long_app:WORKERS", "--procs", "2", "--concurrency", "2",
         "--redis-url", url, "--web-port", "off"],
        cwd=tmp_path,
        env={**os.environ, "TEST_REDIS_URL": url,
             "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    r = private_redis.client()
    try:

        async def scenario() -> tuple[list[str], float]:
            async with Client(redis_url=url) as client:
                jids = await client.enqueue_many([Task("long", "run") for _ in range(3)])
                await eventually(lambda: r.llen("long:started") == 3, timeout=30, what="three runs")
                children = {line.split()[0] for line in (x.decode() for x in r.lrange("long:started", 0, -1))}
                asked = time.time()
                assert await client.cancel(jids[0])
                await eventually(lambda: r.llen("long:cancelled") == 1, timeout=10, what="the cancel")
                with pytest.raises(JobCancelled):
                    await client.result(jids[0], timeout=5)
                for jid in jids[1:]:
                    info = await client.job(jid)
                    assert info is not None
                    assert info.status is JobStatus.RUNNING  # the others run on
                return sorted(children), asked

        children, asked = asyncio.run(scenario())
        pid, at = r.lrange("long:cancelled", 0, -1)[0].decode().split()
        print(
            f"\n[cancel, pool child] coroutine cancelled {1000 * (float(at) - asked):.1f} ms after cancel()"
        )
        assert pid in children
        assert pool.poll() is None  # no child died, the pool serves on
        assert stats(r, "long")["cancelled"] == 1
        wait_until(lambda: "cancelled while running" in (tmp_path / "pool.log").read_text(), 10, what="log")
    finally:
        pool.terminate()
        pool.wait(30)
        log.close()
        r.close()
    assert pool.returncode == 0, (tmp_path / "pool.log").read_text()


def _waits_until_cancelled(queue: str, started: asyncio.Event, cancelled: list[str]) -> type:
    """A worker of ``queue`` (operation "run") whose task sets ``started`` and sleeps 30 s; a
    cancellation appends its jid to ``cancelled``."""

    async def wait(payload: dict[str, Any]) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(current_job().jid)
            raise

    return worker(queue, "run", wait)


async def test_a_consumer_hears_cancels_again_after_its_channel_was_killed(redis_url: str, r: Any) -> None:
    started = asyncio.Event()
    cancelled: list[str] = []
    server = new_server(redis_url, _waits_until_cancelled("rehear", started, cancelled))
    async with Client(redis_url=redis_url) as client, running(server):
        channel = qkey("rehear", "cancel")
        await eventually(
            lambda: node_of(r, channel).execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1
        )
        assert node_of(r, channel).client_kill_filter(_type="pubsub") >= 1
        await eventually(
            lambda: node_of(r, channel).execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1,
            timeout=10,
            what="resubscribed",
        )
        jid = await client.enqueue(Task("rehear", "run"))
        await asyncio.wait_for(started.wait(), 10)
        assert await client.cancel(jid)
        await eventually(lambda: cancelled == [jid], timeout=10, what="the coroutine's cancellation")


async def test_a_cancel_published_while_the_consumer_could_not_subscribe_reaches_it_once_it_can(
    redis_url: str, r: Any
) -> None:
    """The consumer's cancel subscription is down (killed, and SSUBSCRIBE refused by an ACL
    meanwhile) when a running task is cancelled: the message reaches nobody. cancel.lua keeps it
    in P:{Q}:cancelled; once the consumer subscribes again it reads the set and cancels the
    coroutine. Before, the coroutine ran on (a CI run under load lost a cancel so: redis-py
    resubscribed under the listener, which then dropped that connection and subscribed again)."""
    started = asyncio.Event()
    cancelled: list[str] = []
    channel = qkey("missed", "cancel")
    log = qkey("missed", "cancelled")

    def subscribers() -> int:
        return int(node_of(r, channel).execute_command("PUBSUB", "SHARDNUMSUB", channel)[1])

    def refuse_ssubscribe(refused: bool) -> None:
        for node in nodes(r):
            node.execute_command("ACL", "SETUSER", "default", "-ssubscribe" if refused else "+ssubscribe")

    server = new_server(redis_url, _waits_until_cancelled("missed", started, cancelled))
    async with Client(redis_url=redis_url) as client, running(server):
        await eventually(lambda: subscribers() == 1, what="subscribed")
        jid = await client.enqueue(Task("missed", "run"))
        await asyncio.wait_for(started.wait(), 10)
        refuse_ssubscribe(True)
        try:
            node_of(r, channel).client_kill_filter(_type="pubsub")
            await asyncio.sleep(0.3)
            assert subscribers() == 0  # it cannot subscribe again
            assert await client.cancel(jid)
            [entry] = node_of(r, log).zrange(log, 0, -1, withscores=True)
            assert entry[0].decode().startswith(f"{jid} ")
            assert 0 < node_of(r, log).pttl(log) <= 3_600_000
            await asyncio.sleep(0.5)
            assert cancelled == []  # the message reached nobody
        finally:
            refuse_ssubscribe(False)
        await eventually(lambda: cancelled == [jid], timeout=10, what="the coroutine's cancellation")


async def test_garbage_on_the_result_and_cancel_channels_breaks_nothing(redis_url: str, r: Any) -> None:
    """Anyone with write access can publish on the channels: odd messages are ignored."""
    release = asyncio.Event()

    class Held:
        queue = "garbage"
        operation = "run"

        @classmethod
        async def perform(cls, payload: dict[str, Any]) -> str:
            await release.wait()
            return "fine"

    server = new_server(redis_url, Held)
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("garbage", "run"))
        waiter = asyncio.ensure_future(client.result(jid, timeout=20))
        await eventually(
            lambda: (
                node_of(r, qkey("garbage", "done")).execute_command(
                    "PUBSUB", "SHARDNUMSUB", qkey("garbage", "done")
                )[1]
                == 1
            )
        )
        for junk in (b"\xff\xfe", b"", b"  ", b"x" * 10_000, jid.encode() + b" 12 extra"):
            node_of(r, qkey("garbage", "done")).execute_command("SPUBLISH", qkey("garbage", "done"), junk)
            node_of(r, qkey("garbage", "cancel")).execute_command("SPUBLISH", qkey("garbage", "cancel"), junk)
        node_of(r, qkey("garbage", "cancel")).execute_command(
            "SPUBLISH", qkey("garbage", "cancel"), f"{jid} not-a-token"
        )
        node_of(r, qkey("garbage", "cancel")).execute_command(
            "SPUBLISH", qkey("garbage", "cancel"), f"{jid} 1"
        )  # no such delivery here
        await asyncio.sleep(0.1)
        assert not waiter.done()
        release.set()
        assert await waiter == "fine"
    assert stats(r, "garbage")["processed"] == 1
    assert stats(r, "garbage")["cancelled"] == 0
