"""The queue page's "Flow" section and the flow gauges of /metrics, on a real Redis and the real app.

A queue holds tasks parked for a rate limit's token (an operation's own bucket, and two keys of a
per-key rate limit, one of them hostile markup), tasks parked for a concurrency slot, and tasks of
two fair-share keys (one hostile too): the tasks are parked by the claim script itself, called as
a consumer calls it with its workers' flow spec. ``/admin/queue`` shows them per operation and
key with the seconds to each next token, the slot-parked count and the fair keys with their
backlog, every key escaped; ``/metrics`` has ``fencekit_queue_fair_keys`` and the parked counts
per operation (never per key). One check loads the page in headless Chromium.
"""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from tests.integration.test_admin_browser import DomText, run_chromium
from tests.queue_helpers import worker

from fencekit import Client, Task
from fencekit._redis import scripts
from fencekit._redis.clients import aclose_client, async_client
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import arun
from fencekit.jobs.flow import flow_specs
from fencekit.jobs.worker import inspect_worker
from fencekit.services.backlog import Backlog
from fencekit.web import WebServer, create_app
from fencekit.web._flow_view import KEYS_SHOWN, flow_view
from fencekit.web.source import AdminSource

QUEUE = "flowq"
HOSTILE = "<img/src=x/onerror=alert(1)>"  # a valid key: printable, no whitespace nor quotes
QK = KeySpace().queue(QUEUE)


async def _noop(payload: dict[str, Any]) -> None:
    return None


async def park(url: str) -> list[Any]:
    """One claim of queue ``flowq`` by consumer c1 with the flow spec of its three limited workers:
    per-key rate "partner", rate "plain", one slot per key "run"; the claimed envelopes."""
    specs = [
        inspect_worker(worker(QUEUE, "partner", _noop, rate_limit="1/s", rate_key=lambda p: p["k"])),
        inspect_worker(worker(QUEUE, "plain", _noop, rate_limit="1/s")),
        inspect_worker(worker(QUEUE, "run", _noop, max_concurrency=1)),
    ]
    flow = flow_specs(specs, {QUEUE: QK})[QUEUE]
    ar = async_client(url)
    try:
        reply = await arun(
            ar,
            scripts.ack_claim(
                pending=QK.pending, inflight=QK.inflight("c1"), token_counter=QK.token_counter,
                stats=QK.stats, wake=QK.wake, want=50, acks=[], flow=flow,
            ),
        )  # fmt: skip
    finally:
        await aclose_client(ar)
    return list(reply[4:])


@pytest.fixture
async def flow_admin(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A queue with parked tasks of every kind and two fair keys with work, and its admin app."""
    async with Client(redis_url) as client:
        await client.enqueue_many(
            [Task(QUEUE, "partner", {"k": k}, rate_key=k) for k in ["x"] * 3 + [HOSTILE] * 2]
        )
        await client.enqueue_many([Task(QUEUE, "plain", {"n": n}) for n in range(4)])
        await client.enqueue_many([Task(QUEUE, "run", {"n": n}, concurrency_key="t") for n in range(3)])
        claimed = await park(redis_url)
        # x, the hostile key and "plain" each had a token (a burst of 1), "run" its one slot
        assert len(claimed) == 4
        await client.enqueue_many([Task(QUEUE, "do", {"n": n}, fair_key="tenant-1") for n in range(3)])
        await client.enqueue_many([Task(QUEUE, "do", {"n": n}, fair_key=HOSTILE) for n in range(2)])
        await client.enqueue(Task("calm", "do", {}))  # a queue with nothing parked, no fair key
    source = AdminSource.from_url(redis_url)
    web = WebServer(create_app(source, protect_metrics=False), port=0)
    await web.start()
    try:
        async with httpx.AsyncClient(base_url=web.url) as http:
            yield http
    finally:
        await web.stop()
        await source.aclose()


def flow_of(page: str) -> str:
    """The Flow section of a queue page."""
    found = re.search(r"<section id=flow>.*?</section>", page, re.S)
    assert found, page
    return found.group(0)


def cells(section: str) -> list[list[str]]:
    """The rows of a section's tables as their cells' text (tags dropped, entities decoded)."""
    return [
        [
            html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        ]
        for row in re.findall(r"<tr>(.*?)</tr>", section, re.S)
        if "<td" in row
    ]


def seconds(text: str) -> float:
    number, unit = text.split()
    assert unit == "s", text
    return float(number)


async def test_the_queue_page_shows_parked_tasks_by_operation_and_key_and_the_fair_keys(
    flow_admin: httpx.AsyncClient,
) -> None:
    answer = await flow_admin.get("/admin/queue", params={"queue": QUEUE, "list": "pending"})
    assert answer.status_code == 200
    section = flow_of(answer.text)
    assert HOSTILE not in answer.text  # every key escaped
    assert html.escape(HOSTILE, quote=False) in section
    rows = cells(section)
    tokens = [r for r in rows if len(r) == 4]
    by_key = {(op, key): int(count) for op, key, count, _ in tokens}
    assert by_key == {("partner", "all 2 keys"): 3, ("partner", "x"): 2, ("partner", HOSTILE): 1,
                      ("plain", "-"): 3}  # fmt: skip
    for _, _, _, wait in tokens:
        assert 0 <= seconds(wait) <= 1.0  # "0.4 s": a token of "1/s" is at most a second away
    assert "Parked for a token <span class=muted>(6)</span>" in section
    assert "Parked for a concurrency slot: 2" in section  # "run": 3 for its one slot, one claimed
    assert "2 keys with work; the next in turn:" in section
    fair = sorted(tuple(r) for r in rows if len(r) == 2)
    assert fair == [(HOSTILE, "2"), ("tenant-1", "3")]
    # every list of the queue shows it; a queue with nothing parked and no fair key does not
    scheduled = await flow_admin.get("/admin/queue", params={"queue": QUEUE, "list": "scheduled"})
    assert [r[:3] for r in cells(flow_of(scheduled.text))] == [r[:3] for r in rows]  # the seconds go down
    calm = await flow_admin.get("/admin/queue", params={"queue": "calm", "list": "pending"})
    assert calm.status_code == 200
    assert "id=flow" not in calm.text


async def test_metrics_give_the_fair_keys_and_the_parked_tasks_per_operation(
    flow_admin: httpx.AsyncClient,
) -> None:
    text = (await flow_admin.get("/metrics")).text
    assert "# TYPE fencekit_queue_fair_keys gauge" in text
    values = {
        name: float(value)
        for name, value in (line.rsplit(" ", 1) for line in text.splitlines() if line and line[0] != "#")
    }
    assert values[f'fencekit_queue_fair_keys{{queue="{QUEUE}"}}'] == 2
    assert values['fencekit_queue_fair_keys{queue="calm"}'] == 0
    assert values[f'fencekit_queue_parked{{queue="{QUEUE}"}}'] == 8
    assert values[f'fencekit_queue_parked_for_token{{operation="partner",queue="{QUEUE}"}}'] == 3
    assert values[f'fencekit_queue_parked_for_token{{operation="plain",queue="{QUEUE}"}}'] == 3
    assert 0 <= values[f'fencekit_queue_next_token_seconds{{operation="partner",queue="{QUEUE}"}}'] <= 1
    per_operation = [
        name
        for name in values
        if name.startswith(("fencekit_queue_parked_for_token{", "fencekit_queue_next_token"))
    ]
    assert len(per_operation) == 4  # partner and plain, each with its keys together
    assert all(re.findall(r"(\w+)=", name) == ["operation", "queue"] for name in per_operation)
    assert not any("img" in name for name in values)  # no key label: the cardinality stays bounded


async def test_chromium_shows_the_flow_section_with_the_keys_as_text(
    flow_admin: httpx.AsyncClient, chromium: str
) -> None:
    url = f"{flow_admin.base_url}/admin/queue?queue={QUEUE}&list=pending"
    page = DomText()
    page.feed((await run_chromium(chromium, "--dump-dom", url)).decode())
    flow = page.text.split("Flow", 1)[1]
    assert "Parked for a token (6)" in flow, flow
    assert f"partner {HOSTILE} 1" in flow  # the hostile key, as text
    assert "Parked for a concurrency slot: 2" in flow
    assert "2 keys with work; the next in turn:" in flow
    assert "tenant-1 3" in flow
    assert "img" not in page.tags


def test_the_flow_view_counts_the_slot_parked_and_bounds_the_key_rows() -> None:
    keys = tuple(("op", f"k{i}", 1, 1_500) for i in range(KEYS_SHOWN + 5))
    read = Backlog(0, 0, None, now_ms=1_000, parked=KEYS_SHOWN + 9, parked_ops=(("op", KEYS_SHOWN + 5, 900),),
                   parked_keys=keys)  # fmt: skip
    view = flow_view(read)
    assert view is not None
    assert (view.for_token, view.for_slot, view.more_keys) == (KEYS_SHOWN + 5, 4, 5)
    assert (view.tokens[0].key, view.tokens[0].keys) == (None, KEYS_SHOWN + 5)
    assert len(view.tokens) == 1 + KEYS_SHOWN
    assert view.tokens[0].seconds == 0.0  # due already: never negative
    assert [t.seconds for t in view.tokens[1:]] == [0.5] * KEYS_SHOWN
    assert flow_view(Backlog(3, 0, None)) is None
    assert flow_view(Backlog(3, 0, None, fair_keys=1, fair=(("a", 3),))) is not None
