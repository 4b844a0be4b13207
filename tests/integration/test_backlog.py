"""The scaling signal read from a real Redis (:func:`fencekit.services.backlog.read_backlog`):
pending tasks of every priority, due scheduled tasks but not future ones, and the enqueue time
of the oldest task next to be claimed."""

from __future__ import annotations

import time
from datetime import timedelta

import redis.asyncio

from fencekit import Client, Task
from fencekit._redis.keys import KeySpace
from fencekit.services.backlog import read_backlog


async def test_the_backlog_counts_every_priority_and_the_due_scheduled_tasks_only(redis_url: str) -> None:
    before = int(time.time() * 1000)
    async with Client(redis_url=redis_url) as client:
        await client.enqueue_many([Task("scaled", "op", {"n": n}) for n in range(5)])
        await client.enqueue_many([Task("scaled", "op", {"n": n}, priority=3) for n in range(2)])
        await client.enqueue(Task("scaled", "op", {"late": True}), delay=timedelta(hours=1))
        await client.enqueue(Task("scaled", "op", {"due": True}), delay=timedelta(milliseconds=1))
    r = redis.asyncio.Redis.from_url(redis_url)
    try:
        time.sleep(0.01)  # the 1-ms delay has passed; no scheduler runs here to move it
        read = await read_backlog(r, KeySpace(), ["scaled", "idle"])
    finally:
        await r.aclose()
    scaled = read["scaled"]
    assert (scaled.pending, scaled.due, scaled.total) == (7, 1, 8)
    assert scaled.oldest_ms is not None
    assert before <= scaled.oldest_ms <= int(time.time() * 1000)
    assert 0 <= scaled.oldest_age < 60
    assert (read["idle"].total, read["idle"].oldest_ms, read["idle"].oldest_age) == (0, None, 0.0)
