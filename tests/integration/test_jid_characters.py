"""Every printable ASCII character in a jid: refused at every entrance, or working everywhere.

The campaign's scenario (rerun it with these tests): ``Client.enqueue`` accepted
``Task(jid='cx"quote')`` and ``'cx\\\\q'``. The scripts that find a task by its jid
inside the envelope (``'{"jid":"' .. jid``, ``[^"]*``) then missed it, because the
envelope holds the JSON escape (``cx\\"quote``): a concurrency key with
``max_concurrency=2`` ran 6 at once, a priority-5 task ran after 24 default ones,
``cancel()`` of the running task returned False, ``run_now()`` returned False, and
``purge()`` left the record "pending" with no expiry.

The rule (``fencekit._redis.keys.jid_error``): a jid is 1 to 200 printable
characters with no whitespace and neither ``"`` nor ``\\`` -- the two printable
characters JSON escapes (orjson writes every other printable character as is).
It is applied once, where every task is encoded (``Task.envelope``), so
``Client``, ``SyncClient``, task functions, ``enqueue_unique`` and the CLI refuse
such a jid alike, with a ``PayloadError`` naming the character. The lookups
(``job``, ``result``, ``cancel``, ``run_now``) refuse it too: no task can have it.
Every other printable ASCII character goes through run-now, cancel (pending and
running), priority, a concurrency key and purge below.
"""

from __future__ import annotations

import asyncio
import string
import subprocess
import sys
import time
from typing import Any

import pytest
from tests.queue_helpers import eventually, new_server, running, worker

from fencekit import Client, SyncClient, Task
from fencekit.errors import ConfigError, JobNotFound, PayloadError

REFUSED = ' "\\'
ALLOWED = [c for c in string.printable if c.isprintable() and c not in REFUSED]


def jid_with(c: str, tag: str = "") -> str:
    return f"j{tag}{c}{ord(c)}"


def test_the_allowed_set_is_every_printable_ascii_character_but_three() -> None:
    assert len(ALLOWED) == 95 - 3  # 0x20..0x7e, less space, quote and backslash


@pytest.mark.parametrize("c", ['"', "\\"])
async def test_a_jid_with_a_quote_or_a_backslash_is_refused_at_every_entrance(redis_url: str, c: str) -> None:
    jid = f"cx{c}q"
    async with Client(redis_url=redis_url) as client:
        for call in (
            lambda: client.enqueue(Task("q", "op", {}, jid=jid)),
            lambda: client.enqueue_many([Task("q", "op", {}, jid=jid)]),
            lambda: client.enqueue_unique(Task("q", "op", {}, unique_key=f"u{c}")),
            lambda: client.enqueue(Task("q", "op", {}, jid=jid), delay=5),
        ):
            with pytest.raises(PayloadError) as caught:
                await call()
            assert repr(c) in str(caught.value), caught.value
        for lookup in (
            lambda: client.job(jid, queue="q"),
            lambda: client.result(jid, queue="q", timeout=0.1),
            lambda: client.cancel(jid, queue="q"),
            lambda: client.queue("q").run_now(jid),
        ):
            with pytest.raises(ConfigError) as refused:
                await lookup()
            assert repr(c) in str(refused.value), refused.value
        assert await client.queue("q").length() == 0  # nothing half-enqueued
    with SyncClient(redis_url=redis_url) as sync, pytest.raises(PayloadError, match="must not contain"):
        sync.enqueue(Task("q", "op", {}, jid=jid))
    cli = subprocess.run(
        [sys.executable, "-m", "fencekit", "enqueue", "q", "op", "--jid", jid, "--redis-url", redis_url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode != 0, cli.stderr
    assert "must not contain" in cli.stderr, cli.stderr
    assert "Traceback" not in cli.stderr


async def test_every_other_character_runs_now_is_cancelled_and_purged(redis_url: str) -> None:
    async with Client(redis_url=redis_url) as client:
        queue = client.queue("jid_ops")
        failures: list[str] = []
        for c in ALLOWED:
            later, pending = jid_with(c, "L"), jid_with(c, "P")
            assert await client.enqueue(Task("jid_ops", "op", {}, jid=later), delay=3600) == later
            if not await queue.run_now(later):
                failures.append(f"run_now {later!r}")
            info = await client.job(later, queue="jid_ops")
            if info is None or info.status != "pending":
                failures.append(f"job {later!r} after run_now: {info}")
            if not await client.cancel(later, queue="jid_ops"):
                failures.append(f"cancel {later!r}")
            await client.enqueue(Task("jid_ops", "op", {}, jid=pending, keep_result=3600))
        assert failures == []
        assert await queue.length() == len(ALLOWED)  # the cancelled ones left, the others wait
        assert await queue.purge() == len(ALLOWED)
        for c in ALLOWED:
            with pytest.raises(JobNotFound):  # the record went with the task, not left "pending"
                await client.result(jid_with(c, "P"), queue="jid_ops", timeout=0.1)


async def test_every_other_character_keeps_its_priority_and_its_concurrency_key(redis_url: str) -> None:
    order: list[str] = []
    spans: list[tuple[float, float]] = []

    async def ordered(payload: dict[str, Any]) -> None:
        order.append(payload["jid"])

    async def keyed(payload: dict[str, Any]) -> None:
        start = time.monotonic()
        await asyncio.sleep(0.01)
        spans.append((start, time.monotonic()))

    async with Client(redis_url=redis_url) as client:
        await client.enqueue_many([Task("jid_prio", "run", {"jid": f"d{i}"}) for i in range(5)])
        await client.enqueue_many(
            [Task("jid_prio", "run", {"jid": jid_with(c)}, jid=jid_with(c), priority=5) for c in ALLOWED]
        )
        await client.enqueue_many(
            [Task("jid_ckey", "run", {}, jid=jid_with(c), concurrency_key="tenant") for c in ALLOWED]
        )
        server = new_server(redis_url, worker("jid_prio", "run", ordered), concurrency=1)
        async with running(server):
            await eventually(lambda: len(order) == len(ALLOWED) + 5, timeout=30, what="all ran")
        server = new_server(redis_url, worker("jid_ckey", "run", keyed, max_concurrency=2), concurrency=16)
        async with running(server):
            await eventually(lambda: len(spans) == len(ALLOWED), timeout=30, what="all keyed ran")
    assert order[: len(ALLOWED)] == [jid_with(c) for c in ALLOWED]  # priority 5 first, each of them
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    assert peak == 2  # the key's cap held for every jid


async def test_every_other_character_cancels_its_running_task(redis_url: str) -> None:
    started: set[str] = set()
    cancelled: set[str] = set()

    async def sleeper(payload: dict[str, Any]) -> None:
        started.add(payload["jid"])
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.add(payload["jid"])
            raise

    jids = [jid_with(c) for c in ALLOWED]
    async with Client(redis_url=redis_url) as client:
        await client.enqueue_many([Task("jid_cancel", "run", {"jid": j}, jid=j) for j in jids])
        server = new_server(redis_url, worker("jid_cancel", "run", sleeper), concurrency=len(jids))
        async with running(server):
            await eventually(lambda: len(started) == len(jids), timeout=30, what="all running")
            refused = [j for j in jids if not await client.cancel(j, queue="jid_cancel")]
            assert refused == []
            await eventually(lambda: cancelled == set(jids), timeout=30, what="every coroutine cancelled")
            infos = [await client.job(j, queue="jid_cancel") for j in jids]
    assert {i.status for i in infos if i is not None} == {"cancelled"}, infos


@pytest.mark.parametrize("operation", ['say"hi', "say\\hi"])
def test_a_worker_whose_operation_holds_a_quote_or_a_backslash_is_refused(operation: str) -> None:
    from fencekit.jobs.worker import inspect_worker

    with pytest.raises(ConfigError, match="attribute 'operation' must not contain"):
        inspect_worker(worker("q", operation, lambda payload: None))


def test_a_periodic_worker_whose_runs_could_not_have_a_jid_is_refused_at_registration() -> None:
    from fencekit import App

    app = App()
    with pytest.raises(ConfigError, match="cannot name periodic runs: a run's jid must not contain ' '"):

        @app.task(queue="q", name="say hi", every=1)
        async def say_hi() -> None: ...
