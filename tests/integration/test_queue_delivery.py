"""Delivery on a real Redis: retries and their delays, wake-up, round-robin, batched
claims, clean shutdown, and the invariants I1 (one place), I2 (tokens grow) and
I6 (counters add up) — all checked by reading Redis directly."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from tests.queue_helpers import (
    BEATS,
    CONSUMERS,
    accounted,
    eventually,
    inflight,
    inflight_count,
    locate,
    new_server,
    pending,
    qkey,
    redis_time_ms,
    running,
    scheduled,
    stats,
    worker,
)
from tests.servers import client_lists

from fencekit import Client, Task, current_job
from fencekit.consume import _waker as waker

# -- retries -----------------------------------------------------------------------------------


async def test_a_failed_task_is_scheduled_after_1s_times_1_5_to_the_attempt(redis_url: str, r: Any) -> None:
    async def fail(payload: dict[str, Any]) -> None:
        raise RuntimeError("always")

    server = new_server(redis_url, worker("retries", "fail", fail, retry_count=10))
    attempts = [0, 1, 2, 4]
    async with Client(redis_url=redis_url) as client, running(server):
        first = math.floor(redis_time_ms(r))  # every retry is scheduled after this instant ...
        jids = {await client.enqueue(Task("retries", "fail", {}, attempt=a)): a for a in attempts}
        await eventually(lambda: r.zcard(qkey("retries", "scheduled")) == len(attempts), what="all scheduled")
        last = math.floor(redis_time_ms(r))  # ... and before this one, both on the Redis clock (ms)
    entries = scheduled(r, "retries")
    assert len(entries) == len(attempts)
    for env, due in entries:
        before = jids[env["jid"]]
        assert env["attempt"] == before + 1
        delay_ms = round(1000 * 1.5**before)
        # due = the Redis clock when the retry was scheduled + the delay, exactly
        assert first <= due - delay_ms <= last, (before, due, delay_ms, first, last)
    s = stats(r, "retries")
    assert s["retried"] == len(attempts)
    assert s["failed"] == 0
    assert s["processed"] == 0
    assert inflight_count(r, "retries") == 0
    assert r.llen(qkey("retries", "pending")) == 0


async def test_a_task_that_keeps_failing_runs_1_plus_retry_count_times_and_fails_once(
    redis_url: str, r: Any
) -> None:
    runs: list[int] = []

    async def fail(payload: dict[str, Any]) -> None:
        runs.append(current_job().attempt)
        raise RuntimeError("always")

    server = new_server(redis_url, worker("exhaust", "fail", fail, retry_count=1))
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("exhaust", "fail"))
        await eventually(lambda: stats(r, "exhaust")["failed"] == 1, timeout=8)
        # Failed and in no place in Redis (I1): nothing is left that could run again.
        await eventually(lambda: locate(r, "exhaust", jid) == [], what="the task nowhere")
    assert runs == [0, 1]
    s = stats(r, "exhaust")
    assert (s["failed"], s["retried"], s["processed"], s["dead"]) == (1, 1, 0, 0)
    assert r.zcard(qkey("exhaust", "scheduled")) == 0
    assert r.llen(qkey("exhaust", "pending")) == 0


async def test_retry_false_runs_once_and_counts_one_failure(redis_url: str, r: Any) -> None:
    runs: list[int] = []

    async def fail(payload: dict[str, Any]) -> None:
        runs.append(current_job().attempt)
        raise RuntimeError("once")

    server = new_server(redis_url, worker("once", "fail", fail, retry=False, retry_count=5))
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("once", "fail"))
        await eventually(lambda: stats(r, "once")["failed"] == 1)
        await eventually(lambda: locate(r, "once", jid) == [], what="the task nowhere")  # I1: no rerun
    assert runs == [0]
    assert stats(r, "once")["retried"] == 0
    assert r.zcard(qkey("once", "scheduled")) == 0


# -- I1: a task is always in exactly one place -----------------------------------------------


async def test_i1_a_task_is_in_exactly_one_place_at_every_step(redis_url: str, r: Any) -> None:
    gate: dict[int, asyncio.Event] = {0: asyncio.Event(), 1: asyncio.Event()}
    started: list[int] = []

    async def flaky(payload: dict[str, Any]) -> None:
        attempt = current_job().attempt
        started.append(attempt)
        await gate[attempt].wait()
        if attempt == 0:
            raise RuntimeError("first run fails")

    server = new_server(redis_url, worker("one", "flaky", flaky, retry_count=1))
    async with Client(redis_url=redis_url) as client:
        jid = await client.enqueue(Task("one", "flaky"))
        assert locate(r, "one", jid) == ["pending"]
        async with running(server):
            await eventually(lambda: started == [0])
            places = locate(r, "one", jid)
            assert len(places) == 1
            assert places[0].startswith("inflight:")
            assert server.consumer_id in places[0]
            gate[0].set()
            await eventually(lambda: locate(r, "one", jid) != places, what="left the in-flight hash")
            assert locate(r, "one", jid) == ["scheduled"]
            assert stats(r, "one")["processed"] + stats(r, "one")["failed"] == 0
            await eventually(lambda: started == [0, 1], timeout=5)
            assert len(locate(r, "one", jid)) == 1
            assert locate(r, "one", jid)[0].startswith("inflight:")
            gate[1].set()
            await eventually(lambda: stats(r, "one")["processed"] == 1)
            assert locate(r, "one", jid) == []
            assert stats(r, "one")["failed"] == 0


# -- I2: tokens of successive deliveries grow --------------------------------------------------


async def test_i2_each_delivery_holds_a_larger_token_than_the_one_before(redis_url: str, r: Any) -> None:
    seen: list[tuple[int, list[int]]] = []

    async def fail(payload: dict[str, Any]) -> None:
        job = current_job()
        fields = [int(t) for t in r.hkeys(qkey("tok", f"inflight:{server.consumer_id}"))]
        seen.append((job.token.value, fields))
        assert job.token.resource == f"{{tok}}:job:{job.jid}"
        assert job.token is job.token  # made once, when first read
        assert (job.queue, job.operation, job.params) == ("tok", "fail", {})
        assert repr(job) == f"Job(jid={job.jid!r}, queue='tok', operation='fail', attempt={job.attempt})"
        with pytest.raises(AttributeError):
            job.attempt = 7  # type: ignore[misc]
        raise RuntimeError("again")

    server = new_server(redis_url, worker("tok", "fail", fail, retry_count=1))
    async with Client(redis_url=redis_url) as client, running(server):
        await client.enqueue(Task("tok", "fail"))
        await eventually(lambda: stats(r, "tok")["failed"] == 1, timeout=8)
    assert len(seen) == 2
    for token, fields in seen:
        assert fields == [token]  # the in-flight hash holds this delivery under its token
    assert seen[0][0] < seen[1][0]
    assert int(r.get(qkey("tok", "token"))) >= seen[1][0]


# -- wake-up, round-robin, batched claims ----------------------------------------------------


def blocked_on_wake(r: Any, consumer_id: str) -> bool:
    """True while the consumer's wake connection is blocked in BLPOP (the consumer is idle)."""
    return any(
        c.get("name") == f"fk:{consumer_id}:wake" and c.get("cmd") == "blpop" and "b" in c.get("flags", "")
        for c in client_lists(r)
    )


async def test_an_idle_server_starts_each_task_on_its_wake_marker_not_on_its_safety_poll(
    redis_url: str, r: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the safety re-poll an hour away, only the wake marker of each enqueue can start its
    # task. How soon it starts is measured in bench/ (fk.latency), not here.
    monkeypatch.setattr(waker, "IDLE_POLL", 3600.0)
    started: list[int] = []

    async def note(payload: dict[str, Any]) -> None:
        started.append(payload["i"])

    server = new_server(redis_url, worker("wake", "note", note))
    async with Client(redis_url=redis_url) as client, running(server):
        for i in range(5):
            await eventually(lambda: blocked_on_wake(r, server.consumer_id), what="the consumer idle")
            await client.enqueue(Task("wake", "note", {"i": i}))
            await eventually(lambda i=i: started == list(range(i + 1)), what=f"task {i} started")
        await eventually(lambda: stats(r, "wake")["processed"] == 5, what="the acks")
    assert started == [0, 1, 2, 3, 4]
    assert r.llen(qkey("wake", "wake")) == 0  # every marker was taken by the waker


async def test_several_queues_are_served_round_robin(redis_url: str, r: Any) -> None:
    order: list[str] = []

    async def note_a(payload: dict[str, Any]) -> None:
        order.append("a")

    async def note_b(payload: dict[str, Any]) -> None:
        order.append("b")

    server = new_server(redis_url, worker("rr-a", "op", note_a), worker("rr-b", "op", note_b))
    async with Client(redis_url=redis_url) as client:
        await client.enqueue_many(
            [Task("rr-a", "op") for _ in range(8)] + [Task("rr-b", "op") for _ in range(8)]
        )
        async with running(server):
            await eventually(lambda: len(order) == 16)
    first = order[:6]
    assert first.count("a") >= 2, order
    assert first.count("b") >= 2, order


async def held_claims(
    redis_url: str, r: Any, queue: str, concurrency: int, tasks: int
) -> tuple[list[int], int]:
    """Enqueue ``tasks`` held tasks to an idle consumer; once its slots are full, the sorted
    tokens in flight and how many tasks still wait; then release them all and wait for the acks."""
    release = asyncio.Event()

    async def hold(payload: dict[str, Any]) -> None:
        await release.wait()

    server = new_server(redis_url, worker(queue, "hold", hold), concurrency=concurrency)
    busy = min(tasks, concurrency)
    async with Client(redis_url=redis_url) as client, running(server):
        await eventually(lambda: blocked_on_wake(r, server.consumer_id), what="the consumer idle")
        await client.enqueue_many([Task(queue, "hold", {"i": i}) for i in range(tasks)])
        await eventually(lambda: inflight_count(r, queue) == busy, what="every slot filled")
        tokens = sorted(inflight(r, queue))
        waiting = len(pending(r, queue))
        assert server.consumer is not None
        await eventually(lambda: server.consumer.stats.claimed == busy)  # type: ignore[union-attr]
        release.set()
        await eventually(lambda: stats(r, queue)["processed"] == tasks)
    return tokens, waiting


async def test_a_consumer_with_free_slots_claims_several_tasks_in_one_call(redis_url: str, r: Any) -> None:
    tokens, _ = await held_claims(redis_url, r, "batch", concurrency=8, tasks=4)
    # One claim issues consecutive tokens (first .. first + n - 1); separate claims
    # would each start at the Redis clock in microseconds.
    assert tokens == list(range(tokens[0], tokens[0] + 4)), tokens


def claim_runs(tokens: list[int]) -> list[list[int]]:
    """Sorted tokens grouped by the claim that issued them (one claim's tokens are consecutive)."""
    runs = [[tokens[0]]]
    for token in tokens[1:]:
        if token == runs[-1][-1] + 1:
            runs[-1].append(token)
        else:
            runs.append([token])
    return runs


async def test_one_claim_takes_at_most_half_the_concurrency(redis_url: str, r: Any) -> None:
    # The tasks of one claim run while Redis acks and claims for the other half (docs/performance.md,
    # "Two halves"); every slot still fills, over two claims.
    tokens, waiting = await held_claims(redis_url, r, "halves", concurrency=5, tasks=7)
    assert waiting == 2
    runs = claim_runs(tokens)
    assert max(len(run) for run in runs) <= 3, runs  # half of 5, rounded up
    assert len(runs) >= 2, runs


async def test_max_claim_caps_how_many_tasks_one_claim_takes(redis_url: str, r: Any) -> None:
    release = asyncio.Event()

    async def hold(payload: dict[str, Any]) -> None:
        await release.wait()

    server = new_server(redis_url, worker("capped", "hold", hold), concurrency=6, max_claim=2)
    async with Client(redis_url=redis_url) as client, running(server):
        await eventually(lambda: blocked_on_wake(r, server.consumer_id), what="the consumer idle")
        await client.enqueue_many([Task("capped", "hold", {"i": i}) for i in range(6)])
        await eventually(lambda: inflight_count(r, "capped") == 6, what="all six claimed")
        tokens = sorted(inflight(r, "capped"))
        release.set()
        await eventually(lambda: stats(r, "capped")["processed"] == 6)
    # Consecutive tokens come from one claim: three claims of two, never one of more.
    assert [len(run) for run in claim_runs(tokens)] == [2, 2, 2], tokens


# -- clean shutdown -------------------------------------------------------------------------


async def test_a_clean_shutdown_cancels_unfinished_tasks_and_returns_them_before_run_returns(
    redis_url: str, r: Any
) -> None:
    cancelled: list[int] = []

    async def hang(payload: dict[str, Any]) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(payload["n"])
            raise

    server = new_server(redis_url, worker("stop", "hang", hang), grace=0.1)
    async with Client(redis_url=redis_url) as client:
        first = await client.enqueue(Task("stop", "hang", {"n": 1}, attempt=1))
        task = asyncio.create_task(server.run())
        await eventually(lambda: inflight_count(r, "stop") == 1)
        second = await client.enqueue(Task("stop", "hang", {"n": 2}))
        assert r.hlen(CONSUMERS) == 1
        assert r.zcard(BEATS) == 1
        server.stop()
        await asyncio.wait_for(task, 10)  # a server waiting for the hour-long task fails here
    assert cancelled == [1]  # cut short after the grace, not left running
    assert inflight_count(r, "stop") == 0
    queued = pending(r, "stop")
    assert [e["jid"] for e in queued] == [first, second]  # returned to the head: next to run
    assert queued[0]["attempt"] == 1  # same attempt: a shutdown is not a failure
    s = stats(r, "stop")
    assert (s["processed"], s["failed"], s["retried"]) == (0, 0, 0)
    assert r.hlen(CONSUMERS) == 0
    assert r.zcard(BEATS) == 0


async def test_grace_lets_short_tasks_finish_and_shutdown_ends_when_they_do(redis_url: str, r: Any) -> None:
    started = asyncio.Event()
    finished: list[str] = []

    async def short(payload: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(0.5)  # the scenario: a task still running when stop() comes
        finished.append(current_job().jid)

    # A grace of a minute: a shutdown that waited out the whole grace fails the bounded wait below.
    server = new_server(redis_url, worker("grace", "short", short), grace=60.0)
    async with Client(redis_url=redis_url) as client:
        task = asyncio.create_task(server.run())
        jid = await client.enqueue(Task("grace", "short"))
        await asyncio.wait_for(started.wait(), 10)
        server.stop()
        await asyncio.wait_for(task, 10)
    assert finished == [jid]  # it ran to its end, not cancelled
    assert stats(r, "grace")["processed"] == 1
    assert r.llen(qkey("grace", "pending")) == 0
    assert inflight_count(r, "grace") == 0


# -- I6: counters add up ---------------------------------------------------------------------


@pytest.mark.slow
async def test_i6_enqueued_equals_finished_plus_waiting_plus_in_flight_after_a_mixed_run(
    redis_url: str, r: Any
) -> None:
    release = asyncio.Event()

    async def ok(payload: dict[str, Any]) -> None:
        return None

    async def bad(payload: dict[str, Any]) -> None:
        raise RuntimeError("bad")

    async def flaky(payload: dict[str, Any]) -> None:
        if current_job().attempt == 0:
            raise RuntimeError("first time")

    async def hold(payload: dict[str, Any]) -> None:
        await release.wait()

    server = new_server(
        redis_url,
        worker("mix", "ok", ok),
        worker("mix", "bad", bad, retry=False),
        worker("mix", "flaky", flaky),
        worker("mix", "hold", hold),
        concurrency=2,
    )

    def check() -> None:
        enqueued, accounted_for = accounted(r, "mix")
        assert enqueued == accounted_for, stats(r, "mix")

    async with Client(redis_url=redis_url) as client, running(server):
        tasks = [Task("mix", "ok") for _ in range(5)] + [Task("mix", "bad") for _ in range(2)]
        tasks += [Task("mix", "flaky") for _ in range(2)] + [Task("mix", "no-such-op")]
        await client.enqueue_many(tasks)
        await client.enqueue_many([Task("mix", "ok"), Task("mix", "ok")], delay=60)
        check()
        await eventually(
            lambda: stats(r, "mix")["processed"] == 7 and stats(r, "mix")["failed"] == 3, timeout=8
        )
        check()
        await client.enqueue_many([Task("mix", "hold"), Task("mix", "hold")])
        await eventually(lambda: inflight_count(r, "mix") == 2)
        await client.enqueue_many([Task("mix", "ok") for _ in range(3)])
        assert await client.queue("mix").purge() == 3
        await client.enqueue_many([Task("mix", "ok") for _ in range(2)])
        check()  # two in flight, two pending, two scheduled
        release.set()
        await eventually(lambda: stats(r, "mix")["processed"] == 11)
        check()
    s = stats(r, "mix")
    assert (s["enqueued"], s["processed"], s["failed"], s["purged"], s["dead"]) == (19, 11, 3, 3, 1)
    assert r.zcard(qkey("mix", "scheduled")) == 2
    check()
