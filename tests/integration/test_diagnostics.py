"""Small diagnostics the fault campaign found wrong (issue "What a fault campaign ... broke", item 6).

Each test says the campaign's observation it reruns:

- the JSON routes (``/live``, ``/ready``, ``/admin/api/history``) and ``/metrics``
  lacked ``X-Content-Type-Options: nosniff`` (the HTML pages had the full set);
- a running task without a record was linked from the dashboard to a job page that
  answered 404;
- a job whose own delivery was fenced out (reaped while it ran) was logged as
  ``failed (attempt 1 of 2), retrying in 1.0s: FencedOutError`` though nothing
  retries it;
- a thousand schedules logged one INFO line each per tick.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import redis.asyncio
from tests.queue_helpers import capture_logger, eventually, new_server, running, worker

from fencekit import Client, Task, current_job
from fencekit._redis.keys import KeySpace
from fencekit.jobs.periodic import Schedule
from fencekit.services._ticker import Ticker
from fencekit.testing import RedisServer
from fencekit.web import WebServer, create_app
from fencekit.web.source import AdminSource


async def test_every_route_says_nosniff(private_redis: RedisServer) -> None:
    source = AdminSource.from_url(private_redis.url(), queues=["emails"])
    web = WebServer(create_app(source), port=0)
    await web.start()
    try:
        async with httpx.AsyncClient(base_url=web.url, timeout=10) as http:
            for path in ("/live", "/ready", "/admin/api/history", "/metrics", "/admin", "/admin/job?jid=a b"):
                response = await http.get(path)
                assert response.headers.get("x-content-type-options") == "nosniff", (path, response.headers)
                assert response.headers.get_list("x-content-type-options") == ["nosniff"], path  # not twice
    finally:
        await web.stop()
        await source.aclose()


async def test_a_running_task_without_a_record_is_not_linked_to_a_page_that_does_not_exist(
    private_redis: RedisServer,
) -> None:
    url = private_redis.url()
    release = asyncio.Event()
    started: list[str] = []

    async def hold(payload: dict[str, Any]) -> None:
        started.append(current_job().jid)
        await release.wait()

    server = new_server(url, worker("diag", "hold", hold), concurrency=2)
    source = AdminSource.from_url(url, queues=["diag"])
    web = WebServer(create_app(source), port=0)
    await web.start()
    try:
        async with Client(redis_url=url) as client, running(server):
            await client.enqueue(Task("diag", "hold", {}, jid="no-record", keep_result=0))
            await client.enqueue(Task("diag", "hold", {}, jid="with-record", keep_result=60))
            await eventually(lambda: len(started) == 2, what="both running")
            async with httpx.AsyncClient(base_url=web.url, timeout=10) as http:
                page = (await http.get("/admin")).text
                assert "<td class=mono>no-record</td>" in page
                assert 'href="/admin/job?jid=no-record"' not in page
                assert 'href="/admin/job?jid=with-record"' in page
                assert (await http.get("/admin/job?jid=with-record")).status_code == 200
            release.set()
    finally:
        release.set()
        await web.stop()
        await source.aclose()


async def test_a_job_whose_delivery_was_fenced_out_is_not_logged_as_retrying(redis_url: str) -> None:
    release = asyncio.Event()
    runs: list[int] = []

    async def perform(payload: dict[str, Any]) -> None:
        runs.append(1)
        if len(runs) == 1:
            await release.wait()  # reaped meanwhile: the write below is refused
            await current_job().set_if_fresh("{fenced_log}:effect", "stale")

    server = new_server(redis_url, worker("fenced_log", "slow", perform))
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("fenced_log", "slow", {}))
        await eventually(lambda: runs, what="the first run")
        assert server.services is not None
        await server.services.reaper.reap(server.consumer_id, forget_if_silent=False, queues=["fenced_log"])
        release.set()
        await eventually(lambda: len(runs) == 2, timeout=15, what="the second delivery ran")
        await asyncio.sleep(0.3)
    records = server.logger.list_handler.records  # type: ignore[attr-defined]
    every = [r.getMessage() for r in records if r.levelno >= logging.INFO]
    lines = [m for m in every if jid in m]
    assert not [m for m in lines if "retrying in" in m], lines
    fenced = [m for m in every if "fenced out" in m]
    assert len(fenced) == 1, every
    assert "a newer delivery owns it" in fenced[0]


async def test_a_thousand_schedules_log_one_line_per_round(private_redis: RedisServer) -> None:
    schedules = [Schedule("cron", f"op{i}", None, 1000) for i in range(1000)]
    logger = capture_logger("test.diag.ticker")
    client = redis.asyncio.Redis.from_url(private_redis.url())
    now = [1000.5]
    ticker = Ticker(client, KeySpace(), schedules, logger, max_payload=2**20, clock=lambda: now[0])
    try:
        await ticker.round()
        now[0] = 1001.5
        assert await ticker.round() == 1000
    finally:
        await client.aclose()
    info = [r for r in logger.list_handler.records if r.levelno == logging.INFO]  # type: ignore[attr-defined]
    assert len(info) == 1, [r.getMessage() for r in info[:5]]
    assert "1000 run(s) of 1000 schedule(s)" in info[0].getMessage()


async def test_a_processs_lines_are_written_in_the_order_they_happened(redis_url: str) -> None:
    """The first hour, item 7: 50 of 106 failure lines came before their own "started" line (the
    per-job INFO lines are gathered and written at the next loop iteration; a WARNING went out
    at once, ahead of them)."""
    import io
    import re

    from fencekit._log import LineHandler

    out = io.StringIO()
    logger = logging.getLogger("test.diag.order")
    logger.handlers[:] = [LineHandler(out)]
    logger.setLevel(logging.INFO)
    logger.propagate = False

    async def boom(payload: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    server = new_server(redis_url, worker("order", "boom", boom, retry_count=1), concurrency=20)
    server.logger = logger
    async with Client(redis_url=redis_url) as client, running(server):
        jids = await client.enqueue_many([Task("order", "boom", {}) for _ in range(40)])
        await eventually(
            lambda: out.getvalue().count("failed permanently") == 40, timeout=30, what="every task failed"
        )
    lines = out.getvalue().splitlines()
    for jid in jids:
        mine = [line for line in lines if jid in line]
        kinds = [re.sub(r".* (started|retrying|failed permanently).*", r"\1", line) for line in mine]
        assert [k for k in kinds if k in ("started", "retrying", "failed permanently")] == [
            "started",
            "retrying",
            "started",
            "failed permanently",
        ], mine
