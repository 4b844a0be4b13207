"""Debounce on a real Redis and Server: ``Task(debounce_key=..., debounce=...)``.

Enqueues of one key within the window replace the waiting task (its params become the last
call's, its jid stays and is what every call returns), and it runs once the window passes
without a new enqueue; ``debounce_max`` bounds the wait from the first enqueue; a task already
moved on (due, running, done) is not replaced: the next enqueue starts a new window.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
from tests.queue_helpers import eventually, new_server, scheduled, stats

from fencekit import Client, PayloadError, Server, Task

RUNS: list[tuple[str, dict[str, Any]]] = []


class Render:
    queue = "docs"
    operation = "render"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> str:
        from fencekit import current_job

        RUNS.append((current_job().jid, payload))
        return f"rendered v{payload['version']}"


@pytest.fixture(autouse=True)
def _no_runs() -> None:
    RUNS.clear()


@contextlib.asynccontextmanager
async def serving(url: str) -> AsyncIterator[Server]:
    server = new_server(url, Render, web_port=None)
    run = asyncio.create_task(server.run())
    try:
        await asyncio.wait_for(server.started.wait(), 15)
        yield server
    finally:
        server.stop()
        await asyncio.wait_for(run, 30)


def edit(version: int, **options: Any) -> Task:
    options.setdefault("debounce", 0.6)
    return Task("docs", "render", {"doc": "doc-1", "version": version}, debounce_key="doc-1", **options)


async def test_ten_enqueues_within_the_window_run_once_with_the_last_params(
    redis_url: str, r: redis.Redis
) -> None:
    async with Client(redis_url) as client, serving(redis_url):
        jids = []
        for version in range(10):
            jids.append(await client.enqueue(edit(version)))
            await asyncio.sleep(0.04)  # 10 enqueues within 0.5 s, each inside the last one's window
        assert len(set(jids)) == 1  # every call was given the waiting task's jid
        assert len(scheduled(r, "docs")) == 1
        result = await client.result(jids[0], queue="docs", timeout=10)
        await asyncio.sleep(0.8)  # a second run would come by now
    assert result == "rendered v9"
    assert [(jids[0], {"doc": "doc-1", "version": 9})] == RUNS
    assert (stats(r, "docs")["enqueued"], stats(r, "docs")["debounced"]) == (1, 9)


async def test_an_enqueue_after_the_task_moved_on_starts_a_new_window(redis_url: str) -> None:
    async with Client(redis_url) as client, serving(redis_url):
        first = await client.enqueue(edit(1, debounce=0.2))
        assert await client.result(first, queue="docs", timeout=10) == "rendered v1"
        second = await client.enqueue(edit(2, debounce=0.2))
        assert second != first
        assert await client.result(second, queue="docs", timeout=10) == "rendered v2"
    assert [p["version"] for _, p in RUNS] == [1, 2]


async def test_debounce_max_bounds_the_wait_of_a_key_enqueued_without_pause(redis_url: str) -> None:
    async with Client(redis_url) as client, serving(redis_url):
        jids = []
        for version in range(30):  # 3 s of enqueues 0.1 s apart: a 0.5 s window never passes
            jids.append(await client.enqueue(edit(version, debounce=0.5, debounce_max=1.0)))
            await asyncio.sleep(0.1)
        await eventually(lambda: RUNS and RUNS[-1][1]["version"] == 29, 10, what="the last version ran")
    assert len(RUNS) >= 2  # without debounce_max: one run, after the last enqueue
    assert len(set(jids)) == len(RUNS)  # each window one task, one run
    assert [p["version"] for _, p in RUNS] == sorted(p["version"] for _, p in RUNS)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"debounce": None}, "needs both"),
        ({"debounce_max": 0.1}, "at least the window"),
        ({"unique_key": "u"}, "unique_key"),
        ({"debounce": -1}, "debounce"),
    ],
)
async def test_a_bad_debounce_is_a_clear_error(redis_url: str, options: dict[str, Any], says: str) -> None:
    async with Client(redis_url) as client:
        with pytest.raises(PayloadError, match=says):
            await client.enqueue(edit(0, **options))


async def test_a_debounced_task_takes_no_delay(redis_url: str, r: redis.Redis) -> None:
    async with Client(redis_url) as client:
        with pytest.raises(PayloadError, match="window"):
            await client.enqueue(edit(0), delay=5)
    assert scheduled(r, "docs") == []


async def test_a_task_functions_debounce_options_key_its_calls(redis_url: str, r: redis.Redis) -> None:
    """``@app.task(debounce=..., debounce_key=...)``: the key is a function of the call's params."""
    from fencekit import App

    app = App(redis_url=redis_url)
    seen: list[tuple[str, int]] = []

    @app.task(queue="docs", debounce=0.4, debounce_key=lambda params: params["doc"])
    async def publish(doc: str, version: int) -> None:
        seen.append((doc, version))

    server = new_server(redis_url, web_port=None)
    server.add_workers(publish)
    run = asyncio.create_task(server.run())
    try:
        a = [await publish.enqueue("a", v) for v in range(3)]
        b = [await publish.enqueue("b", v) for v in range(2)]
        assert len(set(a)) == 1
        assert len(set(b)) == 1
        assert a[0] != b[0]
        await eventually(lambda: len(seen) == 2, 10, what="one run a key")
        await asyncio.sleep(0.6)
    finally:
        server.stop()
        await asyncio.wait_for(run, 30)
        await app.close()
    assert sorted(seen) == [("a", 2), ("b", 1)]


def test_a_worker_with_a_bad_debounce_is_refused() -> None:
    from tests.queue_helpers import worker

    from fencekit import ConfigError
    from fencekit.jobs.worker import inspect_worker

    async def perform(payload: dict[str, Any]) -> None:
        return None

    with pytest.raises(ConfigError, match="needs 'debounce_key'"):
        inspect_worker(worker("docs", "x", perform, debounce=1.0))
    with pytest.raises(ConfigError, match="function of the params"):
        inspect_worker(worker("docs", "x", perform, debounce=1.0, debounce_key="doc"))
    with pytest.raises(ConfigError, match="debounce"):
        inspect_worker(worker("docs", "x", perform, debounce=-1, debounce_key=lambda p: p["doc"]))
    with pytest.raises(ConfigError, match="at least"):
        inspect_worker(worker("docs", "x", perform, debounce=2, debounce_max=1, debounce_key=lambda p: 1))
