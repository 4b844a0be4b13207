"""Redis going away under a running Server, the log lines the seed promises for it,
and the C-accelerated pieces (hiredis in redis-py, the compiled RESP encoder)."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.utils
from tests.queue_helpers import (
    eventually,
    in_thread,
    inflight_count,
    messages,
    new_server,
    qkey,
    running,
    stats,
)

from fencekit import Client, Task, current_job
from fencekit._redis.clients import async_client, sync_client
from fencekit.testing import RedisServer


@pytest.fixture
def durable_redis(tmp_path: Path, server_binary: str) -> Any:
    """A private Redis with an AOF, so a stop/start keeps the in-flight record."""
    server = RedisServer(
        tmp_path / "redis", binary=server_binary, appendonly=True, config={"appendfsync": "always"}
    )
    server.start()
    yield server
    server.cleanup()


@pytest.mark.slow
async def test_a_server_survives_a_redis_outage_and_logs_the_back_off_as_the_seed_says(
    durable_redis: RedisServer,
) -> None:
    url = durable_redis.url()
    release = asyncio.Event()
    done: list[int] = []

    class Hold:
        queue = "outage"
        operation = "hold"

        @classmethod
        async def perform(cls, payload: dict) -> None:
            if payload["n"] == 1:
                await release.wait()
            done.append(payload["n"])

    server = new_server(url, Hold, heartbeat_ttl=20.0)
    r = durable_redis.client()
    try:
        async with Client(redis_url=url) as client, running(server) as serving:
            await client.enqueue(Task("outage", "hold", {"n": 1}))
            await eventually(lambda: inflight_count(r, "outage") == 1)
            r.close()
            await in_thread(durable_redis.stop)
            release.set()  # the task finishes while Redis is down: its ack must wait

            # Down until the back-off has grown twice (asserted below), the finished task's ack waiting.
            def growths() -> int:
                return sum("claiming" in m and "now retrying" in m for m in messages(server.logger))

            await eventually(lambda: done == [1] and growths() >= 2, timeout=10, what="two growths")
            assert not serving.done()
            await in_thread(durable_redis.start)
            r = durable_redis.client()
            await eventually(
                lambda: stats(r, "outage")["processed"] == 1, timeout=10, what="ack landed after restart"
            )
            assert inflight_count(r, "outage") == 0
            async with Client(redis_url=url) as fresh:  # the old pool's sockets died with Redis
                await fresh.enqueue(Task("outage", "hold", {"n": 2}))
            await eventually(lambda: stats(r, "outage")["processed"] == 2, timeout=10, what="serving again")
            assert not serving.done()
        s = stats(r, "outage")
    finally:
        r.close()

    # the consumer's own back-off lines; the process's outage lines ("Redis is not answering ...",
    # "Redis answers again (<loop>) ...") may name it too and are the outage's (test_outage.py)
    lines = [m for m in messages(server.logger) if "claiming" in m and not m.startswith("Redis ")]
    first = [m for m in lines if "failed, retrying in 0.1s" in m]
    assert len(first) == 1, lines
    delays = [float(x) for m in lines for x in re.findall(r"now retrying every ([\d.]+)s", m)]
    assert len(delays) >= 2, lines
    assert delays == sorted(delays), lines
    assert len(set(delays)) == len(delays), lines
    assert delays[0] == pytest.approx(0.2)
    assert max(delays) <= 2.0
    recovered = [m for m in lines if "recovered" in m]
    assert len(recovered) == 1, lines
    # No line per failed attempt: only the first, one per growth, and the recovery.
    assert len(lines) == 1 + len(delays) + len(recovered), lines

    # The finished task's ack was only delayed by the outage: the task must not be
    # returned to its queue and run a second time.
    lost = [m for m in messages(server.logger) if "lost claim" in m or "fenced out" in m]
    assert (done, s["processed"], s["fenced_out"], lost) == ([1, 2], 2, 0, [])


async def test_enqueue_raises_store_error_instead_of_hanging_when_redis_is_paused(
    private_redis: RedisServer,
) -> None:
    """``socket_timeout`` bounds a call to a Redis that stopped answering (I4)."""
    from fencekit import StoreError

    async with Client(redis_url=private_redis.url() + "?socket_timeout=0.3") as client:
        await client.enqueue(Task("p", "op"))
        private_redis.pause()
        try:
            with pytest.raises(StoreError):
                await asyncio.wait_for(client.enqueue(Task("p", "op")), 3)
        finally:
            private_redis.resume()


async def test_a_fenced_out_ack_is_logged_with_the_task_jid(redis_url: str) -> None:
    """Seed: every task-related message includes the task's jid."""
    r = redis.Redis.from_url(redis_url)
    gate = asyncio.Event()

    class Victim:
        queue = "fencelog"
        operation = "op"

        @classmethod
        async def perform(cls, payload: dict) -> None:
            job = current_job()
            # Simulate a reaper taking the delivery away while it runs.
            r.hdel(qkey("fencelog", f"inflight:{server.consumer_id}"), str(job.token.value))
            gate.set()

    server = new_server(redis_url, Victim)
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("fencelog", "op"))
        await asyncio.wait_for(gate.wait(), 5)
        await eventually(lambda: stats(r, "fencelog")["fenced_out"] == 1)
    r.close()
    assert stats_processed(redis_url) == 0
    fenced = [m for m in messages(server.logger) if "fenced out" in m]
    assert fenced, messages(server.logger)
    assert all(jid in m for m in fenced), fenced


def stats_processed(url: str) -> int:
    with redis.Redis.from_url(url) as r:
        return stats(r, "fencelog")["processed"]


# -- the accelerated pieces --------------------------------------------------------------------


def test_hiredis_is_in_use_by_redis_py() -> None:
    assert redis.utils.HIREDIS_AVAILABLE
    from redis._parsers import _AsyncHiredisParser, _HiredisParser

    aclient = async_client("redis://127.0.0.1:1/0")
    assert isinstance(aclient.connection_pool.make_connection()._parser, _AsyncHiredisParser)
    sclient = sync_client("redis://127.0.0.1:1/0")
    assert isinstance(sclient.connection_pool.make_connection()._parser, _HiredisParser)
    sclient.close()


def test_the_lean_link_reports_the_compiled_encoder_and_hiredis() -> None:
    from fencekit import compiled
    from fencekit._redis import hotpath

    info = compiled.describe()
    assert info["reply_parser"].startswith("hiredis ")
    assert hotpath.hiredis.__name__ == "hiredis"
    if os.environ.get("FENCEKIT_NO_EXT", "") not in ("", "0"):
        assert info["resp_encoder"].startswith("python")
        return
    assert info["resp_encoder"] == "compiled", info  # fail, don't skip: the extension must be built
    assert compiled.ACCELERATED
    from fencekit._redis import _resp, resp

    assert resp.pack_evalsha is _resp.pack_evalsha
