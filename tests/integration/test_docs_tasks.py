"""The writing-tasks page's examples (docs/guides/tasks.md) run as written."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import redis
from tests.docs_blocks import block_with, with_url


async def test_the_time_limits_example_enqueues_as_it_says(redis_url: str):
    namespace: dict[str, object] = {}
    exec(block_with("class AnalyseGame"), namespace)
    from fencekit import Client
    from fencekit.jobs.codec import decode

    async with Client(redis_url=redis_url) as client:
        await namespace["produce"](client)  # type: ignore[operator]
    r = redis.Redis.from_url(redis_url)
    waiting = [decode(raw) for raw in r.lrange("fencekit:{games}:pending", 0, -1)]
    later = [decode(raw) for raw in r.zrange("fencekit:{games}:scheduled", 0, -1)]
    r.close()
    by_id = {e.params["id"]: e for e in waiting}
    assert by_id[7].timeout == 600
    assert by_id[8].expires_at is not None
    assert sorted(e.params["id"] for e in later) == [9, 10]


async def test_the_status_and_results_example_runs(redis_url: str):
    from fencekit import Client, Server

    namespace: dict[str, object] = {}
    exec(block_with("async def ask"), namespace)
    server = Server(redis_url=redis_url, web_port=None, grace=0.5)
    server.add_workers(namespace["Analyse"])
    serving = asyncio.ensure_future(server.run())
    try:
        await asyncio.wait_for(server.started.wait(), 15)
        async with Client(redis_url=redis_url) as client:
            await namespace["ask"](client)  # type: ignore[operator]
            jobs = {
                s.decode(): v
                for s, v in redis.Redis.from_url(redis_url).hgetall("fencekit:{games}:stats").items()
            }
    finally:
        server.stop()
        await asyncio.wait_for(serving, 15)
    assert int(jobs["processed"]) + int(jobs.get("cancelled", 0)) == 2  # id 8 may finish first
    assert int(jobs["deduped"]) == 1


def test_the_job_queue_example_runs_until_sigterm(redis_url: str):
    r = redis.Redis.from_url(redis_url)

    def stop_when_sent() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if r.hget("fencekit:{emails}:stats", "processed") == b"1":
                os.kill(os.getpid(), signal.SIGTERM)  # the server's own handler stops it
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=stop_when_sent)
    watcher.start()
    code = with_url(block_with("class SendEmailWorker"), redis_url.rsplit("/", 1)[0])
    exec(code, {"__name__": "readme_example"})
    watcher.join()
    keys = r.keys("email:*:status")
    assert len(keys) == 1
    assert r.get(keys[0]) == b"sent"
    r.close()
