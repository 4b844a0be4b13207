"""Browsing a queue's tasks on the admin page (the first hour, item 8): lists, pages, filters.

Before, a task was found only by its jid. ``/admin/queue?queue=Q&list=L`` shows
the pending, scheduled, running, finished, failed and dead tasks of a queue a
page at a time, filtered by operation, jid prefix or text, each read bounded
(``fencekit.web.browse``). A real Server fills a real Redis; the page is read
over HTTP from the app under uvicorn. The 100,000-task test prints how long
each page took (no threshold: it checks the reads stay bounded).
"""

from __future__ import annotations

import asyncio
import html
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis
from tests.queue_helpers import eventually, new_server, running, stats, worker

from fencekit import Client, Task
from fencekit._redis.keys import KeySpace
from fencekit.testing import RedisServer
from fencekit.web import WebServer, create_app
from fencekit.web.browse import PAGE, SCAN_LIMIT, Filter, read_page
from fencekit.web.source import AdminSource

HOSTILE = "<script>alert(1)</script>"
CONSUMERS = "fencekit:{registry}:consumers"


def rows(page: str) -> list[str]:
    """The jids of a page's rows, in order."""
    return re.findall(r'<a href="/admin/job\?jid=([^"]+)">', page)


@pytest.fixture
async def browse(redis_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, Any]]]:
    """A Redis with every list filled, and an HTTP client of its admin app."""
    seen: dict[str, Any] = {}
    hold = asyncio.Event()

    async def fail(payload: dict[str, Any]) -> None:
        raise RuntimeError(f"boom {payload['i']}")

    async def ok(payload: dict[str, Any]) -> int:
        return int(payload["i"]) * 2

    async def held(payload: dict[str, Any]) -> None:
        await hold.wait()

    server = new_server(
        redis_url,
        worker("brw", "fail", fail, retry=False),
        worker("brw", "ok", ok),
        worker("brw", "hold", held),
    )
    async with Client(redis_url, keep_result=60) as client, running(server):
        seen["a"] = [await client.enqueue(Task("brp", "a", {"i": i})) for i in range(120)]
        seen["b"] = [await client.enqueue(Task("brp", "b", {"i": i})) for i in range(3)]
        seen["hostile"] = await client.enqueue(Task("brp", HOSTILE, {"note": HOSTILE}))
        seen["urgent"] = [await client.enqueue(Task("brp", "a", {"u": i}, priority=3)) for i in range(5)]
        seen["later"] = [
            await client.enqueue(Task("brp", "a", {"s": i}), delay=600 - 60 * i) for i in range(4)
        ]
        seen["failed"] = [await client.enqueue(Task("brw", "fail", {"i": i})) for i in range(3)]
        seen["done"] = [await client.enqueue(Task("brw", "ok", {"i": i})) for i in range(2)]
        seen["dead"] = await client.enqueue(Task("brw", "nobody", {"i": 0}))
        seen["held"] = await client.enqueue(Task("brw", "hold", {"i": 0}))
        with redis.Redis.from_url(redis_url) as r:
            await eventually(
                lambda: _settled(r), timeout=20, what="the failures, results, dead letter and held task"
            )
        source = AdminSource.from_url(redis_url)
        web = WebServer(create_app(source), port=0)
        await web.start()
        try:
            async with httpx.AsyncClient(base_url=web.url) as http:
                yield http, seen
        finally:
            hold.set()
            await web.stop()
            await source.aclose()


def _settled(r: redis.Redis) -> bool:
    s = stats(r, "brw")
    held = any(r.hlen(f"fencekit:{{brw}}:inflight:{cid.decode()}") for cid in r.hkeys(CONSUMERS))
    return (s.get("failed"), s.get("processed"), s.get("dead"), held) == (4, 2, 1, True)  # dead: failed too


async def test_pending_pages_run_in_claim_order_newest_first(
    browse: tuple[httpx.AsyncClient, dict[str, Any]],
) -> None:
    http, seen = browse
    first = (await http.get("/admin/queue", params={"queue": "brp", "list": "pending"})).text
    assert "129 pending task(s)" in first
    jids = rows(first)
    assert len(jids) == PAGE
    assert jids[:5] == list(reversed(seen["urgent"]))  # priority 3 first, newest first
    assert jids[5] == seen["hostile"]
    assert jids[6:9] == list(reversed(seen["b"]))
    assert 'rel=next href="/admin/queue?queue=brp&amp;list=pending&amp;page=1"' in first
    assert "rel=prev" not in first
    last = (await http.get("/admin/queue", params={"queue": "brp", "list": "pending", "page": 2})).text
    assert rows(last) == list(reversed(seen["a"][:29]))  # the oldest of the 129, claimed next
    assert "rel=next" not in last
    assert "rel=prev" in last
    assert html.escape(HOSTILE, quote=False) in first  # the operation and params, as text
    assert HOSTILE not in first


async def test_filters_keep_an_operation_a_jid_prefix_or_text(
    browse: tuple[httpx.AsyncClient, dict[str, Any]],
) -> None:
    http, seen = browse

    async def found(**params: Any) -> list[str]:
        page = await http.get("/admin/queue", params={"queue": "brp", "list": "pending", **params})
        assert page.status_code == 200
        return rows(page.text)

    assert await found(operation="b") == list(reversed(seen["b"]))
    assert await found(jid=seen["a"][7]) == [seen["a"][7]]
    assert await found(text='"i":117') == [seen["a"][117]]
    assert await found(operation="b", text='"i":1}') == [seen["b"][1]]
    assert await found(operation="nothing-like-it") == []
    paged = await found(operation="a", page=1)
    assert paged == list(reversed(seen["a"]))[45:95]  # 5 urgent "a" tasks come first


async def test_every_list_shows_its_tasks(browse: tuple[httpx.AsyncClient, dict[str, Any]]) -> None:
    http, seen = browse

    async def page(queue: str, which: str, **params: Any) -> str:
        answer = await http.get("/admin/queue", params={"queue": queue, "list": which, **params})
        assert answer.status_code == 200, answer.text
        return answer.text

    scheduled = await page("brp", "scheduled")
    assert rows(scheduled) == list(reversed(seen["later"]))  # soonest due first
    busy = await page("brw", "running")
    assert rows(busy) == [seen["held"]]
    assert "<th>consumer</th>" in busy
    done = await page("brw", "finished")
    assert sorted(rows(done)) == sorted([*seen["done"], seen["dead"]])  # every task ended with a record
    assert "<td>dead</td>" in done
    failed = await page("brw", "failed")
    assert rows(failed) == list(reversed(seen["failed"]))  # newest first
    assert "RuntimeError: boom 2" in failed
    assert rows(await page("brw", "failed", text="boom 1")) == [seen["failed"][1]]
    dead = await page("brw", "dead")
    assert rows(dead) == [seen["dead"]]
    assert "nobody" in dead  # the reason names the operation without a worker


async def test_bad_browse_requests_get_a_clear_answer(
    browse: tuple[httpx.AsyncClient, dict[str, Any]],
) -> None:
    http, _ = browse
    for params, status, says in (
        ({"queue": "brp", "list": "zombies"}, 400, "list must be one of pending, scheduled, running"),
        ({"queue": "brp", "list": "pending", "page": "x"}, 400, "page must be a whole number"),
        ({"queue": "brp", "list": "pending", "page": "-1"}, 400, "page must be a whole number"),
        ({"queue": "brp", "list": "pending", "page": "100001"}, 400, "page must be from 0 to 100000"),
        ({"queue": "no-such-queue", "list": "pending"}, 404, "no such queue"),
        ({"queue": "bad queue{", "list": "pending"}, 404, "no such queue"),
    ):
        answer = await http.get("/admin/queue", params=params)
        assert answer.status_code == status, (params, answer.text)
        assert says in answer.text, (params, answer.text)


async def test_a_dashboard_row_links_its_queue_s_tasks(
    browse: tuple[httpx.AsyncClient, dict[str, Any]],
) -> None:
    http, _ = browse
    dashboard = (await http.get("/admin")).text
    assert '<a class=button href="/admin/queue?queue=brp">Tasks</a>' in dashboard


async def test_a_hundred_thousand_pending_tasks_are_browsed_in_bounded_reads(
    private_redis: RedisServer,
) -> None:
    url = private_redis.url()
    async with Client(url) as client:
        for start in range(0, 100_000, 10_000):
            await client.enqueue_many(
                Task("huge", "op" if i % 1000 else "rare", {"i": i}) for i in range(start, start + 10_000)
            )
        keys = KeySpace()
        timings: dict[str, float] = {}

        async def timed(label: str, number: int = 0, where: Filter | None = None) -> Any:
            began = time.perf_counter()
            page = await read_page(client.redis, keys, "huge", "pending", number, where)
            timings[label] = time.perf_counter() - began
            return page

        first = await timed("page 1")
        assert (first.total, len(first.rows), first.more, first.scanned) == (100_000, PAGE, True, PAGE)
        assert first.rows[0].detail == '{"i":99999}'
        last = await timed("page 2000 (the last)", 1999)
        assert (len(last.rows), last.more, last.rows[-1].detail) == (PAGE, False, '{"i":0}')
        rare = await timed("filter: operation (matches 1 in 1000)", 0, Filter(operation="rare"))
        assert [r.detail for r in rare.rows] == [f'{{"i":{i}}}' for i in range(99_000, 89_999, -1000)]
        assert (rare.scanned, rare.cut) == (SCAN_LIMIT, True)  # stopped at the bound, and says so
        none = await timed("filter: text matching nothing", 0, Filter(text="no such text"))
        assert (none.rows, none.scanned, none.cut) == ((), SCAN_LIMIT, True)
    print("\n[browse 100,000 pending] " + ", ".join(f"{k}: {v * 1000:.1f} ms" for k, v in timings.items()))


def _token(page: str) -> str:
    match = re.search(r'name=csrf value="([^"]+)"', page)
    assert match, page
    return match.group(1)


async def test_bulk_actions_act_on_the_filtered_set_behind_the_form_checks(
    browse: tuple[httpx.AsyncClient, dict[str, Any]], redis_url: str
) -> None:
    http, seen = browse
    page = (await http.get("/admin/queue", params={"queue": "brp", "list": "pending", "operation": "b"})).text
    assert 'action="/admin/bulk"' in page
    same = {"Origin": str(http.base_url).rstrip("/")}
    form = {"csrf": _token(page), "queue": "brp", "list": "pending", "operation": "b", "action": "cancel"}

    # the checks every admin form has: same origin, its token, a known queue; and the confirmation
    for data, headers, status, says in (
        (form | {"confirm": "yes"}, {"Origin": "http://evil.example"}, 403, "cross-origin"),
        (form | {"confirm": "yes", "csrf": "stale"}, same, 403, "missing or stale form token"),
        (form | {"confirm": "yes", "queue": "no-such-queue"}, same, 404, "no such queue"),
        (form, same, 400, "tick the confirmation box"),
        (
            form | {"confirm": "yes", "action": "retry"},
            same,
            400,
            "no bulk action 'retry' on the 'pending' list",
        ),
        (
            form | {"confirm": "yes", "list": "finished"},
            same,
            400,
            "no bulk action 'cancel' on the 'finished'",
        ),
    ):
        refused = await http.post("/admin/bulk", data=data, headers=headers)
        assert refused.status_code == status, (data, refused.text)
        assert says in html.unescape(refused.text), refused.text
    async with Client(redis_url) as client:
        assert await client.queue("brp").length() == 129  # nothing changed

        done = await http.post("/admin/bulk", data=form | {"confirm": "yes"}, headers=same)
        assert done.status_code == 303
        after = (await http.get(done.headers["location"])).text
        assert "3 of 3 selected task(s) cancelled." in after
        assert rows(after) == []  # the filter kept: nothing of operation b waits any more
        assert await client.queue("brp").length() == 126
        for jid in seen["b"]:
            info = await client.job(jid)
            assert info is None or info.status.value == "cancelled"

        later = {"csrf": form["csrf"], "queue": "brp", "list": "scheduled", "confirm": "yes"}
        ran = await http.post(
            "/admin/bulk", data=later | {"action": "run-now", "text": '"s":3'}, headers=same
        )
        assert "1 of 1 selected task(s) started now." in (await http.get(ran.headers["location"])).text
        assert len(await client.queue("brp").scheduled()) == 3

        failed = {"csrf": form["csrf"], "queue": "brw", "list": "failed", "confirm": "yes", "action": "retry"}
        again = await http.post("/admin/bulk", data=failed, headers=same)
        assert "3 of 3 selected task(s) enqueued again." in (await http.get(again.headers["location"])).text
        dead = {"csrf": form["csrf"], "queue": "brw", "list": "dead", "confirm": "yes", "action": "retry"}
        revived = await http.post("/admin/bulk", data=dead, headers=same)
        assert "1 of 1 selected task(s) enqueued again." in (await http.get(revived.headers["location"])).text
        assert await client.queue("brw").dead_count() == 0


async def test_bulk_delete_forgets_kept_records_and_dead_letters(
    browse: tuple[httpx.AsyncClient, dict[str, Any]], redis_url: str
) -> None:
    http, seen = browse
    page = (await http.get("/admin/queue", params={"queue": "brw", "list": "failed"})).text
    same = {"Origin": str(http.base_url).rstrip("/")}
    form = {"csrf": _token(page), "queue": "brw", "confirm": "yes", "action": "delete"}
    async with Client(redis_url) as client:
        gone = await http.post("/admin/bulk", data=form | {"list": "failed", "text": "boom 1"}, headers=same)
        assert "1 of 1 selected task(s) deleted." in (await http.get(gone.headers["location"])).text
        assert await client.job(seen["failed"][1]) is None
        assert [f.jid for f in await client.queue("brw").failed()] == [seen["failed"][2], seen["failed"][0]]
        assert await client.queue("brw").failed_count() == 2  # out of the index too

        dead = await http.post("/admin/bulk", data=form | {"list": "dead"}, headers=same)
        assert "1 of 1 selected task(s) deleted." in (await http.get(dead.headers["location"])).text
        assert await client.queue("brw").dead_count() == 0
        assert await client.queue("brw").dead_letters() == []

        done = await http.post(
            "/admin/bulk", data=form | {"list": "finished", "operation": "ok"}, headers=same
        )
        assert "2 of 2 selected task(s) deleted." in (await http.get(done.headers["location"])).text
        for jid in seen["done"]:
            assert await client.job(jid) is None
        left = (await http.get("/admin/queue", params={"queue": "brw", "list": "finished"})).text
        assert rows(left) == [seen["dead"]]  # the dead letter's record is not a dead letter
