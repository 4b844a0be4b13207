"""The results page's examples (docs/guides/results.md) run as written."""

from __future__ import annotations

import asyncio

import pytest
import redis
from tests.docs_blocks import README, block_with, with_url


def test_the_flask_example_is_the_one_the_sync_client_tests_serve():
    """The page's Flask view is docs/examples/flask_enqueue.py, which test_sync_client_waits serves."""
    example = (README.parent / "docs" / "examples" / "flask_enqueue.py").read_text()
    assert block_with("from flask import Flask") == example


def test_the_sync_client_script_runs(redis_url: str, capsys: pytest.CaptureFixture[str]):
    script = block_with('jobs.queue("reports").scheduled()[0].jid == jid')
    exec(with_url(script, redis_url.rsplit("/", 1)[0]), {"__name__": "docs_sync"})
    assert capsys.readouterr().out.splitlines()[-1] == "scheduled True"


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
