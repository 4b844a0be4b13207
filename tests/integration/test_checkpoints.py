"""Fenced checkpoints on a real Redis and a real ``Server``: the next delivery of a task reads
the state its latest checkpoint stored; a stale delivery's checkpoint is refused in Redis
(``FencedOutError``, counted ``fenced_out``) and never overwrites a newer one; the state goes
with the record when the task succeeds, and is dropped when it ends otherwise."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.queue_helpers import eventually, new_server, running, stats, worker

from fencekit import Client, FencedOutError, PayloadError, Task, current_job
from fencekit._redis.keys import KeySpace

KEYS = KeySpace()


def state_key(queue: str, jid: str) -> str:
    return KEYS.queue(queue).state(jid)


async def test_a_retried_task_resumes_from_its_last_checkpoint(redis_url: str, r: Any) -> None:
    done_items: list[int] = []
    seen_states: list[Any] = []

    async def analyse(payload: dict[str, Any]) -> int:
        job = current_job()
        seen_states.append(job.state)
        start = job.state["next"] if job.state else 0
        for item in range(start, 10):
            done_items.append(item)
            if item == 6 and job.attempt == 0:
                raise RuntimeError("the engine crashed")  # after the checkpoint of item 5
            if item % 3 == 2:
                await job.checkpoint({"next": item + 1})
        return len(done_items)

    server = new_server(redis_url, worker("ckpt", "analyse", analyse, retry_count=1))
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("ckpt", "analyse", {}))
        assert await client.result(jid, timeout=20) == 11
        assert 0 < r.pttl(state_key("ckpt", jid)) <= 3_600_000  # kept with the record
    assert seen_states == [None, {"next": 6}]
    assert done_items == [0, 1, 2, 3, 4, 5, 6, 6, 7, 8, 9]  # item 6 twice: in hand at the crash


async def test_a_stale_delivery_s_checkpoint_is_refused_and_the_newer_state_stands(
    redis_url: str, r: Any
) -> None:
    first_may_go = asyncio.Event()
    second_checkpointed = asyncio.Event()
    outcomes: list[str] = []

    async def hold(payload: dict[str, Any]) -> str:
        job = current_job()
        if job.attempt == 0 and not outcomes:
            outcomes.append("first started")
            await job.checkpoint({"by": "first", "n": 1})
            await first_may_go.wait()  # reaped meanwhile: a newer delivery runs
            try:
                await job.checkpoint({"by": "first", "n": 2})
            except FencedOutError:
                outcomes.append("first refused")
                raise
            outcomes.append("first wrote")
            return "first"
        outcomes.append(f"second resumed from {job.state}")
        await job.checkpoint({"by": "second", "n": 3})
        second_checkpointed.set()
        await first_may_go.wait()
        return "second"

    server = new_server(redis_url, worker("stale", "hold", hold), concurrency=2)
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("stale", "hold", {}))
        await eventually(lambda: outcomes == ["first started"], what="the first delivery checkpointed")
        assert server.services is not None
        await server.services.reaper.reap(server.consumer_id, forget_if_silent=False, queues=["stale"])
        await asyncio.wait_for(second_checkpointed.wait(), 20)
        first_may_go.set()
        assert await client.result(jid, timeout=20) == "second"
        await eventually(lambda: "first refused" in outcomes, what="the stale checkpoint refused")
    assert outcomes[:2] == ["first started", "second resumed from {'by': 'first', 'n': 1}"]
    assert "first wrote" not in outcomes
    assert int(stats(r, "stale").get("fenced_out", 0)) >= 1


async def test_a_task_that_fails_for_good_or_is_cancelled_loses_its_state(redis_url: str, r: Any) -> None:
    gate = asyncio.Event()

    async def doomed(payload: dict[str, Any]) -> None:
        await current_job().checkpoint({"at": payload["n"]})
        if payload["n"] == 1:
            raise RuntimeError("for good")
        await gate.wait()

    server = new_server(redis_url, worker("lost", "doomed", doomed, retry=False), concurrency=2)
    async with Client(redis_url=redis_url) as client, running(server):
        failing = await client.enqueue(Task("lost", "doomed", {"n": 1}))
        waiting = await client.enqueue(Task("lost", "doomed", {"n": 2}))
        await eventually(lambda: r.exists(state_key("lost", waiting)), what="the second one checkpointed")
        await eventually(lambda: r.hget(KEYS.queue("lost").job(failing), "state") == b"failed")
        assert not r.exists(state_key("lost", failing))
        assert await client.cancel(waiting)
        assert not r.exists(state_key("lost", waiting))
        gate.set()


async def test_a_state_that_is_not_plain_json_or_too_big_is_refused(redis_url: str) -> None:
    errors: list[str] = []

    async def bad(payload: dict[str, Any]) -> None:
        for state in ({"when": object()}, "x" * 2000):
            try:
                await current_job().checkpoint(state)
            except PayloadError as exc:
                errors.append(str(exc))

    server = new_server(redis_url, worker("big", "bad", bad), max_payload=1000)
    async with Client(redis_url=redis_url, max_payload=1000) as client, running(server):
        jid = await client.enqueue(Task("big", "bad", {}))
        await client.result(jid, timeout=20)
    assert len(errors) == 2
    assert "not JSON" in errors[0]
    assert "above max_payload=1000" in errors[1]


def test_a_sync_task_checkpoints_with_checkpoint_sync(redis_url: str, r: Any) -> None:
    import fencekit

    app = fencekit.App(redis_url=redis_url)
    seen: list[Any] = []

    @app.task(queue="synced", retry_count=1)
    def count(n: int) -> int:
        job = current_job()
        seen.append(job.state)
        if job.state is None:
            job.checkpoint_sync({"half": n // 2})
            raise RuntimeError("crash after the checkpoint")
        return int(job.state["half"]) * 2

    async def main() -> int:
        server = new_server(redis_url)
        server.add_workers(*app.workers)
        async with running(server):
            jid = await count.enqueue(21)
            result = await app.result(jid, timeout=20)
        await app.close()
        return int(result)

    assert asyncio.run(main()) == 20
    assert seen == [None, {"half": 10}]


@pytest.mark.parametrize("where", ["pending", "scheduled"])
async def test_the_mark_travels_with_the_task_wherever_it_waits(redis_url: str, r: Any, where: str) -> None:
    """A checkpointed task sent back (retry: scheduled; a stop: pending) keeps the mark that
    makes its next delivery read the state."""
    release = asyncio.Event()

    async def slow(payload: dict[str, Any]) -> None:
        await current_job().checkpoint({"k": 1})
        if where == "scheduled":
            raise RuntimeError("retry me later")
        await release.wait()

    server = new_server(redis_url, worker("mark", "slow", slow, retry_count=1), grace=0.1)
    async with Client(redis_url=redis_url) as client:
        jid = await client.enqueue(Task("mark", "slow", {}))
        async with running(server):
            await eventually(lambda: r.exists(state_key("mark", jid)), what="the checkpoint")
            if where == "scheduled":
                await eventually(lambda: r.zcard(KEYS.queue("mark").scheduled) == 1, what="the retry")
        queued = r.lrange(KEYS.queue("mark").pending, 0, -1) + r.zrange(KEYS.queue("mark").scheduled, 0, -1)
        assert len(queued) == 1
        assert queued[0].endswith(b',"ckpt":1}')
