"""Batches on a real Redis and a real ``Server``: each child counted once by the settle of its
current delivery, the callbacks run exactly once (recorded outside Redis, in the test's own
lists), children on several queues, an open batch armed when its block ends, nested batches,
cancel, the synchronous client, and a stale delivery's ack that counts nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.queue_helpers import eventually, new_server, running, worker

from fencekit import BatchInfo, Client, ConfigError, PayloadError, SyncClient, Task, current_job
from fencekit._redis import scripts
from fencekit._redis.clients import async_client
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import arun
from fencekit.jobs import codec
from fencekit.jobs.batches import BatchState

KEYS = KeySpace()


class Calls:
    """What the callbacks and children saw, kept in the test process (not in Redis)."""

    def __init__(self) -> None:
        self.children: list[tuple[str, str | None]] = []  # (jid, batch_id)
        self.callbacks: list[tuple[str, dict[str, Any], str | None]] = []  # (kind, params, batch_id)


def batch_workers(calls: Calls, *, fail: set[int] = frozenset(), delay: float = 0.0) -> list[type]:  # type: ignore[assignment]
    async def analyse(payload: dict[str, Any]) -> dict[str, Any]:
        job = current_job()
        calls.children.append((job.jid, job.batch_id))
        if delay:
            await asyncio.sleep(delay)
        if payload["n"] in fail:
            raise RuntimeError(f"game {payload['n']} is corrupt")
        return {"game": payload["n"], "blunders": payload["n"] % 3}

    def callback(kind: str) -> Any:
        async def perform(payload: dict[str, Any]) -> str:
            calls.callbacks.append((kind, payload, current_job().batch_id))
            return kind

        return perform

    return [
        worker("games", "analyse", analyse, retry=False),
        worker("games2", "analyse", analyse, retry=False),
        worker("reports", "complete", callback("complete")),
        worker("reports", "success", callback("success")),
        worker("reports", "failure", callback("failure")),
    ]


def games(n: int, queue: str = "games", start: int = 0) -> list[Task]:
    return [Task(queue, "analyse", {"n": i}) for i in range(start, start + n)]


async def test_a_batch_over_two_queues_runs_each_callback_once_with_the_batch_id(redis_url: str) -> None:
    calls = Calls()
    server = new_server(redis_url, *batch_workers(calls), concurrency=8)
    async with Client(redis_url=redis_url) as client, running(server):
        handle = await client.batch(
            games(30) + games(20, "games2", start=30),
            on_complete=Task("reports", "complete", {"user": "magnus"}),
            on_success=Task("reports", "success", {}),
            on_failure=Task("reports", "failure", {}),
        )
        info = await handle.wait(timeout=30)
        await eventually(lambda: len(calls.callbacks) == 2, what="both callbacks ran")
        await asyncio.sleep(0.3)  # a second run of a callback would show here
        results = await client.batch_results(handle.bid)
    assert isinstance(info, BatchInfo)
    assert (info.total, info.succeeded, info.failed, info.cancelled, info.pending, info.running) == (
        50,
        50,
        0,
        0,
        0,
        0,
    )
    assert info.state is BatchState.DONE
    assert info.finished_at is not None
    assert info.finished_at >= info.created_at
    assert sorted(kind for kind, _, _ in calls.callbacks) == ["complete", "success"]
    assert all(bid == handle.bid for _, _, bid in calls.callbacks)
    assert ("complete", {"user": "magnus"}, handle.bid) in calls.callbacks
    assert sorted(jid for jid, _ in calls.children) == sorted(handle.jids)
    assert {bid for _, bid in calls.children} == {handle.bid}
    assert list(results) == sorted(handle.jids)
    assert sorted(r["game"] for r in results.values()) == list(range(50))
    assert set(info.callbacks) == {"complete", "success", "failure"}


async def test_children_that_fail_for_good_run_on_failure_and_on_complete_not_on_success(
    redis_url: str,
) -> None:
    calls = Calls()
    server = new_server(redis_url, *batch_workers(calls, fail={3, 7, 11}), concurrency=4)
    async with Client(redis_url=redis_url) as client, running(server):
        handle = await client.batch(
            games(20),
            on_complete=Task("reports", "complete", {}),
            on_success=Task("reports", "success", {}),
            on_failure=Task("reports", "failure", {}),
        )
        info = await handle.wait(timeout=30)
        await eventually(lambda: len(calls.callbacks) == 2, what="complete and failure ran")
        await asyncio.sleep(0.3)
        results = await handle.results()
    assert (info.succeeded, info.failed, info.cancelled) == (17, 3, 0)
    assert sorted(kind for kind, _, _ in calls.callbacks) == ["complete", "failure"]
    assert len(results) == 17


async def test_an_open_batch_counts_children_added_in_its_block_and_arms_when_it_ends(
    redis_url: str,
) -> None:
    calls = Calls()
    server = new_server(redis_url, *batch_workers(calls), concurrency=4)
    async with Client(redis_url=redis_url) as client, running(server):
        async with client.batch(games(2), on_complete=Task("reports", "complete", {})) as batch:
            await eventually(lambda: len(calls.children) == 2, what="the first children ran")
            await asyncio.sleep(0.3)  # their notes are applied: still no callback, the batch is open
            assert calls.callbacks == []
            info = await batch.info()
            assert (info.state, info.succeeded, info.total) == (BatchState.OPEN, 2, 2)
            await batch.add(games(3, start=2))
            await batch.add(Task("games", "analyse", {"n": 9}))
        info = await batch.wait(timeout=30)
        with pytest.raises(ConfigError, match="armed"):
            await batch.add(games(1))
    assert (info.total, info.succeeded) == (6, 6)
    assert [kind for kind, _, _ in calls.callbacks] == ["complete"]
    assert len(batch.jids) == 6


async def test_an_empty_batch_completes_at_once_and_runs_its_callback(redis_url: str) -> None:
    calls = Calls()
    server = new_server(redis_url, *batch_workers(calls))
    async with Client(redis_url=redis_url) as client, running(server):
        handle = await client.batch(
            [], on_complete=Task("reports", "complete", {}), on_success=Task("reports", "success", {})
        )
        info = await handle.wait(timeout=10)
        await eventually(lambda: len(calls.callbacks) == 2, what="the callbacks of an empty batch")
    assert (info.total, info.state) == (0, BatchState.DONE)


async def test_a_nested_batch_counts_in_its_parent_once_its_own_callbacks_ran(redis_url: str) -> None:
    calls = Calls()
    server = new_server(redis_url, *batch_workers(calls, fail={21}), concurrency=4)
    async with Client(redis_url=redis_url) as client, running(server):
        async with client.batch(
            games(3), on_complete=Task("reports", "complete", {"level": "outer"})
        ) as outer:
            inner_ok = await outer.batch(
                games(4, start=10), on_success=Task("reports", "success", {"level": "inner"})
            )
            await outer.batch(games(2, start=20), on_failure=Task("reports", "failure", {"level": "inner"}))
        info = await outer.wait(timeout=30)
        inner_ok_info = await client.batch_info(inner_ok.bid)
        await eventually(lambda: len(calls.callbacks) == 3, what="three callbacks")
    assert (info.total, info.succeeded, info.failed) == (5, 4, 1)  # 3 games, 2 nested batches
    assert inner_ok_info is not None
    assert inner_ok_info.parent == outer.bid
    assert sorted((k, p["level"]) for k, p, _ in calls.callbacks) == [
        ("complete", "outer"),
        ("failure", "inner"),
        ("success", "inner"),
    ]
    # the outer callback ran after both inner ones were enqueued
    assert calls.callbacks[-1][0] == "complete"


async def test_cancel_stops_the_running_and_waiting_children_and_completes_the_batch(redis_url: str) -> None:
    calls = Calls()
    server = new_server(redis_url, *batch_workers(calls, delay=30.0), concurrency=2, grace=0.2)
    async with Client(redis_url=redis_url) as client, running(server):
        handle = await client.batch(
            games(10), on_complete=Task("reports", "complete", {}), on_success=Task("reports", "success", {})
        )
        await eventually(lambda: len(calls.children) == 2, what="two children running")
        running_now = await handle.info()
        assert (running_now.running, running_now.pending) == (2, 8)
        cancelled = await handle.cancel()
        info = await handle.wait(timeout=10)
        await eventually(lambda: len(calls.callbacks) == 1, what="on_complete")
    assert cancelled == 10
    assert (info.cancelled, info.succeeded, info.state) == (10, 0, BatchState.DONE)
    assert [kind for kind, _, _ in calls.callbacks] == ["complete"]


def test_the_sync_client_opens_waits_and_reads_a_batch(redis_url: str) -> None:
    calls = Calls()
    server = new_server(redis_url, *batch_workers(calls), concurrency=4)

    async def serve_until(done: asyncio.Event) -> None:
        async with running(server):
            await done.wait()

    loop = asyncio.new_event_loop()
    done = asyncio.Event()
    import threading

    thread = threading.Thread(target=loop.run_until_complete, args=(serve_until(done),))
    thread.start()
    try:
        with SyncClient(redis_url=redis_url) as client:
            handle = client.batch(games(5), on_complete=Task("reports", "complete", {}))
            info = handle.wait(timeout=30)
            results = client.batch_results(handle.bid)
            again = client.batch_info(handle.bid)
    finally:
        loop.call_soon_threadsafe(done.set)
        thread.join(30)
        loop.close()
    assert (info.total, info.succeeded, info.state) == (5, 5, BatchState.DONE)
    assert again is not None
    assert again.done
    assert len(results) == 5


async def test_fifty_concurrent_batches_each_complete_once(redis_url: str) -> None:
    calls = Calls()
    server = new_server(redis_url, *batch_workers(calls), concurrency=16)
    async with Client(redis_url=redis_url) as client, running(server):
        handles = await asyncio.gather(
            *(
                client.batch(games(4, start=100 * i), on_complete=Task("reports", "complete", {"i": i}))
                for i in range(50)
            )
        )
        infos = await asyncio.gather(*(h.wait(timeout=60) for h in handles))
        await eventually(lambda: len(calls.callbacks) == 50, what="50 callbacks")
        await asyncio.sleep(0.3)
    assert len(calls.callbacks) == 50
    assert sorted(p["i"] for _, p, _ in calls.callbacks) == list(range(50))
    assert all(i.succeeded == 4 for i in infos)
    assert len({h.bid for h in handles}) == 50


async def test_bad_children_and_callbacks_are_refused_before_anything_is_enqueued(redis_url: str) -> None:
    async with Client(redis_url=redis_url) as client:
        with pytest.raises(PayloadError, match="unique_key"):
            await client.batch([Task("games", "analyse", {}, unique_key="u1")])
        with pytest.raises(PayloadError, match="twice"):
            await client.batch(
                [Task("games", "analyse", {}, jid="same"), Task("games", "analyse", {}, jid="same")]
            )
        with pytest.raises(PayloadError, match="on_complete must be a Task"):
            await client.batch(games(1), on_complete="report")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="batch id"):
            await client.batch_info("has space")
        assert await client.batch_info("unknown") is None
        r = async_client(client.target)
        try:
            assert await r.llen(KEYS.queue("games").pending) == 0
        finally:
            await r.aclose()


async def test_a_stale_delivery_s_ack_counts_nothing_and_the_current_one_counts_once(redis_url: str) -> None:
    """Child redelivered after a pause: delivery 1 is returned by the reaper, delivery 2 acks
    (its note is written), then delivery 1's late ack arrives: refused, no second note."""
    r = async_client(redis_url)
    try:
        qk = KEYS.queue("stale")
        raw = codec.encode("child1", "stale", "analyse", {}, 0, 1, keep=60_000, batch="b1")
        await r.lpush(qk.pending, raw)

        def claim(consumer: str, acks: list[scripts.RecordedAck]) -> scripts.Call:
            return scripts.ack_claim(
                pending=qk.pending,
                inflight=qk.inflight(consumer),
                token_counter=qk.token_counter,
                stats=qk.stats,
                wake=qk.wake,
                want=1,
                acks=[],
                recorded=acks,
                finished=qk.finished,
                channel=qk.done_channel,
                keep_finished=100,
            )

        _, first, *_ = await arun(r, claim("A", []))
        moved = await arun(
            r,
            scripts.requeue(
                inflight=qk.inflight("A"),
                pending=qk.pending,
                stats=qk.stats,
                wake=qk.wake,
                fence=KEYS.job_fence("stale", "child1"),
                record=qk.job("child1"),
                token=first,
                envelope=raw,
                counter="retried",
                fence_ttl_ms=60_000,
            ),
        )
        assert moved == 1
        _, second, *_ = await arun(r, claim("B", []))
        assert second > first

        def ack(token: int) -> scripts.RecordedAck:
            return scripts.RecordedAck(qk.job("child1"), token, "child1", b"1", 60_000, raw, "", "b1")

        fenced, *_ = await arun(r, claim("B", [ack(second)]))
        assert fenced == []
        fenced, *_ = await arun(r, claim("A", [ack(first)]))
        assert [int(t) for t in fenced] == [first]
        assert await r.lrange(qk.notes(), 0, -1) == [b"b1 child1 s"]
    finally:
        await r.aclose()


async def test_every_way_a_child_ends_counts_it_once(redis_url: str) -> None:
    """A retried child counts once when it finally succeeds; a dead letter (no worker) as failed;
    an expired child and a purged one as cancelled."""
    calls = Calls()
    flaky_runs: list[int] = []

    async def flaky(payload: dict[str, Any]) -> str:
        flaky_runs.append(current_job().attempt)
        if len(flaky_runs) == 1:
            raise RuntimeError("engine crashed")
        return "ok"

    server = new_server(
        redis_url,
        *batch_workers(calls),
        worker("flaky", "analyse", flaky, retry=True, retry_count=1),
        concurrency=4,
    )
    async with Client(redis_url=redis_url) as client:
        handle = await client.batch(
            [
                *games(2),
                Task("flaky", "analyse", {}),
                Task("games", "no_such_operation", {}),
                Task("games", "analyse", {"n": 99}, expires=0.001),
                Task("idle", "analyse", {}),
            ],
            on_complete=Task("reports", "complete", {}),
            on_failure=Task("reports", "failure", {}),
        )
        await asyncio.sleep(0.05)  # the expiring child's time passes before any worker sees it
        assert await client.queue("idle").purge() == 1
        async with running(server):
            info = await handle.wait(timeout=30)
            await eventually(lambda: len(calls.callbacks) == 2, what="complete and failure")
            await asyncio.sleep(0.3)
    assert (info.total, info.succeeded, info.failed, info.cancelled) == (6, 3, 1, 2)
    assert flaky_runs == [0, 1]
    assert sorted(kind for kind, _, _ in calls.callbacks) == ["complete", "failure"]
    assert len(calls.children) == 2  # the plain games; the expired one never ran


async def test_the_note_mover_applies_interleaved_notes_of_two_batches_and_empties_the_list(
    redis_url: str,
) -> None:
    """The mover reads the oldest notes, applies them per batch and removes exactly the lines it
    consumed (tail first), a malformed one included; a line that arrives meanwhile stays."""
    import logging

    from fencekit.services._batches import BatchLoops

    r = async_client(redis_url)
    try:
        async with Client(redis_url=redis_url) as client:
            one = await client.batch(games(40), on_complete=Task("reports", "complete", {}))
            two = await client.batch(games(30, start=40), on_complete=Task("reports", "complete", {}))
        notes = KEYS.queue("games").notes()
        lines = [f"{one.bid} {jid} s" for jid in one.jids]
        lines[10:10] = [f"{two.bid} {jid} f" for jid in two.jids]  # interleaved
        lines.insert(5, "not a note")
        await r.lpush(notes, *lines)  # the first line is the oldest, at the tail
        mover = BatchLoops(r, KEYS, ["games"], logging.getLogger("test.batches.mover"))
        assert await mover.move() == len(lines)
        assert (mover.applied, mover.malformed) == (70, 1)
        assert await r.llen(notes) == 0
        for handle, field in ((one, "succeeded"), (two, "failed")):
            info = await client_info(redis_url, handle.bid)
            assert getattr(info, field) == len(handle.jids)
        await r.lpush(notes, f"{one.bid} {one.jids[0]} s")  # again: counts nothing, is consumed
        assert await mover.move() == 1
        assert mover.applied == 70
        assert await r.llen(notes) == 0
    finally:
        await r.aclose()


async def client_info(redis_url: str, bid: str) -> BatchInfo:
    async with Client(redis_url=redis_url) as client:
        info = await client.batch_info(bid)
    assert info is not None
    return info
