"""Loops that keep going and say why (issue 11, items 1 and 8).

A periodic loop that meets a bug logs it, counts it in /metrics and carries
on; a consumer that stops claiming because Redis refuses its heartbeats (out
of memory) says so once, and again when it claims.

The boundaries refuse every poison shape we know (``test_poison.py``), so the
bug here is planted: the scheduler's step of a real ``Server`` raises twice
(the only injected part), while Redis, the loop, the web server and the
scrape are real. The scheduler must go on moving due tasks afterwards.
"""

from __future__ import annotations

import asyncio
import re

import httpx
from tests.queue_helpers import eventually, messages, new_server, running

from fencekit import Client, Task
from fencekit.testing import RedisServer


class Idle:
    queue = "health"
    operation = "op"

    @classmethod
    async def perform(cls, payload: object) -> None:
        return None


def metric(text: str, name: str, loop: str) -> float | None:
    found = re.search(rf'^{name}\{{loop="{loop}"\}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else None


async def test_a_loop_error_is_logged_counted_in_metrics_and_survived(redis_url: str) -> None:
    server = new_server(redis_url, Idle)
    async with running(server):
        assert server.services is not None
        assert server.web is not None
        scheduler = next(loop for loop in server.services.loops if loop.name == "scheduler")
        real_step, failures = scheduler.step, [0]

        async def buggy() -> object:
            if failures[0] < 2:
                failures[0] += 1
                raise RuntimeError("a planted bug")
            return await real_step()

        async with httpx.AsyncClient(base_url=server.web.url) as http:
            before = (await http.get("/metrics")).text
            assert metric(before, "fencekit_loop_errors_total", "scheduler") == 0.0
            assert metric(before, "fencekit_loop_alive", "heartbeat") == 1.0
            scheduler.step = buggy
            await eventually(lambda: scheduler.errors == 2, 10, what="two survived errors")
            after = (await http.get("/metrics")).text
        assert metric(after, "fencekit_loop_errors_total", "scheduler") == 2.0
        assert metric(after, "fencekit_loop_alive", "scheduler") == 1.0
        assert metric(after, "fencekit_loop_errors_total", "reaper") == 0.0
        log = messages(server.logger)
        assert sum("scheduler: unexpected error (carrying on with the next round)" in m for m in log) == 2
        records = server.logger.list_handler.records  # type: ignore[attr-defined]
        assert all(r.exc_info and r.exc_info[0] is RuntimeError for r in records if "unexpected" in r.msg)
        async with Client(redis_url) as client:
            await client.enqueue(Task("health", "op", {}), delay=0.05)  # only the scheduler moves it

            async def processed() -> bool:
                return (await client.queue("health").stats()).processed == 1

            await eventually(processed, 10, what="the delayed task moved and run")


class Sleepy:
    queue = "oom"
    operation = "op"

    @classmethod
    async def perform(cls, payload: dict[str, float]) -> None:
        await asyncio.sleep(payload.get("sleep", 0))


async def test_a_consumer_idle_because_redis_refuses_heartbeats_says_why(
    private_redis: RedisServer,
) -> None:
    """Redis out of memory refuses every heartbeat: the consumer stops claiming and says so."""
    url = private_redis.url()
    server = new_server(url, Sleepy, concurrency=1, heartbeat_ttl=2.0, web_port=None)
    admin = private_redis.client()
    try:
        async with running(server), Client(url) as client:
            await client.enqueue(Task("oom", "op", {"sleep": 2.0}))
            await client.enqueue_many(Task("oom", "op", {}) for _ in range(3))
            consumer = server.consumer
            assert consumer is not None
            await eventually(lambda: consumer.running == 1, 10, what="the slow task running")
            admin.config_set("maxmemory", 1)  # noeviction: every write, every script refused
            idle = "not claiming: no heartbeat has reached Redis for more than half its 2s lease"
            await eventually(lambda: any(idle in m for m in messages(server.logger)), 15, what=idle)
            log = messages(server.logger)
            oom = "Redis is out of memory (OOM"
            assert any(m.startswith("heartbeat failed") and oom in m for m in log), log
            admin.config_set("maxmemory", 0)
            again = "claiming again: a heartbeat reached Redis after"
            await eventually(lambda: any(again in m for m in messages(server.logger)), 15, what=again)

            async def all_done() -> bool:
                return (await client.queue("oom").stats()).processed == 4

            await eventually(all_done, 15, what="the four tasks processed")
        assert sum(idle in m for m in messages(server.logger)) == 1  # said once, not every recheck
    finally:
        admin.close()
