"""Paused queues on a real Redis: no consumer on any host starts a task of a paused queue (a
running one goes on; enqueues are accepted), including one that starts while it is paused and
after a Redis restart with an AOF; everything runs after the resume. Three real pools; the CLI."""

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
from tests.fault_helpers import PoolRunner
from tests.queue_helpers import eventually, new_server, running, worker

from fencekit import Client, SyncClient, Task
from fencekit.testing import RedisServer

APP = textwrap.dedent(
    """
    import asyncio, os, time
    from fencekit import current_job

    RUNS = os.environ["TEST_RUNS_DIR"]

    class Step:
        queue = "held"
        operation = "step"

        @classmethod
        async def perform(cls, payload):
            with open(os.path.join(RUNS, f"runs-{os.getpid()}.log"), "a") as f:
                f.write(f"{current_job().jid} {time.time()}\\n")
            await asyncio.sleep(0.01)

    WORKERS = [Step]
    """
)


def starts(runs: Path) -> list[float]:
    out: list[float] = []
    for path in runs.glob("runs-*.log"):
        out += [float(line.split()[1]) for line in path.read_text().splitlines() if line]
    return sorted(out)


async def test_a_paused_queue_starts_nothing_until_it_is_resumed_and_the_running_task_goes_on(
    redis_url: str,
) -> None:
    release = asyncio.Event()
    started: list[int] = []

    async def step(payload: dict[str, Any]) -> None:
        started.append(payload["n"])
        if payload["n"] == 0:
            await release.wait()

    server = new_server(redis_url, worker("held", "step", step), concurrency=4)
    async with Client(redis_url=redis_url) as client, running(server):
        queue = client.queue("held")
        await client.enqueue(Task("held", "step", {"n": 0}))
        await eventually(lambda: started == [0], what="the first task running")
        assert await queue.pause() is True
        assert await queue.pause() is False  # paused already
        assert await queue.paused() is True
        await asyncio.sleep(1.0)  # "within about a second"
        jids = await client.enqueue_many([Task("held", "step", {"n": n}) for n in range(1, 11)])
        await asyncio.sleep(1.5)
        assert started == [0]  # accepted, not started
        assert await queue.length() == 10
        release.set()  # the running task goes on and finishes
        await eventually(
            lambda: server.consumer is not None and not server.consumer._running, what="it ended"
        )
        assert await queue.resume() is True
        await eventually(lambda: len(started) == 11, timeout=10, what="every task after the resume")
        assert await queue.paused() is False
        assert len(jids) == 10


async def test_a_consumer_that_starts_while_the_queue_is_paused_claims_nothing(redis_url: str) -> None:
    started: list[int] = []

    async def step(payload: dict[str, Any]) -> None:
        started.append(payload["n"])

    async with Client(redis_url=redis_url) as client:
        await client.queue("late").pause()
        await client.enqueue_many([Task("late", "step", {"n": n}) for n in range(5)])
        server = new_server(redis_url, worker("late", "step", step), worker("other", "step", step))
        async with running(server):
            await client.enqueue(Task("other", "step", {"n": 99}))
            await eventually(lambda: started == [99], what="the other queue served")
            await asyncio.sleep(1.0)
            assert started == [99]
            await client.queue("late").resume()
            await eventually(lambda: len(started) == 6, timeout=10, what="the paused queue's tasks")


def test_the_cli_pauses_and_resumes_and_a_sync_queue_reads_it(redis_url: str) -> None:
    with SyncClient(redis_url=redis_url) as client:
        client.enqueue(Task("cliq", "step", {}))  # the registry knows the queue
        env = {**os.environ, "FENCEKIT_REDIS_URL": redis_url}
        cli = [sys.executable, "-m", "fencekit"]
        out = subprocess.run([*cli, "pause", "cliq"], env=env, capture_output=True, text=True, timeout=60)
        assert (out.returncode, out.stdout.strip()) == (0, "cliq paused")
        assert client.queue("cliq").paused() is True
        again = subprocess.run([*cli, "pause", "cliq", "--json"], env=env, capture_output=True, text=True)
        assert '"changed": false' in again.stdout
        out = subprocess.run([*cli, "resume", "cliq"], env=env, capture_output=True, text=True, timeout=60)
        assert (out.returncode, out.stdout.strip()) == (0, "cliq resumed")
        assert client.queue("cliq").paused() is False
        unknown = subprocess.run([*cli, "pause", "nosuch"], env=env, capture_output=True, text=True)
        assert unknown.returncode != 0
        assert "nosuch" in unknown.stderr


async def test_a_pause_holds_across_a_redis_restart_with_an_aof(tmp_path: Path, server_binary: str) -> None:
    redis = RedisServer(
        tmp_path / "redis", binary=server_binary, appendonly=True, config={"appendfsync": "always"}
    )
    redis.start()
    started: list[int] = []

    async def step(payload: dict[str, Any]) -> None:
        started.append(payload["n"])

    try:
        url = redis.url()
        async with Client(redis_url=url) as client:
            await client.queue("kept").pause()
            await client.enqueue(Task("kept", "step", {"n": 1}))
        redis.stop()
        redis.start()
        server = new_server(url, worker("kept", "step", step))
        async with Client(redis_url=url) as client, running(server):
            assert await client.queue("kept").paused() is True
            await asyncio.sleep(1.0)
            assert started == []
            await client.queue("kept").resume()
            await eventually(lambda: started == [1], timeout=10, what="the task after the resume")
    finally:
        redis.cleanup()


@pytest.mark.xdist_group("faults")  # with the other fault campaigns, one at a time
async def test_three_pools_start_nothing_while_paused_and_all_after_the_resume(
    tmp_path: Path, redis_url: str
) -> None:
    (tmp_path / "faultapp.py").write_text(APP)
    runs = tmp_path / "runs"
    runs.mkdir()
    args = ("--procs", "1", "--concurrency", "4")
    pools = [PoolRunner(tmp_path, redis_url, *args) for _ in range(2)]
    try:
        for pool in pools:
            pool.wait_ready()
        async with Client(redis_url=redis_url) as client:
            queue = client.queue("held")
            await client.enqueue_many([Task("held", "step", {"n": n}) for n in range(20)])
            await eventually(lambda: len(starts(runs)) == 20, timeout=20, what="the warm-up tasks")
            await queue.pause()
            await asyncio.sleep(1.2)  # every consumer has read the pause
            paused_at = time.time()
            await client.enqueue_many([Task("held", "step", {"n": n}) for n in range(100)])
            late = PoolRunner(tmp_path, redis_url, *args)  # a pool started while the queue is paused
            pools.append(late)
            late.wait_ready()
            await asyncio.sleep(2.0)
            resumed_at = time.time()
            assert [t for t in starts(runs) if paused_at <= t] == []
            assert await queue.length() == 100
            await queue.resume()
            await eventually(lambda: len(starts(runs)) == 120, timeout=30, what="all after the resume")
            assert all(t >= resumed_at for t in starts(runs)[20:])
            pids = {p.name for p in runs.glob("runs-*.log")}
            assert len(pids) >= 2  # more than one pool took part after the resume
    finally:
        for pool in pools:
            pool.stop()
