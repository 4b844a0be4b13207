"""Paused queues on the admin page and in ``/metrics``: the dashboard's and the browse page's
"paused" badge and Pause / Resume button (``POST /admin/pause``, behind the same checks as every
admin form), and the ``fencekit_queue_paused`` gauge.

A real ``WebServer`` on a free port over a real Redis, httpx for the forms; every state is read
back through ``client.queue(q).paused()`` (or the paused set itself), and every refused form is
checked to have changed nothing. One test pauses a real ``Server``'s queue from its own admin
page and sees its consumer stop claiming; one renders the badge in headless Chromium.
"""

from __future__ import annotations

import asyncio
import html
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.integration.test_admin_browser import DomText, run_chromium
from tests.queue_helpers import eventually, new_server, running, worker

from fencekit import Client, Task
from fencekit._redis.keys import KeySpace
from fencekit.web import AdminSource, WebServer, create_app

HOSTILE = "<img/src=x/onerror=alert(1)>"
USER, PASSWORD = "alice", "s3cret-pw"
AUTH = (USER, PASSWORD)
BADGE = re.compile(r"<span class='pill warn'[^>]*>paused</span>")


@dataclass
class Admin:
    http: httpx.AsyncClient
    client: Client
    web: WebServer
    token: str

    @property
    def same(self) -> dict[str, str]:
        return {"Origin": self.web.url}

    async def post(self, data: dict[str, str], headers: dict[str, str] | None = None) -> httpx.Response:
        return await self.http.post(
            "/admin/pause", data=data, headers=self.same if headers is None else headers, auth=AUTH
        )

    async def dashboard(self, path: str = "/admin") -> str:
        response = await self.http.get(path, auth=AUTH)
        assert response.status_code == 200, response.text
        return response.text

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = (await self.http.get("/metrics", auth=AUTH)).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


@pytest.fixture
async def admin(redis_url: str) -> AsyncIterator[Admin]:
    """The app behind Basic Auth over a Redis that knows the queues ``emails``, ``reports`` and HOSTILE."""
    source = AdminSource.from_url(redis_url)
    web = WebServer(create_app(source, admin_username=USER, admin_password=PASSWORD), port=0)
    async with Client(redis_url) as client:
        for queue in ("emails", "reports", HOSTILE):
            await client.enqueue(Task(queue, "op", {}))
        await web.start()
        try:
            async with httpx.AsyncClient(base_url=web.url, timeout=10) as http:
                page = (await http.get("/admin", auth=AUTH)).text
                match = re.search(r'name=csrf value="([^"]+)"', page)
                assert match, page
                yield Admin(http, client, web, match.group(1))
        finally:
            await web.stop()
            await source.aclose()


def queue_row(page: str, queue: str) -> str:
    """The dashboard's table row of ``queue`` (one line of the page)."""
    table = page.split("<section id=queues>", 1)[1].split("</section>", 1)[0]
    name = html.escape(queue, quote=False)
    rows = [row for row in table.splitlines() if row.startswith("<tr>") and f'">{name}</a></td>' in row]
    assert len(rows) == 1, (queue, table)
    return rows[0]


def pause_form(row: str) -> dict[str, str]:
    """The hidden fields of the Pause / Resume form in ``row``, unescaped as a browser would send them."""
    form = re.search(r'<form method=post action="[^"]*/admin/pause" class=inline>(.*?)</form>', row)
    assert form, row
    return {
        name: html.unescape(value)
        for name, value in re.findall(r'<input type=hidden name=(\w+) value="?([^">]*)"?>', form.group(1))
    }


async def test_the_dashboard_pauses_and_resumes_a_queue_through_its_form(
    admin: Admin, caplog: pytest.LogCaptureFixture
) -> None:
    emails = admin.client.queue("emails")
    row = queue_row(await admin.dashboard(), "emails")
    assert not BADGE.search(row)
    form = pause_form(row)
    assert form == {"csrf": admin.token, "queue": "emails", "action": "pause"}
    assert ">Pause</button>" in row

    with caplog.at_level(logging.WARNING, logger="fencekit.web"):
        done = await admin.post(form)
    assert done.status_code == 303, done.text
    assert done.headers["location"] == "/admin?done=paused"
    assert await emails.paused() is True
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "admin: paused queue 'emails'"
    ]

    page = await admin.dashboard(done.headers["location"])
    assert "Queue paused: within about a second no consumer on any host claims from it" in page
    row = queue_row(page, "emails")
    assert BADGE.search(row)
    assert pause_form(row) == {"csrf": admin.token, "queue": "emails", "action": "resume"}
    assert ">Resume</button>" in row
    for other in ("reports", HOSTILE):  # the other queues are not paused, and show no badge
        assert not BADGE.search(queue_row(page, other))
        assert pause_form(queue_row(page, other))["action"] == "pause"
        assert await admin.client.queue(other).paused() is False

    again = await admin.post(form)  # the stale Pause button of an earlier page
    assert again.headers["location"] == "/admin?done=paused-already"
    assert "That queue was paused already." in await admin.dashboard(again.headers["location"])
    assert await emails.paused() is True

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fencekit.web"):
        resumed = await admin.post(pause_form(row))
    assert resumed.headers["location"] == "/admin?done=resumed"
    assert await emails.paused() is False
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "admin: resumed queue 'emails'"
    ]
    page = await admin.dashboard(resumed.headers["location"])
    assert "Queue resumed: consumers claim from it again within about a second." in page
    assert not BADGE.search(queue_row(page, "emails"))
    not_paused = await admin.post({**form, "action": "resume"})
    assert not_paused.headers["location"] == "/admin?done=resumed-already"
    assert "That queue was not paused." in await admin.dashboard(not_paused.headers["location"])


async def test_a_hostile_queue_name_goes_through_the_form_escaped_and_back(admin: Admin) -> None:
    row = queue_row(await admin.dashboard(), HOSTILE)
    assert "<img" not in row
    form = pause_form(row)
    assert form["queue"] == HOSTILE  # escaped in the page, the name itself in the post
    assert (await admin.post(form)).headers["location"] == "/admin?done=paused"
    assert await admin.client.queue(HOSTILE).paused() is True
    page = await admin.dashboard()
    assert BADGE.search(queue_row(page, HOSTILE))
    assert "<img" not in page


async def test_a_pause_or_resume_without_the_token_or_from_another_origin_changes_nothing(
    admin: Admin,
) -> None:
    keys, r = KeySpace(), admin.client.redis
    for action, paused in (("pause", False), ("resume", True)):
        if paused:
            await admin.client.queue("emails").pause()
        form = {"queue": "emails", "action": action}
        refused = [
            await admin.post(form),  # no token
            await admin.post({**form, "csrf": "forged"}),
            await admin.post({**form, "csrf": admin.token}, headers={}),  # no Origin, no Referer
            await admin.post({**form, "csrf": admin.token}, headers={"Origin": "http://evil.example"}),
            await admin.post({**form, "csrf": admin.token}, headers={"Origin": "null"}),
            await admin.post({**form, "csrf": admin.token}, headers={"Referer": "http://evil.example/admin"}),
        ]
        assert [r.status_code for r in refused] == [403] * len(refused), action
        assert "missing or stale form token" in refused[1].text
        assert "cross-origin or origin-less form post refused" in refused[3].text
        assert await admin.client.queue("emails").paused() is paused, action
        assert await r.smembers(keys.paused) == ({b"emails"} if paused else set())
        # without the password, not even the checks are reached
        anonymous = await admin.http.post(
            "/admin/pause", data={**form, "csrf": admin.token}, headers=admin.same
        )
        assert anonymous.status_code == 401
        assert await admin.client.queue("emails").paused() is paused
    # the same form from this origin, by Referer when there is no Origin, is accepted
    accepted = await admin.post(
        {"queue": "emails", "action": "resume", "csrf": admin.token},
        headers={"Referer": admin.web.url + "/admin"},
    )
    assert accepted.status_code == 303
    assert await admin.client.queue("emails").paused() is False


async def test_an_unknown_queue_or_action_is_refused_and_nothing_is_paused(admin: Admin) -> None:
    for queue in ("nosuch", "bad name", "", "x" * 300):
        refused = await admin.post({"queue": queue, "action": "pause", "csrf": admin.token})
        assert refused.status_code == 404, queue
        assert "no such queue" in refused.text
    missing = await admin.post({"action": "pause", "csrf": admin.token})
    assert missing.status_code == 404
    for action in ("", "stop", "PAUSE"):
        bad = await admin.post({"queue": "emails", "action": action, "csrf": admin.token})
        assert bad.status_code == 400, action
        assert "action must be pause or resume" in bad.text
    assert await admin.client.redis.smembers(KeySpace().paused) == set()
    assert await admin.client.queue("nosuch").paused() is False
    assert "nosuch" not in await admin.client.queues()


async def test_metrics_show_each_queue_paused_or_not(admin: Admin) -> None:
    def paused_gauge(values: dict[Any, float]) -> dict[str, float]:
        return {
            dict(labels)["queue"]: v
            for (name, labels), v in values.items()
            if name == "fencekit_queue_paused"
        }

    assert paused_gauge(await admin.metrics()) == {"emails": 0.0, "reports": 0.0, HOSTILE: 0.0}
    assert (await admin.post({"queue": "emails", "action": "pause", "csrf": admin.token})).status_code == 303
    text = (await admin.http.get("/metrics", auth=AUTH)).text
    assert 'fencekit_queue_paused{queue="emails"} 1.0' in text
    assert 'fencekit_queue_paused{queue="reports"} 0.0' in text
    assert "# TYPE fencekit_queue_paused gauge" in text
    assert paused_gauge(await admin.metrics()) == {"emails": 1.0, "reports": 0.0, HOSTILE: 0.0}

    await admin.post({"queue": "emails", "action": "resume", "csrf": admin.token})
    assert 'fencekit_queue_paused{queue="emails"} 0.0' in (await admin.http.get("/metrics", auth=AUTH)).text
    assert paused_gauge(await admin.metrics()) == {"emails": 0.0, "reports": 0.0, HOSTILE: 0.0}


async def test_a_source_showing_some_queues_reports_a_paused_one_it_shows(redis_url: str) -> None:
    """``queues=[...]``: the shown queues only, paused ones marked, even one the registry never saw."""
    async with Client(redis_url) as client:
        await client.queue("fresh").pause()  # paused before anything was enqueued to it
        await client.queue("hidden").pause()
        source = AdminSource.from_url(redis_url, queues=["fresh", "emails"])
        try:
            snap = await source.snapshot()
        finally:
            await source.aclose()
    assert [(q.name, q.paused) for q in snap.queues] == [("fresh", True), ("emails", False)]


async def test_the_browse_page_shows_the_badge_and_its_button_comes_back_to_the_list(admin: Admin) -> None:
    page = (
        await admin.http.get("/admin/queue", params={"queue": "emails", "list": "failed"}, auth=AUTH)
    ).text
    heading = page.split("<section id=browse>", 1)[1].split("</h2>", 1)[0]
    assert not BADGE.search(heading)
    form = pause_form(heading)
    assert form == {
        "csrf": admin.token,
        "queue": "emails",
        "action": "pause",
        "next": "queue",
        "list": "failed",
    }

    done = await admin.post(form)
    assert done.status_code == 303
    assert done.headers["location"] == "/admin/queue?queue=emails&list=failed&done=paused"
    assert await admin.client.queue("emails").paused() is True
    page = (await admin.http.get(done.headers["location"], auth=AUTH)).text
    assert "Queue paused: within about a second" in page
    heading = page.split("<section id=browse>", 1)[1].split("</h2>", 1)[0]
    assert BADGE.search(heading)
    assert pause_form(heading)["action"] == "resume"

    odd = await admin.post({**pause_form(heading), "list": "<nope>"})  # an unknown list: the first one
    assert odd.headers["location"] == "/admin/queue?queue=emails&list=pending&done=resumed"
    assert await admin.client.queue("emails").paused() is False


async def test_pausing_from_a_server_s_own_admin_page_stops_its_consumer_claiming(redis_url: str) -> None:
    started: list[int] = []

    async def step(payload: dict[str, Any]) -> None:
        started.append(payload["n"])

    server = new_server(redis_url, worker("work", "step", step))
    async with Client(redis_url) as client, running(server):
        await client.enqueue(Task("work", "step", {"n": 0}))
        await eventually(lambda: started == [0], what="the first task")
        assert server.web is not None
        async with httpx.AsyncClient(base_url=server.web.url, timeout=10) as http:
            page = (await http.get("/admin")).text
            form = pause_form(queue_row(page, "work"))
            done = await http.post("/admin/pause", data=form, headers={"Origin": server.web.url})
            assert done.headers["location"] == "/admin?done=paused"
            await asyncio.sleep(1.0)  # "within about a second"
            await client.enqueue_many([Task("work", "step", {"n": n}) for n in range(1, 4)])
            await asyncio.sleep(1.5)
            assert started == [0]  # accepted, not claimed
            assert await client.queue("work").length() == 3
            page = (await http.get("/admin")).text
            row = queue_row(page, "work")
            assert BADGE.search(row)
            assert re.findall(r"<td class=n>(\d+)</td>", row)[0] == "3"  # pending
            resumed = await http.post(
                "/admin/pause", data=pause_form(row), headers={"Origin": server.web.url}
            )
            assert resumed.headers["location"] == "/admin?done=resumed"
            await eventually(lambda: sorted(started) == [0, 1, 2, 3], what="the tasks after the resume")


async def test_chromium_renders_the_paused_badge_and_the_buttons(admin: Admin, chromium: str) -> None:
    await admin.client.queue("reports").pause()
    url = admin.web.url.replace("http://", f"http://{USER}:{PASSWORD}@", 1)
    dom = DomText()
    dom.feed((await run_chromium(chromium, "--dump-dom", url + "/admin")).decode())
    queues = dom.text.split("Queues", 1)[1].split("Consumers", 1)[0]
    assert "reports paused" in queues, queues  # the badge, next to the name
    assert queues.count("paused") == 1
    assert queues.count("Resume") == 1
    assert queues.count("Pause") == 2  # emails and the hostile one
    assert HOSTILE in queues  # as text
    assert "img" not in dom.tags
    browse = DomText()
    browse.feed((await run_chromium(chromium, "--dump-dom", url + "/admin/queue?queue=reports")).decode())
    assert "Queue reports paused Resume" in browse.text, browse.text
