"""The web app over real HTTP: a uvicorn ``WebServer`` on a free port, a real Redis, httpx.

The ``scenario`` fixture runs a real ``Server`` whose workers complete,
fail, dead-letter and hold tasks, so the pages are checked against counters
that the queue itself wrote. Probes are checked against a private Redis that
the test stops, pauses (SIGSTOP) and restarts.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.routing import Mount

from fencekit._redis.clients import async_client
from fencekit._redis.keys import KeySpace
from fencekit._redis.url import parse_url
from fencekit.jobs.task import Task
from fencekit.produce.client import Client
from fencekit.runtime.server import Server
from fencekit.testing import RedisServer
from fencekit.web import WebServer, create_app
from fencekit.web._views import ChildView
from fencekit.web.source import AdminSource, DurationHistogram

HOSTILE = "<img/src=x/onerror=alert(1)>"
HOSTILE_OP = "<script>alert(2)</script>"
USER, PASSWORD = "alice", "s3cret-pw"
AUTH = (USER, PASSWORD)


class Quick:
    queue = HOSTILE
    operation = "ok"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        return None


class Boom:
    queue = "emails"
    operation = "boom"
    retry = False

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        raise RuntimeError("boom")


class Slow:
    """Holds its task in flight until the test releases it."""

    queue = "slow"
    operation = "wait"

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def perform(self, payload: dict[str, Any]) -> None:
        await self.release.wait()


async def eventually(predicate: Any, timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@dataclass
class Scenario:
    web: WebServer
    http: httpx.AsyncClient
    redis: redis.Redis
    keys: KeySpace
    server: Server
    source: AdminSource

    @property
    def origin(self) -> str:
        return self.web.url


@pytest.fixture
async def scenario(redis_url: str) -> AsyncIterator[Scenario]:
    """A running Server with 3 processed, 2 failed (1 dead letter), 1 scheduled, 1 in flight, 2 unpolled."""
    server = Server(redis_url, web_port=0, concurrency=4, grace=1.0, heartbeat_ttl=5.0)
    slow = Slow()
    server.add_workers(Quick, Boom, slow)
    run = asyncio.create_task(server.run())
    target = parse_url(redis_url)
    source = AdminSource(
        async_client(target),
        KeySpace(),
        [HOSTILE, "emails", "slow", "reports"],
        durations=server.durations,
        target=target,
        heartbeat_ttl=5.0,
    )
    web = WebServer(create_app(source, admin_username=USER, admin_password=PASSWORD, refresh=3), port=0)
    sync = redis.Redis.from_url(redis_url)
    try:
        await asyncio.wait_for(server.started.wait(), 10)
        async with Client(redis_url) as client:
            await populate(client)
        await web.start()
        async with httpx.AsyncClient(base_url=web.url, timeout=10) as http:
            yield Scenario(web, http, sync, KeySpace(), server, source)
    finally:
        sync.close()
        await web.stop()
        await source.redis.aclose()
        slow.release.set()
        server.stop()
        await asyncio.wait_for(run, 20)


async def populate(client: Client) -> None:
    for i in range(3):
        await client.enqueue(Task(HOSTILE, "ok", {"i": i}))
    await client.enqueue(Task("emails", "boom"))
    await client.enqueue(Task("emails", HOSTILE_OP, {"note": "<b>bold</b>"}))
    await client.enqueue(Task("emails", "later"), delay=3600)
    await client.enqueue(Task("slow", "wait"))
    await client.enqueue(Task("reports", "x", {"n": 1}))
    await client.enqueue(Task("reports", "x", {"n": 2}))

    async def settled() -> bool:
        hostile = await client.queue(HOSTILE).stats()
        emails = await client.queue("emails").stats()
        return (
            hostile.processed == 3
            and emails.failed == 2
            and emails.dead == 1
            and await client.queue("slow").in_flight() == 1
        )

    await eventually(settled, what="the scenario's tasks to settle")


def csrf_of(page: str) -> str:
    match = re.search(r'name=csrf value="([^"]+)"', page)
    assert match, "no CSRF token in the page"
    return match.group(1)


def metric_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


# probes ----------------------------------------------------------------------------


@pytest.fixture
async def probe_web(private_redis: RedisServer) -> AsyncIterator[httpx.AsyncClient]:
    source = AdminSource.from_url(private_redis.url(), queues=["emails"])
    web = WebServer(create_app(source, admin_username=USER, admin_password=PASSWORD), port=0)
    await web.start()
    try:
        async with httpx.AsyncClient(base_url=web.url, timeout=10) as http:
            yield http
    finally:
        await web.stop()
        await source.aclose()


async def test_live_answers_ok_without_credentials(probe_web: httpx.AsyncClient) -> None:
    response = await probe_web.get("/live")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_ready_goes_503_when_redis_stops_and_200_when_it_is_back(
    probe_web: httpx.AsyncClient, private_redis: RedisServer
) -> None:
    response = await probe_web.get("/ready")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})

    private_redis.stop()
    response = await probe_web.get("/ready")
    assert (response.status_code, response.json()) == (503, {"status": "redis unavailable"})

    private_redis.start()
    response = await probe_web.get("/ready")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


async def test_ready_answers_503_instead_of_hanging_while_redis_is_paused(
    probe_web: httpx.AsyncClient, private_redis: RedisServer
) -> None:
    # A paused Redis never answers: only the probe's own timeout can produce the 503
    # (the client waits up to its 10 s; how fast the probe answers is not the point).
    assert (await probe_web.get("/ready")).status_code == 200
    private_redis.pause()
    try:
        for _ in range(2):  # the second one runs on a fresh connection attempt
            response = await probe_web.get("/ready")
            assert (response.status_code, response.json()) == (503, {"status": "redis unavailable"})
        assert (await probe_web.get("/live")).status_code == 200
    finally:
        private_redis.resume()
    response = await probe_web.get("/ready")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


async def test_admin_says_redis_unavailable_with_503_while_redis_is_paused(
    private_redis: RedisServer,
) -> None:
    source = AdminSource.from_url(private_redis.url(), snapshot_timeout=0.5)
    web = WebServer(create_app(source), port=0)
    await web.start()
    try:
        async with httpx.AsyncClient(base_url=web.url, timeout=5) as http:
            assert (await http.get("/admin")).status_code == 200
            private_redis.pause()
            try:
                response = await http.get("/admin")  # the page's own snapshot timeout answers, not Redis
                assert response.status_code == 503
                assert "Redis unavailable" in response.text
                metrics = metric_values((await http.get("/metrics")).text)
                assert metrics[("fencekit_redis_up", ())] == 0.0
            finally:
                private_redis.resume()
            assert (await http.get("/admin")).status_code == 200
    finally:
        await web.stop()
        await source.aclose()


# authentication ------------------------------------------------------------------


async def test_admin_requires_basic_auth_when_credentials_are_set(scenario: Scenario) -> None:
    http = scenario.http
    for auth in (None, (USER, "wrong"), ("bob", PASSWORD), (USER, PASSWORD + "x")):
        response = await http.get("/admin", auth=auth)  # type: ignore[arg-type]
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith('Basic realm="fencekit"')
        assert "processed" not in response.text
    for header in ("Bearer abc", "Basic !!!notbase64", "Basic " + "YWxpY2U="):  # the last has no colon
        response = await http.get("/admin", headers={"Authorization": header})
        assert response.status_code == 401
    assert (await http.get("/admin/purge?queue=reports")).status_code == 401
    assert (await http.post("/admin/purge", data={"queue": "reports"})).status_code == 401
    assert (await http.get("/metrics")).status_code == 401

    response = await http.get("/admin", auth=AUTH)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert (await http.get("/metrics", auth=AUTH)).status_code == 200
    assert (await http.get("/live")).status_code == 200
    assert (await http.get("/ready")).status_code == 200


async def test_admin_is_open_without_credentials(redis_url: str) -> None:
    source = AdminSource.from_url(redis_url)
    web = WebServer(create_app(source, admin_username="alice"), port=0)  # one of the two: open
    await web.start()
    try:
        async with httpx.AsyncClient(base_url=web.url) as http:
            assert (await http.get("/admin")).status_code == 200
            assert (await http.get("/metrics")).status_code == 200
    finally:
        await web.stop()
        await source.aclose()


# the dashboard -------------------------------------------------------------------------


async def test_admin_shows_totals_queues_consumers_and_dead_letters(scenario: Scenario) -> None:
    page = (await scenario.http.get("/admin", auth=AUTH)).text
    totals = re.search(r"<div class=cards id=totals>(.*?)</div></div></div>", page, re.S)
    assert totals, page
    for label, value in (("processed", 3), ("failed", 2), ("fenced out", 0), ("dead", 1)):
        assert re.search(
            rf'data-counter="{label}"><div class=label>{label}</div><div class=value>{value}</div>', page
        ), (label, value)

    rows = {
        m.group(1): [int(n) for n in re.findall(r"<td class=n>(\d+)</td>", m.group(2))]
        for m in re.finditer(
            r"<tr><td class=mono><a href=\"[^\"]*/admin/history\?queue=[^\"]+\">([^<]*)</a></td>(.*?)</tr>",
            page.split("id=queues", 1)[1].split("</section>", 1)[0],
        )
    }
    hostile = HOSTILE.replace("<", "&lt;").replace(">", "&gt;")
    # pending, scheduled, in flight, dead letters, processed, failed, fenced out
    assert rows[hostile] == [0, 0, 0, 0, 3, 0, 0]
    assert rows["emails"] == [0, 1, 0, 1, 0, 2, 0]
    assert rows["slow"] == [0, 0, 1, 0, 0, 0, 0]
    assert rows["reports"] == [2, 0, 0, 0, 0, 0, 0]

    consumers = page.split("id=consumers", 1)[1].split("</section>", 1)[0]
    assert scenario.server.consumer_id in consumers
    assert "alive" in consumers
    assert re.search(r"<td class=n>1</td><td><span class='pill ok'>alive", consumers)  # 1 in flight

    dead = page.split("id=dead", 1)[1].split("</section>", 1)[0]
    assert "no worker registered for operation" in dead
    assert "Re-enqueue" in dead
    assert '<meta http-equiv="refresh" content="3; url=/admin">' in page
    assert "id=children" not in page  # no pool here


async def test_hostile_queue_names_and_reasons_render_inert(scenario: Scenario) -> None:
    response = await scenario.http.get("/admin", auth=AUTH)
    page = response.text
    assert "&lt;img/src=x/onerror=alert(1)&gt;" in page
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page  # the dead letter's payload
    assert "<img" not in page
    assert "<script" not in page
    assert "<b>" not in page
    csp = response.headers["content-security-policy"]
    assert "default-src 'none'" in csp
    assert "script-src" not in csp  # no script source at all
    assert response.headers["x-frame-options"] == "DENY"

    confirm = await scenario.http.get("/admin/purge", params={"queue": HOSTILE}, auth=AUTH)
    assert confirm.status_code == 200
    assert "<img" not in confirm.text
    assert "&lt;img/src=x/onerror=alert(1)&gt;" in confirm.text


async def test_the_redis_password_never_appears(tmp_path: Any, server_binary: str) -> None:
    password = "hunter2-do-not-show"
    with RedisServer(tmp_path / "r", binary=server_binary, config={"requirepass": password}) as server:
        url = server.url()
        assert password in url
        source = AdminSource.from_url(url, snapshot_timeout=0.5)
        web = WebServer(create_app(source), port=0)
        await web.start()
        try:
            async with httpx.AsyncClient(base_url=web.url) as http:
                page = (await http.get("/admin")).text
                assert "***" in page
                assert password not in page
                assert password not in (await http.get("/metrics")).text
                server.pause()
                try:
                    down = await http.get("/admin", timeout=10)
                finally:
                    server.resume()
                assert password not in down.text
        finally:
            await web.stop()
            await source.aclose()


# actions ------------------------------------------------------------------------------


async def test_revive_needs_the_csrf_token_and_the_same_origin(scenario: Scenario) -> None:
    http, qk = scenario.http, scenario.keys.queue("emails")
    page = (await http.get("/admin", auth=AUTH)).text
    token = csrf_of(page)
    dead_id = re.search(r'name=id value="([^"]+)"', page)
    assert dead_id
    form = {"queue": "emails", "id": dead_id.group(1)}
    same = {"Origin": scenario.origin}

    refused = [
        await http.post("/admin/revive", data=form, headers=same, auth=AUTH),
        await http.post("/admin/revive", data={**form, "csrf": "forged"}, headers=same, auth=AUTH),
        await http.post("/admin/revive", data={**form, "csrf": token}, auth=AUTH),  # no Origin/Referer
        await http.post(
            "/admin/revive",
            data={**form, "csrf": token},
            headers={"Origin": "http://evil.example"},
            auth=AUTH,
        ),
        await http.post("/admin/revive", data={**form, "csrf": token}, headers={"Origin": "null"}, auth=AUTH),
        await http.post(
            "/admin/revive",
            data={**form, "csrf": token},
            headers={"Referer": "http://evil.example/admin"},
            auth=AUTH,
        ),
    ]
    assert [r.status_code for r in refused] == [403] * len(refused)
    assert scenario.redis.zcard(qk.dead_index) == 1
    assert scenario.redis.llen(qk.pending) == 0

    response = await http.post(
        "/admin/revive",
        data={**form, "csrf": token},
        headers={"Referer": scenario.origin + "/admin"},
        auth=AUTH,
    )
    assert response.status_code == 303
    assert response.headers["location"] == "/admin?done=revived"
    # That dead letter is gone (the running server may dead-letter the task anew, under a new id).
    assert scenario.redis.zscore(qk.dead_index, dead_id.group(1)) is None
    stats = {k.decode(): int(v) for k, v in scenario.redis.hgetall(qk.stats).items()}
    assert stats["revived"] == 1

    page = (await http.get(response.headers["location"], auth=AUTH)).text
    assert "Dead letter re-enqueued." in page

    again = await http.post("/admin/revive", data={**form, "csrf": token}, headers=same, auth=AUTH)
    assert again.headers["location"] == "/admin?done=gone"


async def test_purge_needs_the_confirmation_step(scenario: Scenario) -> None:
    http, qk = scenario.http, scenario.keys.queue("reports")
    same = {"Origin": scenario.origin}
    confirm = await http.get("/admin/purge", params={"queue": "reports"}, auth=AUTH)
    assert confirm.status_code == 200
    assert "<strong>2</strong> pending task(s)" in confirm.text
    assert "http-equiv" not in confirm.text  # the confirmation page does not reload itself
    token = csrf_of(confirm.text)

    no_token = await http.post(
        "/admin/purge", data={"queue": "reports", "confirm": "yes"}, headers=same, auth=AUTH
    )
    assert no_token.status_code == 403
    unconfirmed = await http.post(
        "/admin/purge", data={"queue": "reports", "csrf": token}, headers=same, auth=AUTH
    )
    assert unconfirmed.status_code == 400
    assert scenario.redis.llen(qk.pending) == 2

    unknown = await http.post(
        "/admin/purge", data={"queue": "nope", "csrf": token, "confirm": "yes"}, headers=same, auth=AUTH
    )
    assert unknown.status_code == 404
    assert (await http.get("/admin/purge", params={"queue": "nope"}, auth=AUTH)).status_code == 404
    assert (await http.get("/admin/purge", params={"queue": "bad name"}, auth=AUTH)).status_code == 404

    done = await http.post(
        "/admin/purge", data={"queue": "reports", "csrf": token, "confirm": "yes"}, headers=same, auth=AUTH
    )
    assert done.status_code == 303
    assert done.headers["location"] == "/admin?done=purged&n=2"
    assert scenario.redis.llen(qk.pending) == 0
    page = (await http.get(done.headers["location"], auth=AUTH)).text
    assert "2 pending task(s) dropped" in page


async def test_the_app_works_mounted_under_a_prefix(scenario: Scenario) -> None:
    parent = Starlette(routes=[Mount("/jobs", app=create_app(scenario.source))])
    web = WebServer(parent, port=0)
    await web.start()
    try:
        async with httpx.AsyncClient(base_url=web.url) as http:
            assert (await http.get("/jobs/live")).json() == {"status": "ok"}
            page = (await http.get("/jobs/admin")).text
            assert 'action="/jobs/admin/revive"' in page
            assert 'href="/jobs/admin/purge?queue=reports"' in page
            confirm = await http.get("/jobs/admin/purge", params={"queue": "reports"})
            done = await http.post(
                "/jobs/admin/purge",
                data={"queue": "reports", "csrf": csrf_of(confirm.text), "confirm": "yes"},
                headers={"Origin": web.url},
            )
            assert done.status_code == 303
            assert done.headers["location"] == "/jobs/admin?done=purged&n=2"
    finally:
        await web.stop()


# metrics ------------------------------------------------------------------------------


async def test_metrics_parse_and_match_the_queue_counters(scenario: Scenario) -> None:
    response = await scenario.http.get("/metrics", auth=AUTH)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    values = metric_values(response.text)

    def v(name: str, **labels: str) -> float:
        return values[(name, tuple(sorted(labels.items())))]

    assert v("fencekit_redis_up") == 1.0
    assert v("fencekit_processed_total", queue=HOSTILE) == 3
    assert v("fencekit_failed_total", queue="emails") == 2
    assert v("fencekit_dead_total", queue="emails") == 1
    assert v("fencekit_fenced_out_total", queue="emails") == 0
    assert v("fencekit_retried_total", queue="emails") == 0
    assert v("fencekit_enqueued_total", queue="reports") == 2
    assert v("fencekit_pending", queue="reports") == 2
    assert v("fencekit_scheduled", queue="emails") == 1
    assert v("fencekit_in_flight", queue="slow") == 1
    assert v("fencekit_dead_letters", queue="emails") == 1
    assert v("fencekit_consumers") == 1
    # the Server's consumer ran 3 quick jobs and 1 failing one; the slow one is still running
    assert v("fencekit_job_duration_seconds_count") == 4
    assert v("fencekit_job_duration_seconds_bucket", le="+Inf") == 4
    # every bucket is the consumer's own histogram, cumulative (how fast the jobs ran is not the point)
    histogram = scenario.server.durations()
    buckets = [v("fencekit_job_duration_seconds_bucket", le=repr(b)) for b in histogram.bounds]
    assert buckets == [n for _, n in histogram.cumulative()[:-1]]
    assert buckets == sorted(buckets)
    assert v("fencekit_job_duration_seconds_sum") == histogram.sum
    assert not any(name.startswith("fencekit_pool") for name, _ in values)
    # counted once, however often it is scraped
    again = metric_values((await scenario.http.get("/metrics", auth=AUTH)).text)
    assert again[("fencekit_job_duration_seconds_count", ())] == 4


class Nap:
    """Sleeps as long as its task says: a lower bound of the job's duration that the test knows."""

    queue = "nap"
    operation = "sleep"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        await asyncio.sleep(payload["seconds"])


async def test_a_job_that_sleeps_past_a_bucket_bound_is_counted_above_that_bound(redis_url: str) -> None:
    server = Server(redis_url, web_port=0)
    server.add_workers(Nap)
    run = asyncio.create_task(server.run())
    try:
        await asyncio.wait_for(server.started.wait(), 10)
        assert server.web is not None
        async with Client(redis_url) as client:
            await client.enqueue(Task("nap", "sleep", {"seconds": 0.3}))

            async def processed() -> bool:
                return (await client.queue("nap").stats()).processed == 1

            await eventually(processed, what="the nap to finish")
        async with httpx.AsyncClient(base_url=server.web.url) as http:
            values = metric_values((await http.get("/metrics")).text)
    finally:
        server.stop()
        await asyncio.wait_for(run, 10)

    def bucket(le: str) -> float:
        return values[("fencekit_job_duration_seconds_bucket", (("le", le),))]

    # A job that slept 0.3 s lies above every bound up to 0.25 s; above that, speed decides.
    assert [bucket(le) for le in ("0.001", "0.01", "0.1", "0.25")] == [0, 0, 0, 0]
    assert bucket("+Inf") == 1
    assert values[("fencekit_job_duration_seconds_count", ())] == 1
    assert values[("fencekit_job_duration_seconds_sum", ())] > 0.25


async def test_a_durations_callable_may_return_a_whole_histogram(redis_url: str) -> None:
    """What the pool does: sum its children's bucket counts into one histogram per read."""
    counts = [0] * (len(DurationHistogram().bounds) + 1)
    counts[0], counts[-1] = 2, 1
    source = AdminSource.from_url(redis_url, durations=lambda: DurationHistogram.from_counts(counts, 61.5))
    web = WebServer(create_app(source), port=0)
    await web.start()
    try:
        async with httpx.AsyncClient(base_url=web.url) as http:
            values = metric_values((await http.get("/metrics")).text)
            assert values[("fencekit_job_duration_seconds_bucket", (("le", "0.001"),))] == 2
            assert values[("fencekit_job_duration_seconds_count", ())] == 3
            assert values[("fencekit_job_duration_seconds_sum", ())] == 61.5
            counts[0] = 5
            values = metric_values((await http.get("/metrics")).text)
            assert values[("fencekit_job_duration_seconds_count", ())] == 6
    finally:
        await web.stop()
        await source.aclose()


async def test_pool_children_show_on_the_page_and_in_metrics(redis_url: str) -> None:
    children = (
        ChildView(pid=4242, slot=0, restarts=0, uptime=75.5, alive=True, processed=7),
        ChildView(pid=4243, slot=1, restarts=3, uptime=0.0, alive=False),
    )
    histogram = DurationHistogram()
    for seconds in (0.002, 0.02, 0.2, 70.0):
        histogram.observe(seconds)
    source = AdminSource.from_url(redis_url, children=lambda: children, durations=histogram)
    web = WebServer(create_app(source), port=0)
    await web.start()
    try:
        async with httpx.AsyncClient(base_url=web.url) as http:
            page = (await http.get("/admin")).text
            section = page.split("id=children", 1)[1].split("</section>", 1)[0]
            assert "<td class=n>4242</td>" in section
            assert "<td class=n>3</td>" in section
            assert "1 min 15 s" in section
            durations = page.split("id=durations", 1)[1].split("</section>", 1)[0]
            assert "<td class=n>4</td>" in durations
            assert "&le; 25.0 ms" in durations  # p50: the bucket holding the 2nd of 4 jobs
            assert "&gt; 60.00 s" in durations  # p99: above the last bucket
            values = metric_values((await http.get("/metrics")).text)
            assert values[("fencekit_pool_child_restarts_total", (("slot", "1"),))] == 3
            assert values[("fencekit_pool_child_uptime_seconds", (("slot", "0"),))] == 75.5
            assert values[("fencekit_pool_children", ())] == 2
            assert values[("fencekit_job_duration_seconds_bucket", (("le", "0.005"),))] == 1
            assert values[("fencekit_job_duration_seconds_bucket", (("le", "60.0"),))] == 3
            assert values[("fencekit_job_duration_seconds_count", ())] == 4
    finally:
        await web.stop()
        await source.aclose()


# serving --------------------------------------------------------------------------------


async def test_a_running_server_serves_its_web_pages_with_its_settings(redis_url: str) -> None:
    server = Server(redis_url, web_port=0, admin_username=USER, admin_password=PASSWORD)
    server.add_workers(Quick)
    run = asyncio.create_task(server.run())
    try:
        await asyncio.wait_for(server.started.wait(), 10)
        web = server.web
        assert web is not None
        assert web.port != 0
        async with httpx.AsyncClient(base_url=web.url) as http:
            assert (await http.get("/admin")).status_code == 401
            page = (await http.get("/admin", auth=AUTH)).text
            assert "&lt;img/src=x/onerror=alert(1)&gt;" in page
    finally:
        server.stop()
        await asyncio.wait_for(run, 10)
    assert server.web is None  # stopped with the server


async def test_open_admin_on_a_non_loopback_address_logs_a_warning(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    source = AdminSource.from_url(redis_url)
    for host, creds, warned in (
        ("0.0.0.0", {}, True),
        ("127.0.0.1", {}, False),
        ("0.0.0.0", {"admin_username": USER, "admin_password": PASSWORD}, False),
    ):
        caplog.clear()
        web = WebServer(create_app(source, **creds), host=host, port=0)
        with caplog.at_level(logging.WARNING, logger="fencekit.web"):
            await web.start()
            await web.stop()
        assert any("open without credentials" in r.getMessage() for r in caplog.records) is warned, host
    await source.aclose()


async def test_web_server_stops_and_frees_its_port_and_leaves_signals_alone(redis_url: str) -> None:
    import signal

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    source = AdminSource.from_url(redis_url)
    web = WebServer(create_app(source), port=0)
    await web.start()
    assert {sig: signal.getsignal(sig) for sig in before} == before
    port = web.port
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"http://127.0.0.1:{port}/live")).status_code == 200
    await web.stop()
    await web.stop()  # idempotent
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://127.0.0.1:{port}/live")
    again = WebServer(create_app(source), port=port)  # the port is free again
    await again.start()
    await again.stop()
    busy = WebServer(create_app(source), port=port)
    await busy.start()
    with pytest.raises(OSError, match="Address already in use") as caught:
        await WebServer(create_app(source), port=port).start()
    assert caught.value.errno == errno.EADDRINUSE
    await busy.stop()
    assert {sig: signal.getsignal(sig) for sig in before} == before
    await source.aclose()
