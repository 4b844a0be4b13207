"""A periodic loop that meets a bug logs it, counts it in /metrics and carries on (issue 11, item 1).

The boundaries refuse every poison shape we know (``test_poison.py``), so the
bug here is planted: the scheduler's step of a real ``Server`` raises twice
(the only injected part), while Redis, the loop, the web server and the
scrape are real. The scheduler must go on moving due tasks afterwards.
"""

from __future__ import annotations

import re

import httpx
from tests.queue_helpers import eventually, messages, new_server, running

from fencekit import Client, Task


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
