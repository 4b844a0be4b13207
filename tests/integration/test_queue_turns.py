"""Queues take turns on a running consumer (the first hour, item 3).

``docs/guides/flow.md`` promises round-robin between a consumer's queues (weighted by
``queue_weights``). On a running pool with one child at concurrency 1, tasks
enqueued on a third queue while two others kept it busy waited until both
were drained: a claim had found the third queue empty, and nothing looked at
it again while the consumer was busy (the waker blocks only when every queue
is empty). Each claiming turn now asks whether the queues found empty have
work again (``has_work.lua``).

Each test keeps ``a`` and ``b`` busy, enqueues 30 tasks on ``c`` once several
tasks ran (so ``c`` has been found empty), and reads the order performed from
that moment on.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.queue_helpers import eventually, new_server, running, worker

from fencekit import Client, Task
from fencekit.pool import Pool


def noting(order: list[str], name: str) -> Any:
    """A perform that notes its queue's name in ``order``."""

    async def note(payload: dict[str, Any]) -> None:
        order.append(name)
        await asyncio.sleep(0.002)

    return note


def turns_after(order: str, start: int, n: int = 15) -> str:
    return order[start : start + n]


async def test_a_queue_filled_while_the_others_keep_the_server_busy_takes_its_turns(redis_url: str) -> None:
    order: list[str] = []
    noter = functools.partial(noting, order)

    server = new_server(redis_url, *(worker(f"turn-{q}", "op", noter(q)) for q in "abc"), concurrency=1)
    async with Client(redis_url=redis_url) as client, running(server):
        for q in "ab":
            await client.enqueue_many([Task(f"turn-{q}", "op") for _ in range(30)])
        await eventually(lambda: len(order) >= 6, what="a and b under way")
        start = len(order)
        await client.enqueue_many([Task("turn-c", "op") for _ in range(30)])
        await eventually(lambda: len(order) == 90, what="all 90 performed")
    performed = "".join(order)
    assert turns_after(performed, start).count("c") >= 4, (start, performed)


async def test_queue_weights_hold_for_a_queue_filled_while_the_consumer_is_busy(redis_url: str) -> None:
    order: list[str] = []
    noter = functools.partial(noting, order)

    server = new_server(
        redis_url,
        *(worker(f"wturn-{q}", "op", noter(q)) for q in "ac"),
        concurrency=1,
        queue_weights={"wturn-a": 1, "wturn-c": 3},
    )
    async with Client(redis_url=redis_url) as client, running(server):
        await client.enqueue_many([Task("wturn-a", "op") for _ in range(40)])
        await eventually(lambda: len(order) >= 4, what="a under way")
        start = len(order)
        await client.enqueue_many([Task("wturn-c", "op") for _ in range(40)])
        await eventually(lambda: len(order) == 80, what="all 80 performed")
    window = turns_after("".join(order), start + 2, 16)  # the turn that asks, then the weights
    assert window.count("c") >= 10, ("".join(order), start)


POOL_APP = """
import os
import time

import redis

from fencekit import App

app = App(redis_url=os.environ["TURNS_URL"])
log = redis.Redis.from_url(os.environ["TURNS_URL"])


@app.task(queue="pturn-a")
def a() -> None:
    log.rpush("turns", "a")
    time.sleep(0.005)


@app.task(queue="pturn-b")
def b() -> None:
    log.rpush("turns", "b")
    time.sleep(0.005)


@app.task(queue="pturn-c")
def c() -> None:
    log.rpush("turns", "c")
    time.sleep(0.005)
"""


async def test_a_pool_child_takes_turns_between_three_queues(
    redis_url: str, r: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new user's scenario: one child, concurrency 1, three queues of an app."""
    (tmp_path / "turnsapp.py").write_text(POOL_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("TURNS_URL", redis_url)

    def performed() -> str:
        return "".join(x.decode() if isinstance(x, bytes) else x for x in r.lrange("turns", 0, -1))

    try:
        async with (
            Pool("turnsapp:app", procs=1, concurrency=1, web_port=None),
            Client(redis_url=redis_url) as client,
        ):
            for q in "ab":
                await client.enqueue_many([Task(f"pturn-{q}", q) for _ in range(30)])
            await eventually(lambda: r.llen("turns") >= 6, what="a and b under way", timeout=30)
            start = r.llen("turns")
            began = time.monotonic()
            await client.enqueue_many([Task("pturn-c", "c") for _ in range(30)])
            await eventually(lambda: r.llen("turns") == 90, what="all 90 performed", timeout=60)
    finally:
        sys.modules.pop("turnsapp", None)
    order = performed()
    assert turns_after(order, start).count("c") >= 4, (start, order, time.monotonic() - began)


async def test_has_work_sees_default_and_priority_tasks_and_nothing_else(redis_url: str) -> None:
    """The probe's reply: the 1-based indexes of the queues with a task waiting, priority lists too."""
    from fencekit._redis import scripts
    from fencekit._redis.clients import aclose_client, async_client
    from fencekit._redis.keys import KeySpace
    from fencekit._redis.run import arun

    keys = KeySpace()
    queues = ["hw-empty", "hw-default", "hw-prio", "hw-scheduled"]
    pendings = [keys.queue(q).pending for q in queues]
    r = async_client(redis_url)
    try:
        async with Client(redis_url=redis_url) as client:
            assert await arun(r, scripts.has_work(pendings[:1])) == []
            await client.enqueue(Task("hw-default", "op"))
            await client.enqueue(Task("hw-prio", "op", priority=3))
            await client.enqueue(Task("hw-scheduled", "op"), delay=60)
        # one queue a call, as on a cluster (a queue is a slot); several in one call elsewhere
        assert [await arun(r, scripts.has_work([p])) for p in pendings] == [[], [1], [1], []]
        if not redis_url.startswith("redis+cluster"):
            assert await arun(r, scripts.has_work(pendings)) == [2, 3]
    finally:
        await aclose_client(r)
