"""How long a clean stop of a ``Server`` takes: ``stop()`` until ``run()`` returns.

The test suite proves what a shutdown does (unfinished tasks go back to the
head of their queue with the same attempt, a task that finishes within the
grace is acknowledged, ``run()`` returns); how fast it does it is measured
here. Each round starts a ``Server`` (not timed), waits until its tasks are
in flight, then times ``stop()`` -> ``run()`` returning:

- ``return-4``: four tasks that would run for an hour, ``grace=0``: cancel
  them, return them to their queue, deregister, close the loops and links;
- ``finish-1``: one task of 50 ms, stopped about 10 ms after it started,
  ``grace=10``: the stop waits for it, acknowledges it and ends as soon as it
  has, not after the grace (the figure is the rest of the 50 ms plus the
  cost of stopping).

    python -m pytest bench/bench_shutdown.py --benchmark-only
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import redis

from fencekit import Client, Server, Task
from fencekit.testing import RedisServer

CASES = {"return-4": (4, 3600.0, 0.0), "finish-1": (1, 0.05, 10.0)}  # tasks, their sleep, grace


class Sleep:
    queue = "bench-stop"
    operation = "sleep"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        await asyncio.sleep(payload["seconds"])


@pytest.mark.parametrize("case", list(CASES))
def test_stop(benchmark: Any, server: RedisServer, loop: asyncio.AbstractEventLoop, case: str) -> None:
    benchmark.group = "Server clean stop: stop() -> run() returns"
    n, seconds, grace = CASES[case]
    url = server.url()
    quiet = logging.getLogger("bench.fencekit.stop")
    quiet.setLevel(logging.WARNING)

    async def start() -> tuple[Server, asyncio.Task[None]]:
        with redis.Redis.from_url(url) as r:
            r.flushall()
        srv = Server(url, web_port=None, concurrency=n, grace=grace, heartbeat_ttl=10.0)
        srv.logger = quiet
        srv.add_workers(Sleep)
        run = asyncio.create_task(srv.run())
        await asyncio.wait_for(srv.started.wait(), 10)
        async with Client(url) as client:
            client.logger = quiet
            await client.enqueue_many(Task("bench-stop", "sleep", {"seconds": seconds}) for _ in range(n))
        while srv.consumer is None or srv.consumer.stats.claimed < n:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.01)  # let every claimed task reach its sleep
        return srv, run

    async def stop(srv: Server, run: asyncio.Task[None]) -> None:
        srv.stop()
        await asyncio.wait_for(run, 30)

    def setup() -> tuple[tuple[Server, asyncio.Task[None]], dict[str, Any]]:
        return loop.run_until_complete(start()), {}

    benchmark.pedantic(lambda srv, run: loop.run_until_complete(stop(srv, run)), setup=setup, rounds=10)
    with redis.Redis.from_url(url) as r:
        counters = {k.decode(): int(v) for k, v in r.hgetall("fencekit:{bench-stop}:stats").items()}
        if case == "return-4":
            assert r.llen("fencekit:{bench-stop}:pending") == n  # the last round's tasks went back
        else:
            assert counters.get("processed") == n  # the last round's task finished within the grace
