"""The history on the web: /admin/history (server-side SVG charts), /admin/api/history, /metrics.

A real ``Server`` with its own web server on a free port and a real Redis;
httpx reads the pages. Histories are empty, sparse (the jobs of this
minute) or busy (every minute of a day and every hour of 90 days, booked by
samples driven at those times); every chart must parse as SVG, carry no
element a queue name could smuggle in, and agree with the JSON.
"""

from __future__ import annotations

import asyncio
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from tests.queue_helpers import eventually, new_server, qkey, running, worker

from fencekit import Client, Task
from fencekit.runtime.server import Server
from fencekit.services._sampler import HistorySampler
from fencekit.testing import RedisServer

HOSTILE = "<img/src=x/onerror=alert(1)>"
SVG = "{http://www.w3.org/2000/svg}"
SVG_ELEMENTS = {"svg", "title", "desc", "g", "rect", "line", "polyline", "path", "circle", "text", "tspan"}


async def quick(payload: dict[str, Any]) -> None:
    return None  # no await: its duration is well under the first bucket bound (1 ms)


@pytest.fixture
async def site(redis_url: str) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    server = new_server(redis_url, worker("alpha", "job", quick), worker(HOSTILE, "job", quick))
    async with running(server):
        assert server.web is not None
        async with httpx.AsyncClient(base_url=server.web.url, timeout=20) as http:
            yield server, http


def history_of(server: Server) -> HistorySampler:
    """The server's sampler, its loop stopped: the test books at the times it chooses."""
    for task in server.services._tasks:
        if task.get_name() == "fencekit-history":
            task.cancel()
    return server.services.history


def svgs(page: str) -> list[ET.Element]:
    """Every <svg> of ``page``, parsed as XML (a chart that does not parse fails here)."""
    found = []
    rest = page
    while "<svg" in rest:
        start = rest.index("<svg")
        end = rest.index("</svg>", start) + len("</svg>")
        found.append(ET.fromstring(rest[start:end]))
        rest = rest[end:]
    return found


def check_svg(root: ET.Element) -> None:
    for element in root.iter():
        assert element.tag.startswith(SVG), element.tag
        assert element.tag[len(SVG) :] in SVG_ELEMENTS, element.tag
        assert not any(name.startswith("on") for name in element.attrib), element.attrib


async def test_empty_history_pages_render_with_no_data(site: tuple[Server, httpx.AsyncClient]) -> None:
    server, http = site
    history_of(server)
    for window in ("1h", "24h", "48h", "90d"):
        page = await http.get("/admin/history", params={"window": window})
        assert page.status_code == 200, page.text
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        charts = svgs(page.text)
        assert len(charts) == 4  # processed, failures, depth, durations (no busiest-queues chart)
        for chart in charts:
            check_svg(chart)
        assert "no data yet" in page.text
        body = (await http.get("/admin/api/history", params={"window": window})).json()
        assert body["buckets"] == []
        assert body["window"] == window
        assert sorted(body["queues"]) == sorted(["alpha", HOSTILE])
    dashboard = await http.get("/admin")
    assert dashboard.status_code == 200
    assert len(svgs(dashboard.text)) == 1


async def test_sparse_history_matches_what_ran_in_json_html_and_metrics(
    site: tuple[Server, httpx.AsyncClient], redis_url: str, r: redis.Redis
) -> None:
    server, http = site
    history = history_of(server)
    seconds, _ = r.time()
    if int(seconds) % 60 > 50:  # the reads below must happen in the minute after the booked one
        await asyncio.sleep(61 - int(seconds) % 60)
    minute = int(r.time()[0]) // 60
    await history.sample(now_ms=(minute - 1) * 60_000)  # baseline, in the previous minute
    async with Client(redis_url) as client:
        await client.enqueue_many(Task("alpha", "job", {}) for _ in range(25))
        await client.enqueue_many(Task(HOSTILE, "job", {}) for _ in range(7))
    await eventually(
        lambda: server.consumer is not None and server.consumer.stats.durations.count == 32, what="ran"
    )
    await eventually(lambda: int(r.hget(qkey("alpha", "stats"), "processed") or 0) == 25, what="acked")
    await eventually(lambda: int(r.hget(qkey(HOSTILE, "stats"), "processed") or 0) == 7, what="acked")
    await history.sample(now_ms=(minute - 1) * 60_000 + 30_000)  # booked into the previous minute

    body = (await http.get("/admin/api/history", params={"per_queue": "1"})).json()
    assert [b["processed"] for b in body["buckets"]] == [32]
    assert body["buckets"][0]["at"] == (minute - 1) * 60
    assert body["buckets"][0]["timed"] == 32
    assert body["buckets"][0]["p50"] == 0.001
    per_queue = {q: [b["processed"] for b in v] for q, v in body["per_queue"].items()}
    assert per_queue == {"alpha": [25], HOSTILE: [7]}
    one = (await http.get("/admin/api/history", params={"queue": HOSTILE})).json()
    assert one["queues"] == [HOSTILE]
    assert [b["processed"] for b in one["buckets"]] == [7]

    page = await http.get("/admin/history")
    assert page.status_code == 200
    charts = svgs(page.text)
    assert len(charts) == 5  # with the busiest queues, one line each
    for chart in charts:
        check_svg(chart)
    assert "<img" not in page.text  # the hostile queue name is text, in links and in the legend
    assert "&lt;img/src=x/onerror=alert(1)&gt;" in page.text
    titles = [t.text or "" for c in charts[:1] for t in c.iter(f"{SVG}title")]
    assert any("32" in t for t in titles), titles  # the processed bar's tooltip
    one_page = await http.get("/admin/history", params={"queue": HOSTILE, "window": "48h"})
    assert one_page.status_code == 200
    assert len(svgs(one_page.text)) == 4

    # /metrics: the newest complete minute is the one booked above
    text = (await http.get("/metrics")).text
    samples = {
        (s.name, s.labels.get("queue"), s.labels.get("quantile")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("fencekit_minute_")
    }
    assert samples[("fencekit_minute_duration_seconds", "alpha", "0.5")] == 0.001
    assert ("fencekit_minute_duration_seconds", HOSTILE, "0.95") in samples


async def test_busy_histories_render_and_agree_with_json(
    site: tuple[Server, httpx.AsyncClient], r: redis.Redis
) -> None:
    server, http = site
    history = history_of(server)
    now = int(r.time()[0])
    minute, hour = now // 60, now // 3600
    await history.sample(now_ms=(hour - 2200) * 3_600_000)
    for h in range(hour - 2159, hour - 24):  # 90 days of hours, a few hundred tasks each
        r.hincrby(qkey("alpha", "stats"), "processed", 100 + h % 300)
        r.hincrby(qkey("alpha", "stats"), "failed", h % 3)
        await history.sample(now_ms=h * 3_600_000)
    # then every minute of the last day but its oldest 10: the 24 h window still holds them all
    # when the clock passes a minute mark (or a few) before the reads below
    for m in range(minute - 1429, minute + 1):
        r.hincrby(qkey("alpha", "stats"), "processed", 10 + m % 50)
        r.hincrby(qkey(HOSTILE, "stats"), "processed", m % 7)
        await history.sample(now_ms=m * 60_000)
    for window, buckets in (("24h", 1440), ("90d", 2160)):
        body = (await http.get("/admin/api/history", params={"window": window})).json()
        assert len(body["buckets"]) >= buckets - 30, len(body["buckets"])
        page = await http.get("/admin/history", params={"window": window})
        assert page.status_code == 200
        assert len(page.content) < 2_000_000
        charts = svgs(page.text)
        assert len(charts) == 5
        for chart in charts:
            check_svg(chart)
    day = (await http.get("/admin/api/history", params={"window": "24h", "queue": "alpha"})).json()
    assert sum(b["processed"] for b in day["buckets"]) == sum(
        10 + m % 50 for m in range(minute - 1429, minute + 1)
    )


async def test_bad_requests_are_refused_clearly(site: tuple[Server, httpx.AsyncClient]) -> None:
    _, http = site
    assert (await http.get("/admin/history", params={"window": "7y"})).status_code == 400
    bad = await http.get("/admin/api/history", params={"window": "7y"})
    assert bad.status_code == 400
    assert "window must be one of 1h, 24h, 48h, 90d" in bad.json()["detail"]
    assert (await http.get("/admin/history", params={"queue": "nope"})).status_code == 404
    assert (await http.get("/admin/api/history", params={"queue": "nope"})).status_code == 404
    assert (await http.get("/admin/api/history", params={"queue": "bad name"})).status_code == 404


async def test_pages_over_a_redis_without_any_queue(redis_url: str) -> None:
    """A fresh Redis: no queue registered yet, so nothing to read; the pages still draw empty charts."""
    from fencekit.web import AdminSource, create_app
    from fencekit.web._serve import WebServer

    source = AdminSource.from_url(redis_url)
    web = WebServer(create_app(source), port=0)
    await web.start()
    try:
        async with httpx.AsyncClient(base_url=web.url, timeout=20) as http:
            for path in ("/admin", "/admin/history", "/admin/history?window=90d"):
                page = await http.get(path)
                assert page.status_code == 200, (path, page.text[:500])
                for chart in svgs(page.text):
                    check_svg(chart)
            body = (await http.get("/admin/api/history")).json()
            assert body["queues"] == []
            assert body["buckets"] == []
            assert body["end"] - body["start"] == 3600
    finally:
        await web.stop()
        await source.aclose()


async def test_history_pages_answer_503_while_redis_is_paused(private_redis: RedisServer) -> None:
    """The history reads are bounded like the dashboard's snapshot: a paused Redis is a 503, not a hang."""
    from fencekit.web import AdminSource, create_app
    from fencekit.web._serve import WebServer

    source = AdminSource.from_url(private_redis.url(), snapshot_timeout=0.5)
    web = WebServer(create_app(source), port=0)
    await web.start()
    try:
        async with httpx.AsyncClient(base_url=web.url, timeout=5) as http:
            assert (await http.get("/admin/history")).status_code == 200
            private_redis.pause()
            try:
                page = await http.get("/admin/history")
                assert page.status_code == 503
                assert "Redis unavailable" in page.text
                api = await http.get("/admin/api/history")
                assert api.status_code == 503
                assert "did not answer within 0.5s" in api.json()["detail"]
            finally:
                private_redis.resume()
            assert (await http.get("/admin/api/history")).status_code == 200
    finally:
        await web.stop()
        await source.aclose()
