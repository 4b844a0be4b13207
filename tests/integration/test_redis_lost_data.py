"""Redis restarted empty (issue 11, item 3): said once, with what was running, and repaired.

A pool (forked children) and a one-process ``Server`` each run tasks on a
private Redis without persistence; the Redis is stopped while six tasks run
and started again empty on the same port. The supervisor's heartbeat must log
one WARNING that Redis lost its data, naming how many tasks were running; the
queue names must be registered again (``Client.queues()``); the settlements
of the tasks that ran across the loss must be worded as what happened (no
record left), never as fenced out by a reap that did not happen; and the pool
must serve new work afterwards.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis
from tests.queue_helpers import eventually, messages, new_server

from fencekit import Client, Task
from fencekit.runtime.exits import ExitCode
from fencekit.testing import RedisServer, wait_until

APP = textwrap.dedent(
    """
    import asyncio


    class Work:
        queue = "lost"
        operation = "do"

        @classmethod
        async def perform(cls, payload):
            await asyncio.sleep(payload.get("sleep", 0))


    WORKERS = [Work]
    """
)

LOST = "Redis lost its data since the previous heartbeat"
NO_RECORD = "found no record: Redis lost its data after the task was claimed"


def processed(client: redis.Redis) -> int:
    return int(client.hget("fencekit:{lost}:stats", "processed") or 0)


async def enqueue(url: str, n: int, **params: object) -> None:
    async with Client(url) as client:
        await client.enqueue_many(Task("lost", "do", dict(params)) for _ in range(n))


async def queues(url: str) -> list[str]:
    async with Client(url) as client:
        return await client.queues()


@pytest.fixture
def pool_log(tmp_path: Path) -> Path:
    (tmp_path / "lostapp.py").write_text(APP)
    return tmp_path / "pool.log"


def start_pool(app_dir: Path, url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": f"{app_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fencekit.pool",
                "lostapp:WORKERS",
                "--redis-url",
                url,
                "--web-port",
                "off",
                "--procs",
                "2",
                "--concurrency",
                "3",
                "--heartbeat-ttl",
                "3",
            ],
            cwd=app_dir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_a_pool_whose_redis_restarted_empty_says_so_once_and_serves_on(
    pool_log: Path, private_redis: RedisServer
) -> None:
    url = private_redis.url()
    proc = start_pool(pool_log.parent, url, pool_log)
    client = private_redis.client()

    def output() -> str:
        return pool_log.read_text(errors="replace")

    try:
        wait_until(lambda: "pool ready" in output() or proc.poll() is not None, 30, what="pool ready")
        asyncio.run(enqueue(url, 6, sleep=5.0))
        asyncio.run(enqueue(url, 20))  # waiting behind the six running ones
        wait_until(
            lambda: sum(client.hlen(k) for k in client.scan_iter("fencekit:{lost}:inflight:*")) == 6,
            15,
            what="six tasks running",
        )
        assert processed(client) == 0
        private_redis.stop()
        private_redis.start()
        wait_until(lambda: LOST in output() or proc.poll() is not None, 30, what=LOST)
        wait_until(lambda: output().count(NO_RECORD) == 6 or proc.poll() is not None, 30, what=NO_RECORD)
        log = output()
        assert log.count(LOST) == 1, log
        assert "6 task(s) running here will finish" in log, log  # the beat comes within 1 s of the restart
        assert "fenced out" not in log, log
        wait_until(lambda: asyncio.run(queues(url)) == ["lost"], 15, what="the queue registered again")
        asyncio.run(enqueue(url, 5))
        wait_until(lambda: processed(client) == 5, 15, what="the pool serving after the loss")
        assert output().count(LOST) == 1  # the following heartbeats see the new store id
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == ExitCode.OK
    finally:
        client.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


class Slow:
    queue = "lost"
    operation = "do"

    @classmethod
    async def perform(cls, payload: dict[str, float]) -> None:
        await asyncio.sleep(payload.get("sleep", 0))


async def test_a_server_whose_redis_restarted_empty_names_what_was_running(
    private_redis: RedisServer,
) -> None:
    url = private_redis.url()
    server = new_server(url, Slow, concurrency=4, heartbeat_ttl=3.0, web_port=None)
    run = asyncio.create_task(server.run())
    try:
        await asyncio.wait_for(server.started.wait(), 10)
        async with Client(url) as client:
            await client.enqueue_many(Task("lost", "do", {"sleep": 5.0}) for _ in range(4))
        await eventually(
            lambda: server.consumer is not None and server.consumer.running == 4, what="4 running"
        )
        private_redis.stop()
        private_redis.start()
        await eventually(lambda: any(LOST in m for m in messages(server.logger)), 20, what=LOST)
        lines = [m for m in messages(server.logger) if LOST in m]
        assert len(lines) == 1
        assert "4 task(s) running here will finish" in lines[0]
        await eventually(
            lambda: sum(NO_RECORD in m for m in messages(server.logger)) == 4, 20, what=NO_RECORD
        )
        assert not any("fenced out" in m for m in messages(server.logger))
        assert server.consumer is not None
        assert (server.consumer.stats.lost, server.consumer.stats.fenced_out) == (4, 0)
        async with Client(url) as client:
            assert await client.queues() == ["lost"]
    finally:
        server.stop()
        await asyncio.wait_for(run, 30)
