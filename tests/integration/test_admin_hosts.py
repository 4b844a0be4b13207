"""The open admin page is not reachable by any web site: only configured ``Host`` names get it.

A page that rebinds its DNS name to 127.0.0.1 is same-origin with itself, so
before this check it could read the admin page's CSRF token (``Host:
evil.example``) and purge a queue with a forged POST. Now every host name but
the configured ones (loopback and ``web_host`` by default) gets 421 from
/admin and /metrics; the probes answer everyone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from tests.queue_helpers import messages, new_server, running

from fencekit import Client, Server, Task


class Idle:
    queue = "hosts"
    operation = "idle"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        return None


def _csrf(page: str) -> str:
    return page.split('name=csrf value="', 1)[1].split('"', 1)[0]


@pytest.fixture
async def open_server(redis_url: str) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    server = new_server(redis_url, Idle)
    async with running(server):
        assert server.web is not None
        async with httpx.AsyncClient(base_url=server.web.url, timeout=10) as http:
            yield server, http


async def test_a_rebinding_site_gets_neither_the_page_nor_the_purge(
    open_server: tuple[Server, httpx.AsyncClient], redis_url: str
) -> None:
    _, http = open_server
    async with Client(redis_url) as client:
        await client.enqueue(Task("other", "x"))  # a queue nobody polls: it stays pending
        evil = {"Host": "evil.example", "Origin": "http://evil.example"}
        page = await http.get("/admin", headers=evil)
        assert page.status_code == 421
        assert "csrf" not in page.text
        # Even with the real token (which the attacker cannot read), the forged POST is refused.
        token = _csrf((await http.get("/admin/purge?queue=other")).text)
        forged = await http.post(
            "/admin/purge", headers=evil, data={"queue": "other", "csrf": token, "confirm": "yes"}
        )
        assert forged.status_code == 421
        assert await client.queue("other").length() == 1
        assert (await http.get("/metrics", headers={"Host": "evil.example"})).status_code == 421


async def test_loopback_names_get_the_page_and_probes_answer_everyone(
    open_server: tuple[Server, httpx.AsyncClient],
) -> None:
    server, http = open_server
    assert server.web is not None
    port = server.web.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
        assert (await http.get("/admin", headers={"Host": host})).status_code == 200, host
    for path in ("/live", "/ready"):
        assert (await http.get(path, headers={"Host": "10.1.2.3:8080"})).status_code == 200, path


async def test_web_hosts_names_the_hosts_a_reverse_proxy_passes(redis_url: str) -> None:
    server = new_server(redis_url, Idle, web_hosts="jobs.example.com, admin.example.com")
    async with running(server):
        assert server.web is not None
        async with httpx.AsyncClient(base_url=server.web.url) as http:
            assert (await http.get("/admin", headers={"Host": "jobs.example.com"})).status_code == 200
            assert (await http.get("/admin", headers={"Host": "ADMIN.example.com:443"})).status_code == 200
            assert (await http.get("/admin")).status_code == 421  # the list replaces the default
    anyone = new_server(redis_url, Idle, web_hosts="*")
    async with running(anyone):
        assert anyone.web is not None
        async with httpx.AsyncClient(base_url=anyone.web.url) as http:
            assert (await http.get("/admin", headers={"Host": "whatever.example"})).status_code == 200


async def test_failed_logins_are_logged_without_the_password(redis_url: str) -> None:
    server = new_server(redis_url, Idle, admin_username="alice", admin_password="right-one")
    async with running(server):
        assert server.web is not None
        async with httpx.AsyncClient(base_url=server.web.url) as http:
            assert (await http.get("/admin")).status_code == 401  # the browser's first try: not a failure
            assert (await http.get("/admin", auth=("alice", "wrong-one"))).status_code == 401
            assert (await http.get("/admin", auth=("alice", "right-one"))).status_code == 200
    lines = [m for m in messages(server.logger) if "failed login" in m]
    assert len(lines) == 1, lines
    assert "127.0.0.1" in lines[0]
    assert "wrong-one" not in lines[0]
