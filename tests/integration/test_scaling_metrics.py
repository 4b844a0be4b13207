"""The scaling signal on a real Server's /metrics: ``fencekit_queue_backlog`` (pending plus due
scheduled, not the future ones), ``fencekit_queue_oldest_age_seconds`` (growing while the task
waits) and ``fencekit_desired_workers`` (1 for a Server; the pool's is tested with autoscaling in
test_recycling.py)."""

from __future__ import annotations

import asyncio
import urllib.request
from datetime import timedelta
from typing import Any

from tests.queue_helpers import new_server, running, worker

from fencekit import Client, Task


def gauges(url: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample on /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


async def test_metrics_give_the_backlog_the_oldest_age_and_the_desired_workers(redis_url: str) -> None:
    gate = asyncio.Event()

    async def hold(payload: dict[str, Any]) -> None:
        await gate.wait()

    server = new_server(redis_url, worker("scaled", "hold", hold), concurrency=1)
    async with Client(redis_url=redis_url) as client, running(server):
        assert server.services is not None
        assert server.services.web is not None
        url = server.services.web.url
        await client.enqueue(Task("scaled", "hold", {"first": True}))  # runs, holding the only slot
        while await client.queue("scaled").length() > 0:
            await asyncio.sleep(0.02)
        await client.enqueue_many([Task("scaled", "hold", {"n": n}) for n in range(4)])
        await client.enqueue(Task("scaled", "hold", {"later": True}), delay=timedelta(hours=1))
        first = await asyncio.to_thread(gauges, url)
        await asyncio.sleep(1.0)
        second = await asyncio.to_thread(gauges, url)
        gate.set()
    assert first['fencekit_queue_backlog{queue="scaled"}'] == 4.0  # the running one and the future one not
    age = 'fencekit_queue_oldest_age_seconds{queue="scaled"}'
    assert 0.0 <= first[age] < second[age]
    assert second[age] - first[age] >= 0.9  # the same task waited on
    assert first["fencekit_desired_workers"] == 1.0
