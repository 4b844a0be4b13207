"""The scaling signal on a real Server's /metrics: ``fencekit_queue_backlog`` (pending of every
priority plus due scheduled, not the running nor the future ones), ``fencekit_queue_oldest_age_seconds``
(growing while the task waits, 0 for an empty queue) and ``fencekit_desired_workers`` (1 for a
Server); on a real pool, ``fencekit_desired_workers`` is its ``--procs`` (its autoscaled value is
tested with autoscaling in test_recycling.py)."""

from __future__ import annotations

import asyncio
import textwrap
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.fault_helpers import PoolRunner, http_body
from tests.queue_helpers import new_server, running, worker

from fencekit import Client, Task

GAUGES = ("fencekit_queue_backlog", "fencekit_queue_oldest_age_seconds", "fencekit_desired_workers")


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        return bytes(response.read()).decode()


def samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample of a /metrics text."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def gauges(url: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample on /metrics (each scaling gauge with HELP and TYPE)."""
    text = scrape(url)
    for name in GAUGES:
        assert f"# HELP {name} " in text
        assert f"# TYPE {name} gauge" in text
    return samples(text)


async def test_metrics_give_the_backlog_the_oldest_age_and_the_desired_workers(redis_url: str) -> None:
    gate = asyncio.Event()

    async def hold(payload: dict[str, Any]) -> None:
        await gate.wait()

    server = new_server(
        redis_url, worker("scaled", "hold", hold), worker("idle", "hold", hold), concurrency=1
    )
    async with Client(redis_url=redis_url) as client, running(server):
        assert server.services is not None
        assert server.services.web is not None
        url = server.services.web.url
        await client.enqueue(Task("scaled", "hold", {"first": True}))  # runs, holding the only slot
        while await client.queue("scaled").length() > 0:
            await asyncio.sleep(0.02)
        before = time.time()
        # the oldest waiting task is on a priority list of its own
        await client.enqueue(Task("scaled", "hold", {"urgent": True}, priority=3))
        await client.enqueue_many([Task("scaled", "hold", {"n": n}) for n in range(3)])
        await client.enqueue_many(
            [Task("scaled", "hold", {"soon": n}) for n in range(2)], delay=timedelta(milliseconds=1)
        )
        await client.enqueue(Task("scaled", "hold", {"later": True}), delay=timedelta(hours=1))
        await asyncio.sleep(0.01)  # the two 1-ms delays have passed: due, whether moved to pending yet or not
        first = await asyncio.to_thread(gauges, url)
        waited = time.time() - before
        await asyncio.sleep(1.0)
        second = await asyncio.to_thread(gauges, url)
        gate.set()
    backlog, age = (
        'fencekit_queue_backlog{queue="scaled"}',
        'fencekit_queue_oldest_age_seconds{queue="scaled"}',
    )
    # 4 pending (every priority) + 2 due; not the running one, not the one due in an hour
    assert first[backlog] == second[backlog] == 6.0
    assert first['fencekit_queue_backlog{queue="idle"}'] == 0.0
    assert first['fencekit_queue_oldest_age_seconds{queue="idle"}'] == 0.0  # none waits
    # measured from the oldest task's enqueue time (ms, same host clock as Redis here)
    assert 0.0 <= first[age] <= waited + 0.002
    assert second[age] - first[age] >= 0.99  # the same task waited on, a second later
    assert first["fencekit_desired_workers"] == second["fencekit_desired_workers"] == 1.0


POOL_APP = textwrap.dedent(
    """
    class Hold:
        queue = "scaled"
        operation = "hold"

        @classmethod
        async def perform(cls, payload):
            return None

    WORKERS = [Hold]
    """
)


def test_a_pool_wants_its_procs_and_reports_the_backlog_of_its_queues(tmp_path: Path, redis_url: str) -> None:
    (tmp_path / "faultapp.py").write_text(POOL_APP)
    (tmp_path / "runs").mkdir()
    pool = PoolRunner(tmp_path, redis_url, "--procs", "2")
    try:
        pool.wait_ready()
        text = http_body(f"http://127.0.0.1:{pool.web_port}/metrics")
    finally:
        assert pool.stop() == 0
    got = samples(text)
    assert got["fencekit_desired_workers"] == 2.0  # --procs, the placement's desired_workers()
    assert got["fencekit_pool_children"] == 2.0
    assert got['fencekit_queue_backlog{queue="scaled"}'] == 0.0
    assert got['fencekit_queue_oldest_age_seconds{queue="scaled"}'] == 0.0
