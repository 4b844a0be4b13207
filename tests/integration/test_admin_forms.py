"""The admin page's forms against what a hostile or unlucky browser sends.

Oversized and undecodable form bodies, a revive without an id, a notice of a
dead letter already gone, a request without a Host, and Redis stopped between
the page and the post. A real ``WebServer`` on a free port, a private Redis
and httpx; every answer is checked by its status and its words.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from fencekit.jobs.task import Task
from fencekit.produce.client import Client
from fencekit.testing import RedisServer
from fencekit.web import WebServer, create_app
from fencekit.web._security import MAX_FORM_BYTES
from fencekit.web.source import AdminSource


@dataclass
class Admin:
    http: httpx.AsyncClient
    web: WebServer
    token: str
    same: dict[str, str]


@pytest.fixture
async def admin(private_redis: RedisServer) -> AsyncIterator[Admin]:
    async with Client(private_redis.url()) as client:
        await client.enqueue(Task("forms", "op"))  # a known queue
    source = AdminSource.from_url(private_redis.url())
    web = WebServer(create_app(source), port=0)
    await web.start()
    try:
        async with httpx.AsyncClient(base_url=web.url) as http:
            page = (await http.get("/admin/purge", params={"queue": "forms"})).text  # a form: its token
            match = re.search(r'name=csrf value="([^"]+)"', page)
            assert match, page
            yield Admin(http, web, match.group(1), {"Origin": web.url})
    finally:
        await web.stop()
        await source.aclose()


async def test_a_form_declared_too_large_is_refused_before_it_is_read(admin: Admin) -> None:
    response = await admin.http.post(
        "/admin/revive",
        content=b"queue=forms&csrf=" + b"x" * (MAX_FORM_BYTES + 1),
        headers={**admin.same, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 413
    assert "form too large" in response.text


async def test_a_form_streamed_past_the_limit_is_refused(admin: Admin) -> None:
    async def body() -> AsyncIterator[bytes]:  # chunked: no Content-Length to refuse it by
        for _ in range(4):
            yield b"a" * (MAX_FORM_BYTES // 2)

    response = await admin.http.post(
        "/admin/revive",
        content=body(),
        headers={**admin.same, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 413


async def test_a_form_that_is_not_utf8_has_no_token(admin: Admin) -> None:
    response = await admin.http.post(
        "/admin/revive",
        content=b"queue=forms&csrf=\xff\xfe",
        headers={**admin.same, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 403
    assert "missing or stale form token" in response.text


async def test_a_revive_without_an_id_is_a_bad_request(admin: Admin) -> None:
    for dead_id in ("", "x" * 201):
        response = await admin.http.post(
            "/admin/revive", data={"queue": "forms", "csrf": admin.token, "id": dead_id}, headers=admin.same
        )
        assert response.status_code == 400
        assert "missing dead-letter id" in response.text


async def test_the_page_says_when_a_dead_letter_was_already_gone(admin: Admin) -> None:
    page = (await admin.http.get("/admin", params={"done": "gone"})).text
    assert "That dead letter was already gone (re-enqueued or dropped)." in page


async def test_a_post_without_a_host_header_is_refused(admin: Admin) -> None:
    """HTTP/1.0 without Host: no origin to compare, so no state change."""
    body = b"queue=forms"
    request = (
        b"POST /admin/revive HTTP/1.0\r\nOrigin: " + admin.same["Origin"].encode() + b"\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", admin.web.port)
    try:
        writer.write(request)
        reply = await asyncio.wait_for(reader.read(), 10)  # HTTP/1.0: the server closes after replying
    finally:
        writer.close()
        await writer.wait_closed()
    assert reply.startswith(b"HTTP/1.1 403"), reply[:200]
    assert b"cross-origin or origin-less form post refused" in reply


async def test_forms_answer_redis_unavailable_while_redis_is_down(
    admin: Admin, private_redis: RedisServer
) -> None:
    private_redis.stop()
    try:
        confirm = await admin.http.get("/admin/purge", params={"queue": "forms"})
        assert confirm.status_code == 503
        assert "Redis unavailable" in confirm.text
        posted = await admin.http.post(
            "/admin/purge", data={"queue": "forms", "csrf": admin.token, "confirm": "yes"}, headers=admin.same
        )
        assert posted.status_code == 503
        assert "Redis unavailable" in posted.text
    finally:
        private_redis.start()


async def test_a_task_page_cancels_and_retries_through_checked_forms(
    admin: Admin, private_redis: RedisServer
) -> None:
    async with Client(private_redis.url()) as client:
        jid = await client.enqueue(Task("forms", "op", {"n": 1}))
    page = await admin.http.get("/admin/job", params={"jid": jid})
    assert page.status_code == 200
    assert "status</th><td data-field=status>pending" in page.text
    assert "Cancel task" in page.text
    # the cancel form without its token, and from another origin, changes nothing
    refused = await admin.http.post("/admin/cancel", data={"queue": "forms", "jid": jid}, headers=admin.same)
    assert refused.status_code == 403
    foreign = await admin.http.post(
        "/admin/cancel",
        data={"queue": "forms", "jid": jid, "csrf": admin.token},
        headers={"Origin": "http://evil.example"},
    )
    assert foreign.status_code == 403
    async with Client(private_redis.url()) as client:
        info = await client.job(jid)
        assert info is not None
        assert info.status.value == "pending"
    done = await admin.http.post(
        "/admin/cancel", data={"queue": "forms", "jid": jid, "csrf": admin.token}, headers=admin.same
    )
    assert done.status_code == 303
    assert done.headers["location"] == f"/admin/job?jid={jid}&done=cancelled"
    after = await admin.http.get(done.headers["location"])
    assert "Task cancelled." in after.text
    assert "status</th><td data-field=status>cancelled" in after.text
    again = await admin.http.post(
        "/admin/cancel", data={"queue": "forms", "jid": jid, "csrf": admin.token}, headers=admin.same
    )
    assert again.headers["location"].endswith("done=not-cancelled")
    retry = await admin.http.post(
        "/admin/retry", data={"queue": "forms", "jid": jid, "csrf": admin.token}, headers=admin.same
    )
    assert retry.headers["location"].endswith("done=retry-gone")  # cancelled, not a kept failure


@pytest.mark.parametrize(
    ("params", "status", "words"),
    [
        ({}, 400, "give a jid"),
        ({"jid": "two words"}, 400, "give a jid"),
        ({"jid": "no-such-task"}, 404, "no record of that task"),
    ],
)
async def test_a_task_page_for_a_bad_or_unknown_jid_says_so(
    admin: Admin, params: dict[str, str], status: int, words: str
) -> None:
    response = await admin.http.get("/admin/job", params=params)
    assert response.status_code == status
    assert words in response.text


async def test_a_cancel_form_for_an_unknown_queue_or_without_a_jid_is_refused(admin: Admin) -> None:
    unknown = await admin.http.post(
        "/admin/cancel", data={"queue": "nope", "jid": "x", "csrf": admin.token}, headers=admin.same
    )
    assert unknown.status_code == 404
    blank = await admin.http.post(
        "/admin/cancel", data={"queue": "forms", "csrf": admin.token}, headers=admin.same
    )
    assert blank.status_code == 400
    assert "missing jid" in blank.text


async def test_the_dashboard_runs_a_scheduled_task_now_or_deletes_it(
    admin: Admin, private_redis: RedisServer
) -> None:
    async with Client(private_redis.url()) as client:
        soon = await client.enqueue(Task("forms", "op", {"n": 2}), delay=3600)
        gone = await client.enqueue(Task("forms", "op", {"n": 3}), delay=3600)
        page = (await admin.http.get("/admin")).text
        assert page.count("Run now") == 2
        moved = await admin.http.post(
            "/admin/run-now", data={"queue": "forms", "jid": soon, "csrf": admin.token}, headers=admin.same
        )
        assert moved.status_code == 303
        assert moved.headers["location"] == "/admin?done=run-now"
        assert (
            "The scheduled task is at the head of its queue."
            in (await admin.http.get("/admin?done=run-now")).text
        )
        info = await client.job(soon)
        assert info is not None
        assert info.status.value == "pending"
        assert info.due_at is None
        again = await admin.http.post(
            "/admin/run-now", data={"queue": "forms", "jid": soon, "csrf": admin.token}, headers=admin.same
        )
        assert again.headers["location"] == "/admin?done=run-now-gone"
        deleted = await admin.http.post(
            "/admin/cancel",
            data={"queue": "forms", "jid": gone, "csrf": admin.token, "next": "admin"},
            headers=admin.same,
        )
        assert deleted.headers["location"] == "/admin?done=cancelled"
        info = await client.job(gone)
        assert info is not None
        assert info.status.value == "cancelled"
        assert await client.queue("forms").scheduled() == []
        refused = await admin.http.post(
            "/admin/run-now", data={"queue": "forms", "jid": soon}, headers=admin.same
        )
        assert refused.status_code == 403
