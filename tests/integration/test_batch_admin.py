"""Batches seen and operated (issue 32, item 4): ``fencekit batch BID``, the batch metrics of
``/metrics``, and the admin's batch page with its cancel form.

Real Redis, a real ``Server`` (its own web server), real subprocesses for the command line and
headless Chromium for one page; each number shown is checked against ``client.batch_info`` or
the batch loops' own counters, and every refused form is checked to have changed nothing.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest
from tests.integration.test_admin_browser import DomText, run_chromium
from tests.integration.test_cli import fk, ok_json, one_error_line
from tests.queue_helpers import eventually, new_server, running, worker

from fencekit import Client, Task
from fencekit._redis.keys import JID_RULE
from fencekit.jobs.batches import BatchState
from fencekit.web import AdminSource, WebServer, create_app
from fencekit.web._batch_view import SHOWN

UNKNOWN_BID = "0190f2a8-7c3e-7d4b-9a1e-5b6c7d8e9f00"


def batch_workers(gate: asyncio.Event | None = None, fail: frozenset[int] = frozenset()) -> list[type]:
    """``games/analyse`` (waits for ``gate`` if given; fails for the numbers in ``fail``) and the
    three callbacks on ``reports``."""

    async def analyse(payload: dict[str, Any]) -> int:
        if gate is not None:
            await gate.wait()
        if payload["n"] in fail:
            raise RuntimeError(f"game {payload['n']} is corrupt")
        return int(payload["n"])

    async def callback(payload: dict[str, Any]) -> None:
        return None

    return [
        worker("games", "analyse", analyse, retry=False),
        *(worker("reports", kind, callback) for kind in ("complete", "success", "failure")),
    ]


def games(n: int, start: int = 0) -> list[Task]:
    return [Task("games", "analyse", {"n": i}) for i in range(start, start + n)]


def callbacks() -> dict[str, Task]:
    return {f"on_{kind}": Task("reports", kind, {}) for kind in ("complete", "success", "failure")}


def metric(text: str, name: str) -> float | None:
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def csrf_of(page: str) -> str:
    match = re.search(r'name=csrf value="([^"]+)"', page)
    assert match, page
    return match.group(1)


# -- fencekit batch BID ---------------------------------------------------------------------


async def test_the_batch_command_shows_a_batch_as_batch_info_reads_it(redis_url: str) -> None:
    server = new_server(redis_url, *batch_workers(fail=frozenset({2})), concurrency=4)
    async with Client(redis_url) as client, running(server):
        handle = await client.batch(games(5), **callbacks())
        info = await handle.wait(timeout=30)
        child = handle.jids[0]
        await eventually(lambda: client.job(child), what="the child's record")
    assert (info.state, info.succeeded, info.failed) == (BatchState.DONE, 4, 1)
    assert info.finished_at is not None

    done = fk(redis_url, "batch", handle.bid)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for line in (
        f"bid        {handle.bid}",
        "state      done",
        "total      5",
        "final      5 of 5 (100%)",
        "pending    0",
        "running    0",
        "succeeded  4",
        "failed     1",
        "cancelled  0",
        "parent     -",
        f"on_complete {info.callbacks['complete']}",
        f"on_success {info.callbacks['success']}",
        f"on_failure {info.callbacks['failure']}",
    ):
        assert line in lines, (line, done.stdout)
    assert any(line.startswith("created    20") and line.endswith("Z") for line in lines), done.stdout

    data = ok_json(fk(redis_url, "batch", handle.bid, "--json"))
    assert data == {
        "found": True, "bid": handle.bid, "state": "done", "done": True, "total": 5, "pending": 0,
        "running": 0, "succeeded": 4, "failed": 1, "cancelled": 0, "parent": None,
        "created_at": info.created_at.timestamp(), "finished_at": info.finished_at.timestamp(),
        "callbacks": info.callbacks,
    }  # fmt: skip

    # a child names its batch, in the table and in the JSON of `fencekit job`
    assert f"batch      {handle.bid}" in fk(redis_url, "job", child).stdout.splitlines()
    assert ok_json(fk(redis_url, "job", child, "--json"))["batch"] == handle.bid
    assert ok_json(fk(redis_url, "job", info.callbacks["complete"], "--json"))["batch"] == handle.bid


def test_an_unknown_batch_is_exit_1_and_a_malformed_id_exit_2_as_for_a_job(redis_url: str) -> None:
    missing = fk(redis_url, "batch", UNKNOWN_BID)
    assert (missing.returncode, missing.stdout) == (1, "")
    assert f"fencekit batch: error: no batch {UNKNOWN_BID}" in one_error_line(missing)
    assert ok_json(fk(redis_url, "batch", UNKNOWN_BID, "--json"), code=1) == {
        "bid": UNKNOWN_BID,
        "found": False,
    }
    # the same one line and exit code as a malformed jid
    bad_job, bad_batch = fk(redis_url, "job", "bad jid"), fk(redis_url, "batch", "bad bid")
    assert bad_job.returncode == bad_batch.returncode == 2
    assert (
        one_error_line(bad_job)
        == f"fencekit job: error: jid must not contain ' ' ({JID_RULE}), got 'bad jid'"
    )
    assert one_error_line(bad_batch) == (
        f"fencekit batch: error: batch id must not contain ' ' ({JID_RULE}), got 'bad bid'"
    )
    assert "batch" in fk(None, "--help").stdout


# -- /metrics -------------------------------------------------------------------------------


async def test_metrics_count_open_batches_and_what_this_process_s_batch_loops_did(redis_url: str) -> None:
    gate = asyncio.Event()
    server = new_server(redis_url, *batch_workers(gate), concurrency=8)
    async with Client(redis_url) as client, running(server):
        assert server.services is not None
        assert server.web is not None
        loops = server.services.batches
        async with httpx.AsyncClient(base_url=server.web.url) as http:

            async def scrape() -> str:
                return (await http.get("/metrics")).text

            before = await scrape()
            assert metric(before, "fencekit_batches_open") == 0.0
            assert metric(before, "fencekit_batches_finished_total") == 0.0
            assert metric(before, "fencekit_batch_notes_applied_total") == 0.0
            assert metric(before, "fencekit_batch_notes_malformed_total") == 0.0

            handle = await client.batch(games(6), on_complete=Task("reports", "complete", {}))
            held = await client.batch(games(2, start=10))  # its children wait too
            during = await scrape()
            assert metric(during, "fencekit_batches_open") == 2.0
            assert metric(during, "fencekit_batches_finished_total") == 0.0

            gate.set()  # the children run only now: the note mover counts them and finishes both
            await handle.wait(timeout=30)
            await held.wait(timeout=30)
            await eventually(lambda: loops.finished == 2, what="both batches finished by the mover")
            after = await scrape()
    assert metric(after, "fencekit_batches_open") == 0.0
    assert metric(after, "fencekit_batches_finished_total") == 2.0 == loops.finished
    assert metric(after, "fencekit_batch_notes_applied_total") == 8.0 == loops.applied
    assert metric(after, "fencekit_batch_notes_malformed_total") == 0.0
    assert "# TYPE fencekit_batches_open gauge" in after
    assert re.search(r"^# TYPE fencekit_batches_finished(_total)? counter$", after, re.MULTILINE)


# -- the batch page -------------------------------------------------------------------------


async def test_the_batch_page_shows_a_running_batch_and_cancels_it_through_a_checked_form(
    redis_url: str,
) -> None:
    gate = asyncio.Event()
    server = new_server(redis_url, *batch_workers(gate), concurrency=2, grace=0.2)
    async with Client(redis_url) as client, running(server):
        assert server.web is not None
        handle = await client.batch(games(5), **callbacks())
        on_complete = (await handle.info()).callbacks["complete"]

        async def two_running() -> bool:
            return (await handle.info()).running == 2

        await eventually(two_running, what="two children running")
        async with httpx.AsyncClient(base_url=server.web.url) as http:
            page = await http.get(f"/admin/batch/{handle.bid}")
            assert page.status_code == 200
            text = page.text
            assert "state</th><td data-field=state>armed" in text
            assert "0 of 5 children final (0 %)" in text
            assert 'data-count="running"><div class=label>running</div><div class=value>2<' in text
            assert 'data-count="pending"><div class=label>pending</div><div class=value>3<' in text
            for jid in handle.jids:  # every child under "pending or running", linked to its page
                assert f'<li><a href="/admin/job?jid={jid}">{jid}</a></li>' in text
            assert f"{on_complete} <span class=muted>(not enqueued yet)</span>" in text
            assert "Cancel batch" in text

            # a child's page names its batch and links to it
            child_page = await http.get("/admin/job", params={"jid": handle.jids[0]})
            link = f'data-field=batch><a href="/admin/batch/{handle.bid}">{handle.bid}</a>'
            assert link in child_page.text

            # without the token, or from another origin, the form changes nothing
            token, same = csrf_of(text), {"Origin": server.web.url}
            refused = await http.post("/admin/cancel-batch", data={"bid": handle.bid}, headers=same)
            assert refused.status_code == 403
            foreign = await http.post(
                "/admin/cancel-batch",
                data={"bid": handle.bid, "csrf": token},
                headers={"Origin": "http://evil.example"},
            )
            assert foreign.status_code == 403
            still = await handle.info()
            assert (still.state, still.cancelled, still.running + still.pending) == (BatchState.ARMED, 0, 5)

            done = await http.post(
                "/admin/cancel-batch", data={"bid": handle.bid, "csrf": token}, headers=same
            )
            assert done.status_code == 303
            assert done.headers["location"] == f"/admin/batch/{handle.bid}?done=batch-cancelled&n=5"
            info = await handle.wait(timeout=10)
            assert (info.state, info.cancelled, info.succeeded) == (BatchState.DONE, 5, 0)
            after = (await http.get(done.headers["location"])).text
            assert "Batch cancelled: 5 child task(s) that were not final stopped" in after
            assert "state</th><td data-field=state>done" in after
            assert "5 of 5 children final (100 %)" in after
            cancelled = after.split('data-group="cancelled">')[1].split("</ul>")[0]
            assert sorted(re.findall(r"jid=([^\"]+)\"", cancelled)) == sorted(handle.jids)
            assert f'<a href="/admin/job?jid={on_complete}">{on_complete}</a>' in after  # enqueued
            assert f"{info.callbacks['success']} <span class=muted>(not run)</span>" in after
            assert "Cancel batch" not in after
            assert "nothing to cancel" in after

            again = await http.post(
                "/admin/cancel-batch", data={"bid": handle.bid, "csrf": token}, headers=same
            )
            assert again.headers["location"].endswith("done=batch-cancelled&n=0")
            assert "Nothing to cancel" in (await http.get(again.headers["location"])).text
            unknown = await http.post(
                "/admin/cancel-batch", data={"bid": UNKNOWN_BID, "csrf": token}, headers=same
            )
            assert unknown.status_code == 404
            blank = await http.post("/admin/cancel-batch", data={"csrf": token}, headers=same)
            assert (blank.status_code, "missing batch id" in blank.text) == (400, True)
        gate.set()


@pytest.mark.parametrize(
    ("path", "status", "words"),
    [
        (f"/admin/batch/{UNKNOWN_BID}", 404, "no such batch"),
        ("/admin/batch/two%20words", 400, "give a batch id"),
        ("/admin/batch/", 400, "give a batch id"),
    ],
)
async def test_a_batch_page_for_a_bad_or_unknown_id_says_so(
    redis_url: str, path: str, status: int, words: str
) -> None:
    source = AdminSource.from_url(redis_url)
    transport = httpx.ASGITransport(app=create_app(source))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        response = await http.get(path)
    await source.aclose()
    assert response.status_code == status
    assert words in response.text


async def test_a_big_batch_lists_its_first_children_per_state_and_links_nested_batches(
    redis_url: str,
) -> None:
    async with Client(redis_url) as client:  # no worker: every child stays pending
        big = await client.batch(games(SHOWN + 5))
        async with client.batch(games(2)) as outer:
            inner = await outer.batch(games(2, start=1000), on_complete=Task("reports", "complete", {}))
    source = AdminSource.from_url(redis_url)
    transport = httpx.ASGITransport(app=create_app(source))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            page = (await http.get(f"/admin/batch/{big.bid}")).text
            outer_page = (await http.get(f"/admin/batch/{outer.bid}")).text
            inner_page = (await http.get(f"/admin/batch/{inner.bid}")).text
            metrics = (await http.get("/metrics")).text
    finally:
        await source.aclose()
    group = page.split('data-group="pending or running">')[1].split("</ul>")[0]
    listed = re.findall(r"<li><a href=\"/admin/job\?jid=([^\"]+)\"", group)
    assert len(listed) == SHOWN
    assert listed == sorted(listed)
    assert set(listed) <= set(big.jids)
    assert '<li class=muted data-more="5">… and 5 more</li>' in group
    assert f"pending or running <span class=muted>({SHOWN + 5})</span>" in page
    assert page.count("<li class=empty>none</li>") == 3  # succeeded, failed, cancelled
    # the nested batch is a child of its parent, linked to its own page, which links back
    nested = f'<li><a href="/admin/batch/{inner.bid}">{inner.bid}</a> <span class=muted>(a nested batch)'
    assert nested in outer_page
    assert "0 of 3 children final (0 %)" in outer_page
    parent = f'data-field=parent><a href="/admin/batch/{outer.bid}">{outer.bid}</a>'
    assert parent in inner_page
    assert "0 of 2 children final (0 %)" in inner_page
    # a mounted app runs no batch loops: it reports the open batches, not their counters
    assert metric(metrics, "fencekit_batches_open") == 3.0
    assert "fencekit_batches_finished_total" not in metrics


async def test_chromium_renders_the_batch_page_with_its_cancel_form(redis_url: str, chromium: str) -> None:
    async with Client(redis_url) as client:
        handle = await client.batch(games(3), **callbacks())
    source = AdminSource.from_url(redis_url)
    web = WebServer(create_app(source), port=0)
    await web.start()
    try:
        dom = (await run_chromium(chromium, "--dump-dom", f"{web.url}/admin/batch/{handle.bid}")).decode()
    finally:
        await web.stop()
        await source.aclose()
    page = DomText()
    page.feed(dom)
    assert f"Batch {handle.bid}" in page.text, page.text
    assert "0 of 3 children final (0 %)" in page.text
    assert "state armed" in page.text
    assert "pending or running (3)" in page.text
    assert "on_complete every child final" in page.text
    assert page.tags.count("progress") == 1
    assert page.tags.count("form") == 1  # Cancel batch
    assert "Cancel batch" in page.text
    assert "script" not in page.tags
