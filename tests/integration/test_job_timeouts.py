"""A job's time on a real Redis: timeouts (worker and task), a job that swallows its
cancellation and is fenced out, tasks that expire before they start, enqueue at a
datetime, and failure log lines that number attempts from 1 and keep the traceback."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from tests.queue_helpers import (
    eventually,
    inflight_count,
    messages,
    new_server,
    pending,
    qkey,
    redis_time_ms,
    running,
    scheduled,
    stats,
    worker,
)

from fencekit import Client, ConfigError, FencedOutError, PayloadError, Task, current_job
from fencekit._redis import scripts
from fencekit._redis.clients import async_client
from fencekit._redis.run import arun


def records(server: Any) -> list[logging.LogRecord]:
    return list(server.logger.list_handler.records)


# -- timeouts ----------------------------------------------------------------------------------


async def test_a_job_past_its_timeout_is_cancelled_and_retried_under_its_policy(
    redis_url: str, r: Any
) -> None:
    runs: list[int] = []
    cancelled: list[int] = []

    async def hang(payload: dict[str, Any]) -> None:
        runs.append(current_job().attempt)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(current_job().attempt)
            raise

    server = new_server(redis_url, worker("slow", "hang", hang, timeout=0.2, retry_count=1))
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("slow", "hang"))
        await eventually(lambda: stats(r, "slow")["failed"] == 1, timeout=10, what="both attempts timed out")
    assert runs == [0, 1]
    assert cancelled == [0, 1]  # each run was cancelled, not left running
    s = stats(r, "slow")
    assert (s["retried"], s["failed"], s["processed"]) == (1, 1, 0)
    assert inflight_count(r, "slow") == 0
    lines = [m for m in messages(server.logger) if "timed out" in m]
    assert lines == [
        f"task {jid} (slow/hang) timed out after 0.2s (attempt 1 of 2), retrying in 1.0s",
        f"task {jid} (slow/hang) timed out after 0.2s (attempt 2 of 2), failed permanently",
    ]


async def test_a_task_timeout_overrides_the_worker_s(redis_url: str, r: Any) -> None:
    done: list[str] = []

    async def nap(payload: dict[str, Any]) -> None:
        await asyncio.sleep(payload["s"])
        done.append(current_job().jid)

    server = new_server(redis_url, worker("naps", "nap", nap, timeout=timedelta(seconds=30), retry=False))
    async with Client(redis_url=redis_url) as client, running(server):
        short = await client.enqueue(Task("naps", "nap", {"s": 5}, timeout=0.1))
        fine = await client.enqueue(Task("naps", "nap", {"s": 0.3}))  # the worker's 30 s applies
        await eventually(
            lambda: stats(r, "naps")["failed"] == 1 and stats(r, "naps")["processed"] == 1, timeout=10
        )
    assert done == [fine]
    assert any(
        f"task {short} (naps/nap) timed out after 0.1s (attempt 1 of 1)" in m for m in messages(server.logger)
    )


async def test_a_job_that_swallows_its_cancellation_is_fenced_out_here_and_in_redis(
    redis_url: str, r: Any
) -> None:
    outcome: dict[str, Any] = {}
    settled = asyncio.Event()

    async def stubborn(payload: dict[str, Any]) -> None:
        job = current_job()
        outcome["token"] = job.token.value
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass  # the job's bug: it carries on after its timeout
        await settled.wait()  # the test saw the timeout land in Redis
        try:
            await job.set_if_fresh("{stubborn}:out", "late")
        except FencedOutError as exc:
            outcome["refused"] = str(exc)

    server = new_server(redis_url, worker("stubborn", "run", stubborn, timeout=0.2, retry=False))
    async with Client(redis_url=redis_url) as client, running(server):
        await client.enqueue(Task("stubborn", "run"))
        await eventually(lambda: stats(r, "stubborn")["failed"] == 1, timeout=10, what="the timeout settled")
        assert inflight_count(r, "stubborn") == 0  # the delivery left in-flight: Redis refuses it too
        consumer_hash = qkey("stubborn", f"inflight:{server.consumer_id}")
        ar = async_client(redis_url)
        try:
            with pytest.raises(FencedOutError, match="no longer in flight"):
                await arun(
                    ar,
                    scripts.job_set(
                        inflight=consumer_hash,
                        fence="fencekit:fence:{stubborn}:job:x",
                        target="{stubborn}:out",
                        token=outcome["token"],
                        value="late",
                    ),
                )
        finally:
            await ar.aclose()
        settled.set()
        await eventually(lambda: "refused" in outcome, what="the late write")
        await eventually(
            lambda: any("ignored the cancellation" in m for m in messages(server.logger)),
            what="the log line of the stubborn run",
        )
    assert "timed out after 0.2s" in outcome["refused"]
    assert r.get("{stubborn}:out") is None
    assert stats(r, "stubborn")["processed"] == 0


async def test_stopping_the_server_cancels_a_stubborn_run_again(redis_url: str, r: Any) -> None:
    ends: list[str] = []

    async def stubborn(payload: dict[str, Any]) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass
        try:
            await asyncio.sleep(30)  # the second cancellation, from the stop, ends it
        except asyncio.CancelledError:
            ends.append("cancelled at stop")
            raise

    server = new_server(redis_url, worker("stubborn2", "run", stubborn, timeout=0.1, retry=False))
    async with Client(redis_url=redis_url) as client, running(server):
        await client.enqueue(Task("stubborn2", "run"))
        await eventually(lambda: stats(r, "stubborn2")["failed"] == 1, timeout=10)
    assert ends == ["cancelled at stop"]


# -- expiry and start times --------------------------------------------------------------------


async def test_a_task_past_its_expires_time_is_dropped_unrun(redis_url: str, r: Any) -> None:
    ran: list[str] = []

    async def note(payload: dict[str, Any]) -> None:
        ran.append(current_job().jid)

    server = new_server(redis_url, worker("exp", "note", note))
    async with Client(redis_url=redis_url) as client:
        # due in 0.5 s but expiring after 0.05 s: it cannot start in time
        late = await client.enqueue(Task("exp", "note", expires=0.05), delay=0.5)
        past = await client.enqueue(Task("exp", "note", expires=datetime.now(timezone.utc) - timedelta(1)))
        fine = await client.enqueue(Task("exp", "note", expires=timedelta(minutes=5)))
        async with running(server):
            await eventually(lambda: stats(r, "exp")["expired"] == 2, timeout=10, what="two expired")
            await eventually(lambda: ran == [fine], what="the live one ran")
        assert (await client.queue("exp").stats()).expired == 2
    s = stats(r, "exp")
    assert (s["processed"], s["failed"], s["retried"]) == (1, 0, 0)
    assert inflight_count(r, "exp") == 0
    dropped = [m for m in messages(server.logger) if "expired before it started" in m]
    assert sorted(dropped) == sorted(
        f"task {j} (exp/note) expired before it started: dropped" for j in (late, past)
    )


async def test_enqueue_at_an_aware_datetime_schedules_it_on_the_redis_clock(redis_url: str, r: Any) -> None:
    async with Client(redis_url=redis_url) as client:
        before = redis_time_ms(r)
        await client.enqueue(
            Task("at", "op", {"n": 1}), at=datetime.now(timezone.utc) + timedelta(seconds=60)
        )
        handle = client.queue("at")
        await handle.schedule(Task("at", "op", {"n": 2}), datetime.now(timezone.utc) + timedelta(seconds=120))
        after = redis_time_ms(r)
        await client.enqueue(Task("at", "op", {"n": 3}), at=datetime.now(timezone.utc) - timedelta(hours=1))
        entries = {env["params"]["n"]: due for env, due in scheduled(r, "at")}
        assert set(entries) == {1, 2}
        # the producer's clock and the Redis clock are one host's here: the slack below is the
        # time between taking "now" and the script running; above, rounding to whole ms
        assert before + 60_000 - 1_000 <= entries[1] <= after + 60_000 + 2
        assert before + 120_000 - 1_000 <= entries[2] <= after + 120_000 + 2
        assert [env["params"]["n"] for env in pending(r, "at")] == [3]  # a time already past: now
        listed = await handle.scheduled()
        assert [t.params["n"] for t in listed] == [1, 2]
        assert listed[0].due_at == pytest.approx(entries[1] / 1000)

        with pytest.raises(ConfigError, match="timezone-aware"):
            await client.enqueue(Task("at", "op"), at=datetime.now())
        with pytest.raises(ConfigError, match="either delay= or at="):
            await client.enqueue(Task("at", "op"), delay=1, at=datetime.now(timezone.utc))
        with pytest.raises(ConfigError, match="scheduled through the handle of 'at'"):
            await handle.schedule(Task("other", "op"), datetime.now(timezone.utc))


async def test_bad_timeouts_and_expiries_are_refused_at_enqueue(redis_url: str, r: Any) -> None:
    async with Client(redis_url=redis_url) as client:
        for bad in (0, -1, float("inf"), True, "5"):
            with pytest.raises(PayloadError, match="timeout"):
                await client.enqueue(Task("bad", "op", timeout=bad))  # type: ignore[arg-type]
        for bad_exp in (0, -5, "soon", datetime(2030, 1, 1)):
            with pytest.raises(PayloadError, match="expires"):
                await client.enqueue(Task("bad", "op", expires=bad_exp))  # type: ignore[arg-type]
    assert r.llen(qkey("bad", "pending")) == 0


async def test_a_worker_with_a_bad_timeout_is_refused_naming_it(redis_url: str) -> None:
    async def nothing(payload: dict[str, Any]) -> None:
        return None

    for bad in (0, -2, "10", True):
        with pytest.raises(ConfigError, match=r"attribute 'timeout' must be None or a positive number"):
            new_server(redis_url, worker("w", "op", nothing, timeout=bad))


# -- failure log lines ----------------------------------------------------------------------


async def test_failures_number_attempts_from_1_and_the_final_one_logs_its_traceback(
    redis_url: str, r: Any
) -> None:
    async def broken(payload: dict[str, Any]) -> None:
        if current_job().attempt == 0:
            raise RuntimeError("first line\nsecond line")
        {}["lines"]

    server = new_server(redis_url, worker("broken", "run", broken, retry_count=1))
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("broken", "run"))
        await eventually(lambda: stats(r, "broken")["failed"] == 1, timeout=10)
    by_message = {rec.getMessage(): rec for rec in records(server) if jid in rec.getMessage()}
    retry = f"task {jid} failed (attempt 1 of 2), retrying in 1.0s: RuntimeError: first line"
    final = f"task {jid} failed (attempt 2 of 2), failed permanently: KeyError: 'lines'"
    assert retry in by_message, list(by_message)
    assert by_message[retry].exc_info is None  # a retry logs the first line only
    assert final in by_message, list(by_message)
    exc_info = by_message[final].exc_info
    assert exc_info is not None
    assert exc_info[0] is KeyError
    formatted = logging.Formatter().format(by_message[final])
    assert "Traceback (most recent call last)" in formatted
    assert 'in broken\n    {}["lines"]' in formatted
    started = [m for m in by_message if " started: " in m]
    assert started == [
        f"task {jid} started: broken/run attempt 1 of 2",
        f"task {jid} started: broken/run attempt 2 of 2",
    ]
