"""/admin in a real headless Chromium (Debian's ``chromium`` package).

A real ``Server`` fills a real Redis, the app runs under uvicorn on a free
port, and Chromium loads ``/admin`` with the Basic Auth credentials in the
URL. The test reads the DOM Chromium built after load (``--dump-dom``): the
counters and queue names are there as text, and the hostile queue name and
dead-letter reason created no element. It also saves a screenshot (set
``FENCEKIT_UPDATE_SCREENSHOT=1`` to refresh ``docs/admin.png`` as well).

A missing Chromium fails the test with the install command; it never skips.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest
import redis.asyncio

from fencekit._redis.keys import KeySpace
from fencekit.jobs.histogram import DEFAULT_BUCKETS, DurationHistogram, QueueDurations
from fencekit.jobs.task import Task
from fencekit.produce.client import Client
from fencekit.runtime.server import Server
from fencekit.services._sampler import HistorySampler
from fencekit.web import WebServer, create_app
from fencekit.web.source import AdminSource

HOSTILE = "<img/src=x/onerror=alert(1)>"
HOSTILE_OP = "<script>alert(2)</script>"
USER, PASSWORD = "alice", "secret"
REPO = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


class Quick:
    queue = HOSTILE
    operation = "ok"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        return None


class Boom:
    queue = "emails"
    operation = "send"
    retry = False

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        if payload.get("fail"):
            raise RuntimeError("smtp refused")


class Slow:
    queue = "reports"
    operation = "render"

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def perform(self, payload: dict[str, Any]) -> None:
        await self.release.wait()


@pytest.fixture
async def admin_url(redis_url: str) -> AsyncIterator[str]:
    """``http://127.0.0.1:PORT`` of a dashboard over a populated Redis, behind Basic Auth."""
    server = Server(redis_url, web_port=0, concurrency=4, grace=1.0, heartbeat_ttl=5.0)
    slow = Slow()
    server.add_workers(Quick, Boom, slow)
    run = asyncio.create_task(server.run())
    source = AdminSource.from_url(
        redis_url,
        queues=[HOSTILE, "emails", "reports", "thumbnails"],
        durations=server.durations,
        heartbeat_ttl=5.0,
    )
    web = WebServer(create_app(source, admin_username=USER, admin_password=PASSWORD), port=0)
    try:
        await asyncio.wait_for(server.started.wait(), 10)
        async with Client(redis_url) as client:
            for i in range(5):
                await client.enqueue(Task(HOSTILE, "ok", {"i": i}))
            for i in range(4):
                await client.enqueue(Task("emails", "send", {"to": f"user{i}@example.com", "fail": i == 3}))
            await client.enqueue(Task("emails", HOSTILE_OP, {"note": "<b>bold</b>"}))
            await client.enqueue(Task("emails", "send", {"to": "later@example.com"}), delay=3600)
            await client.enqueue(Task("reports", "render", {"id": 7}))
            for i in range(3):
                await client.enqueue(Task("thumbnails", "resize", {"id": i}))
            deadline = time.monotonic() + 10
            while True:
                stats = await client.stats()
                if (
                    stats.processed == 8
                    and stats.dead == 1
                    and await client.queue("reports").in_flight() == 1
                ):
                    break
                assert time.monotonic() < deadline, f"the tasks did not settle: {stats}"
                await asyncio.sleep(0.02)
        await web.start()
        yield web.url
    finally:
        await web.stop()
        await source.aclose()
        slow.release.set()
        server.stop()
        await asyncio.wait_for(run, 20)


async def run_chromium(chromium: str, *args: str, timeout: float = 60.0) -> bytes:
    """Run headless Chromium while this event loop keeps serving; return its stdout."""
    with tempfile.TemporaryDirectory(prefix="fk-chromium-") as profile:
        proc = await asyncio.create_subprocess_exec(
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise AssertionError(f"chromium did not finish within {timeout}s") from None
    assert proc.returncode == 0, (
        f"chromium exited with {proc.returncode}: {err.decode(errors='replace')[-2000:]}"
    )
    return out


async def screenshot(
    chromium: str, url: str, name: str, size: tuple[int, int], least: int, tmp: Path
) -> None:
    """A PNG of ``url`` at ``size``, at least ``least`` bytes (rendered, not blank); it replaces
    ``docs/<name>`` when ``FENCEKIT_UPDATE_SCREENSHOT=1``."""
    shot = tmp / name
    await run_chromium(chromium, f"--screenshot={shot}", f"--window-size={size[0]},{size[1]}", url)
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == size
    assert len(data) > least, len(data)
    if os.environ.get("FENCEKIT_UPDATE_SCREENSHOT") == "1":
        (REPO / "docs").mkdir(exist_ok=True)
        shutil.copyfile(shot, REPO / "docs" / name)


class DomText(HTMLParser):
    """Collects the text and the element names of a serialized DOM."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.chunks: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag in ("style", "title"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("style", "title"):
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.chunks.append(data)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.chunks).split())


def with_credentials(url: str, path: str) -> str:
    return url.replace("http://", f"http://{USER}:{PASSWORD}@", 1) + path


async def test_chromium_renders_the_dashboard_with_escaped_hostile_strings(
    admin_url: str, chromium: str
) -> None:
    dom = (await run_chromium(chromium, "--dump-dom", with_credentials(admin_url, "/admin"))).decode()
    page = DomText()
    page.feed(dom)
    text = page.text

    assert "processed 8" in text, text
    assert "failed 2" in text
    assert "fenced out 0" in text
    assert "dead 1" in text
    for queue in (HOSTILE, "emails", "reports", "thumbnails"):
        assert queue in text, queue
    # the hostile strings are text, and no element was made from them
    assert f"no worker registered for operation '{HOSTILE_OP}' on queue 'emails'" in text
    assert "<b>bold</b>" in text  # the dead letter's payload, as text
    assert "img" not in page.tags
    assert "script" not in page.tags
    assert "b" not in page.tags
    # find a task; cancel the running one; run the scheduled one now, or delete it; re-enqueue
    # the dead letter; run the kept failure again; and a Pause form per queue row (four)
    assert page.tags.count("form") == 10
    assert "Latest failures" in text
    assert "RuntimeError: smtp refused" in text
    running = text.split("Running")[1].split("Scheduled next")[0]
    assert "reports" in running  # the slow task, with its operation and a Cancel button
    assert "render" in running
    assert "Cancel" in running
    scheduled = text.split("Scheduled next")[1].split("Latest failures")[0]
    assert "emails" in scheduled  # the delayed one, with Run now and Delete
    assert "Run now" in scheduled
    assert "Delete" in scheduled
    assert "Consumers" in text
    assert "alive" in text


async def test_chromium_renders_task_pages_with_their_traceback_and_actions(
    admin_url: str, redis_url: str, chromium: str
) -> None:
    async with Client(redis_url) as client:
        (failure,) = await client.queue("emails").failed()
        assert await client.queue("reports").failed() == []  # its task is running
        dead = await client.queue("emails").dead_letters()
        slow_jid = await _running_jid(client, "reports")

    async def page_of(jid: str) -> DomText:
        url = with_credentials(admin_url, f"/admin/job?jid={jid}")
        dom = (await run_chromium(chromium, "--dump-dom", url)).decode()
        page = DomText()
        page.feed(dom)
        return page

    failed = await page_of(failure.jid)
    assert "status failed" in failed.text, failed.text
    assert "RuntimeError: smtp refused" in failed.text
    assert "Traceback (most recent call last)" in failed.text
    assert 'raise RuntimeError("smtp refused")' in failed.text
    assert '"to": "user3@example.com"' in failed.text  # its params
    assert "Run it again" in failed.text
    assert failed.tags.count("form") == 1

    (letter,) = dead
    assert letter.jid is not None
    hostile = await page_of(letter.jid)
    assert "status dead" in hostile.text
    assert HOSTILE_OP in hostile.text  # the reason, as text
    assert "script" not in hostile.tags
    assert "<b>bold</b>" in hostile.text  # its params, as text
    assert "b" not in hostile.tags

    busy = await page_of(slow_jid)
    assert "status running" in busy.text
    assert "Cancel task" in busy.text


async def _running_jid(client: Client, queue: str) -> str:
    assert await client.queue(queue).pending() == [], "the slow task should be running, not pending"
    r = client.redis
    for cid in await r.hkeys("fencekit:{registry}:consumers"):
        entries = await r.hvals(f"fencekit:{{{queue}}}:inflight:{cid.decode()}")
        for raw in entries:
            jid = orjson.loads(raw)["jid"]
            info = await client.job(jid)
            assert info is not None
            assert info.status.value == "running"
            return str(jid)
    raise AssertionError(f"nothing runs on {queue}")


async def test_chromium_without_credentials_gets_no_dashboard(admin_url: str, chromium: str) -> None:
    dom = (await run_chromium(chromium, "--dump-dom", admin_url + "/admin")).decode()
    assert "processed" not in dom  # Chromium shows nothing of a 401 it cannot answer


async def test_chromium_screenshot_of_the_dashboard(
    admin_url: str, redis_url: str, chromium: str, tmp_path: Path
) -> None:
    await book_a_day(redis_url, "thumbnails")  # something in the last hour's chart
    url = with_credentials(admin_url, "/admin")
    await screenshot(chromium, url, "admin.png", (1280, 900), 20_000, tmp_path)


async def book_a_day(redis_url: str, queue: str) -> int:
    """Nearly a day of minutes booked for ``queue`` (no server samples it), as by a busy host.

    Returns what it booked as processed.
    """
    r = redis.asyncio.Redis.from_url(redis_url)
    counts = [0] * (len(DEFAULT_BUCKETS) + 1)

    def durations() -> QueueDurations:
        return QueueDurations({queue: DurationHistogram.from_counts(counts, sum(counts) * 0.04)})

    history = HistorySampler(r, KeySpace(), [queue], logging.getLogger("test.history"), durations)
    processed = 0
    try:
        now_s, _ = await r.time()
        minute = int(now_s) // 60
        # 10 minutes short of a full day: the 24 h window still holds every booked minute when
        # the clock passes a minute mark (or a few) between this booking and the page's render
        await history.sample(now_ms=(minute - 1430) * 60_000)
        for m in range(minute - 1429, minute + 1):
            wave = 400 + int(300 * math.sin(m / 90)) + (m * 37) % 120
            processed += wave
            await r.hincrby(f"fencekit:{{{queue}}}:stats", "processed", wave)
            await r.hincrby(f"fencekit:{{{queue}}}:stats", "failed", (m % 97 == 0) * 25 + m % 3)
            for bucket, share in ((3, 0.5), (4, 0.3), (5, 0.15), (7, 0.05)):
                counts[bucket] += int(wave * share * (1.5 if m % 240 < 30 and bucket == 7 else 1))
            await history.sample(now_ms=m * 60_000)
    finally:
        await r.aclose()
    return processed


async def test_chromium_renders_the_history_charts(
    admin_url: str, redis_url: str, chromium: str, tmp_path: Path
) -> None:
    processed = await book_a_day(redis_url, "thumbnails")

    async def dom_of(path: str) -> DomText:
        page = DomText()
        page.feed((await run_chromium(chromium, "--dump-dom", with_credentials(admin_url, path))).decode())
        return page

    one = await dom_of("/admin/history?window=24h&queue=thumbnails")
    assert one.tags.count("svg") == 4, one.tags  # processed, failures, depth, durations
    assert one.tags.count("rect") > 100  # the bars (and legend swatches)
    assert one.tags.count("path") >= 3  # depth, p50, p95 lines
    assert f"{processed}" in one.text  # the window's total, in the table
    assert "Processed per 10 min" in one.text  # 1,440 minutes in 144 bars
    assert "Job duration" in one.text

    every = await dom_of("/admin/history?window=1h")
    assert every.tags.count("svg") >= 4
    assert HOSTILE in every.text  # a queue link, as text
    assert "img" not in every.tags
    assert "script" not in every.tags

    dashboard = await dom_of("/admin")
    assert dashboard.tags.count("svg") == 1
    assert "Last hour" in dashboard.text

    url = with_credentials(admin_url, "/admin/history?window=24h&queue=thumbnails")
    await screenshot(chromium, url, "history.png", (1280, 1500), 40_000, tmp_path)  # charts, not blank


async def test_chromium_browses_a_queue_s_lists_with_escaped_strings(
    admin_url: str, chromium: str, tmp_path: Path
) -> None:
    """The first hour, item 8: a queue's tasks a page at a time (``/admin/queue``), in a real browser."""

    async def page_of(path: str) -> DomText:
        dom = (await run_chromium(chromium, "--dump-dom", with_credentials(admin_url, path))).decode()
        page = DomText()
        page.feed(dom)
        return page

    failed = await page_of("/admin/queue?queue=emails&list=failed")
    assert "1 failed task(s)" in failed.text, failed.text
    assert "RuntimeError: smtp refused" in failed.text
    for tab in ("pending", "scheduled", "running", "finished", "failed", "dead"):
        assert tab in failed.text
    scheduled = await page_of("/admin/queue?queue=emails&list=scheduled")
    assert "later@example.com" in scheduled.text
    dead = await page_of("/admin/queue?queue=emails&list=dead")
    assert HOSTILE_OP in dead.text  # an operation without a worker: its reason, as text
    assert "script" not in dead.tags
    hostile = await page_of(f"/admin/queue?queue={quote(HOSTILE, safe='')}&list=finished")
    assert "5 finished task(s)" in hostile.text, hostile.text
    assert HOSTILE in hostile.text
    assert "img" not in hostile.tags
    url = with_credentials(admin_url, "/admin/queue?queue=emails&list=finished")
    await screenshot(chromium, url, "admin-browse.png", (1280, 900), 20_000, tmp_path)
