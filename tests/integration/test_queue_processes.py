"""Real processes: a Server in a child process is SIGKILLed mid-task, SIGSTOPped past its
heartbeat TTL and resumed, or SIGTERMed; another Server (in this process) reaps it.
Every outcome is read from Redis."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest
from tests.queue_helpers import (
    BEATS,
    CONSUMERS,
    SERVER_SCRIPT,
    ServerProcess,
    consumer_of,
    events,
    eventually,
    inflight_count,
    locate,
    new_server,
    pending,
    qkey,
    running,
    stats,
)
from tests.servers import direct

from fencekit import Client, FencedOutError, Task, current_job

pytestmark = pytest.mark.slow


@pytest.fixture
def r(redis_url: str) -> Any:
    client = direct(redis_url)
    yield client
    client.close()


@pytest.fixture
def procs() -> Any:
    started: list[ServerProcess] = []
    yield started
    for proc in started:
        proc.close()


async def start_holding(
    tmp_path: Path, redis_url: str, r: Any, procs: list[ServerProcess], queue: str, **kw: Any
) -> tuple[ServerProcess, str]:
    """A child Server holding one task of ``queue``; returns it and the task's jid."""
    proc = ServerProcess(tmp_path, redis_url, queue, **kw)
    procs.append(proc)
    async with Client(redis_url=redis_url) as client:
        jid = await client.enqueue(Task(queue, "hold", {"n": 1}))
    try:
        await eventually(
            lambda: [e for e in events(r) if e[0] == proc.pid], timeout=20, what="child started the task"
        )
    except TimeoutError:
        raise AssertionError(f"child server did not start the task; its log:\n{proc.log()}") from None
    return proc, jid


@pytest.mark.parametrize("retry", [True, False], ids=["retry", "no-retry"])
async def test_a_server_killed_mid_task_has_its_task_returned_by_another_servers_reaper(
    tmp_path: Path, redis_url: str, r: Any, procs: list[ServerProcess], retry: bool
) -> None:
    runs: list[tuple[str, int]] = []

    class HoldWorker:  # the same (queue, operation) as the child's worker
        queue = "crash"
        operation = "hold"

        @classmethod
        async def perform(cls, payload: dict) -> None:
            job = current_job()
            runs.append((job.jid, job.attempt))

    HoldWorker.retry = retry  # type: ignore[attr-defined]
    child, jid = await start_holding(tmp_path, redis_url, r, procs, "crash")
    child_id = consumer_of(r, child.pid)
    assert child_id is not None
    child.signal(signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    # Never only in a process's memory: the task sits in the dead consumer's in-flight hash.
    assert locate(r, "crash", jid) == [f"inflight:{qkey('crash', 'inflight:' + child_id)}"]

    server = new_server(redis_url, HoldWorker, heartbeat_ttl=1.0)
    async with running(server):
        if retry:
            await eventually(lambda: stats(r, "crash")["processed"] == 1, timeout=10, what="task ran again")
        else:
            await eventually(lambda: stats(r, "crash")["failed"] == 1, timeout=10, what="task failed")
        await eventually(
            lambda: not r.hexists(CONSUMERS, child_id), timeout=5, what="dead consumer forgotten"
        )
        # Finished and in no place in Redis (I1): nothing is left that could run it again.
        await eventually(lambda: locate(r, "crash", jid) == [], what="the task nowhere")
    s = stats(r, "crash")
    if retry:
        assert runs == [(jid, 1)]  # ran again, with attempt + 1
        assert (s["retried"], s["processed"], s["failed"]) == (1, 1, 0)
    else:
        assert runs == []  # at-most-once: never runs again
        assert (s["retried"], s["processed"], s["failed"], s["dead"]) == (0, 0, 1, 0)
    assert r.zscore(BEATS, child_id) is None
    assert locate(r, "crash", jid) == []
    assert inflight_count(r, "crash") == 0
    async with Client(redis_url=redis_url) as client:  # the record keeps both runs (the job page's)
        info = await client.job(jid)
    assert info is not None
    expected = (
        [(1, "crashed", child_id), (2, "done", server.consumer_id)] if retry else [(1, "failed", child_id)]
    )
    assert [(run.number, run.outcome, run.consumer) for run in info.runs] == expected


async def test_a_paused_server_is_fenced_out_when_it_resumes(
    tmp_path: Path, redis_url: str, r: Any, procs: list[ServerProcess]
) -> None:
    b_runs: list[tuple[int, int]] = []

    class HoldWorker:
        queue = "pause"
        operation = "hold"

        @classmethod
        async def perform(cls, payload: dict) -> str:
            job = current_job()
            b_runs.append((job.attempt, job.token.value))
            await job.set_if_fresh("{pause}:result", "B")
            return "B's result"

    child, jid = await start_holding(tmp_path, redis_url, r, procs, "pause", ttl=1.0)
    child_id = consumer_of(r, child.pid)
    assert child_id is not None
    ((_, _, a_attempt, a_token),) = [e for e in events(r) if e[0] == child.pid]
    child.signal(signal.SIGSTOP)
    try:
        server = new_server(redis_url, HoldWorker, heartbeat_ttl=1.0)
        async with running(server):
            await eventually(lambda: r.get("{pause}:result") == b"B", timeout=10, what="B re-ran the task")
            await eventually(lambda: stats(r, "pause")["processed"] == 1)
            assert not r.hexists(CONSUMERS, child_id)  # reaped while silent: forgotten
            r.set("release", "1")
            child.signal(signal.SIGCONT)
            await eventually(
                lambda: r.exists(f"fenced:{child.pid}"), timeout=10, what="A's set_if_fresh fenced out"
            )
            await eventually(
                lambda: stats(r, "pause")["fenced_out"] >= 1, timeout=5, what="A's ack fenced out"
            )
            # A re-registers with its next beat: it is watched again.
            await eventually(lambda: r.hexists(CONSUMERS, child_id), timeout=5, what="A re-registered")
            # A's write and ack were refused (seen above) and the task is in no place (I1): done.
            await eventually(lambda: locate(r, "pause", jid) == [], what="the task nowhere")
            s = stats(r, "pause")
            assert s["processed"] == 1  # exactly once
            assert r.get("{pause}:result") == b"B"
            assert not r.exists(f"wrote:{child.pid}")
            async with Client(redis_url=redis_url) as client:
                # A returned "A-<pid>-stale" after B finished: its ack, result included, was refused
                assert await client.result(jid, timeout=5) == "B's result"
                info = await client.job(jid)
                assert info is not None
                assert info.token == b_runs[0][1]
    finally:
        child.signal(signal.SIGCONT)
    assert a_attempt == 0
    assert len(b_runs) == 1
    assert b_runs[0][0] == 1
    assert b_runs[0][1] > a_token  # the later delivery holds the larger token (I2)
    assert inflight_count(r, "pause") == 0
    assert pending(r, "pause") == []
    child.signal(signal.SIGTERM)
    assert child.wait(15) == 0
    assert FencedOutError.__name__ in r.get(f"fenced:{child.pid}").decode()


async def test_sigterm_stops_a_server_cleanly(
    tmp_path: Path, redis_url: str, r: Any, procs: list[ServerProcess]
) -> None:
    child, jid = await start_holding(tmp_path, redis_url, r, procs, "term", ttl=5.0, grace=0.0)
    child_id = consumer_of(r, child.pid)
    assert child_id is not None
    assert r.zscore(BEATS, child_id) is not None
    child.signal(signal.SIGTERM)
    assert child.wait(10) == 0
    back = pending(r, "term")
    assert [(e["jid"], e["attempt"]) for e in back] == [(jid, 0)]  # returned at once, same attempt
    assert inflight_count(r, "term") == 0
    assert not r.hexists(CONSUMERS, child_id)
    assert r.zscore(BEATS, child_id) is None
    assert r.get(f"shutdown-hook:{child.pid}") == b"1"
    log = child.log()
    assert "server process exiting" in log
    # The default logger writes text to stdout: start (queues, concurrency) and the task's jid.
    assert "term" in log
    assert "concurrency 1" in log
    assert jid in log


async def test_a_second_stop_signal_cancels_the_running_tasks_of_a_server_at_once(
    tmp_path: Path, redis_url: str, r: Any, procs: list[ServerProcess]
) -> None:
    """The first hour, item 7: a Server's second SIGTERM/SIGINT skips the grace and says so in one line."""
    child, jid = await start_holding(tmp_path, redis_url, r, procs, "second", ttl=5.0, grace=600.0)
    child.signal(signal.SIGTERM)
    await eventually(lambda: "shutting down" in child.log(), timeout=10, what="the graceful stop began")
    child.signal(signal.SIGINT)
    assert child.wait(30) == 0  # far inside the 600-s grace: the second signal cut it short
    lines = [line for line in child.log().splitlines() if "second stop signal" in line]
    assert len(lines) == 1, child.log()
    assert "without the rest of the grace" in lines[0]
    assert [(e["jid"], e["attempt"]) for e in pending(r, "second")] == [(jid, 0)]  # back, same attempt
    assert inflight_count(r, "second") == 0


async def test_a_concurrency_slot_is_a_lease_a_paused_holder_resumes_beside_the_new_one(
    tmp_path: Path, redis_url: str, r: Any, procs: list[ServerProcess]
) -> None:
    """``max_concurrency`` is a lease, like a delivery: a Server (child A) holding key ``t``'s one
    slot is SIGSTOPped past its heartbeat TTL; B's reaper returns A's delivery and frees the slot,
    B claims the task under a newer token and holds it; A resumes, and for a while both run the
    key's task at once (two runs, cap one). The writes decide: A's ``set_if_fresh`` is fenced out,
    B's lands, the task is processed once. (docs/guides/flow.md, "The cap is a lease".)"""
    b_started = asyncio.Event()
    b_release = asyncio.Event()

    class HoldWorker:
        queue = "lease"
        operation = "hold"
        max_concurrency = 1

        @classmethod
        async def perform(cls, payload: dict) -> str:
            b_started.set()
            await b_release.wait()
            await current_job().set_if_fresh("{lease}:result", "B")
            return "B"

    source = SERVER_SCRIPT.replace('operation = "hold"', 'operation = "hold"\n    max_concurrency = 1')
    assert source != SERVER_SCRIPT
    child = ServerProcess(tmp_path, redis_url, "lease", ttl=1.0, source=source)
    procs.append(child)
    async with Client(redis_url=redis_url) as client:
        jid = await client.enqueue(Task("lease", "hold", {"n": 1}, concurrency_key="t"))
    await eventually(lambda: [e for e in events(r) if e[0] == child.pid], timeout=20, what="A holds the slot")
    child_id = consumer_of(r, child.pid)
    child.signal(signal.SIGSTOP)
    try:
        server = new_server(redis_url, HoldWorker, heartbeat_ttl=1.0)
        async with running(server):
            await asyncio.wait_for(b_started.wait(), 15)  # B got the slot A's lease no longer held
            child.signal(signal.SIGCONT)
            await eventually(lambda: r.hexists(CONSUMERS, child_id), timeout=10, what="A resumed and beats")
            assert child.proc.poll() is None  # A is still running it ...
            assert not r.exists(f"fenced:{child.pid}")
            assert not b_release.is_set()  # ... and so is B: two runs of key t, cap 1
            r.set("release", "1")
            await eventually(lambda: r.exists(f"fenced:{child.pid}"), timeout=10, what="A's write fenced out")
            b_release.set()
            await eventually(lambda: r.get("{lease}:result") == b"B", timeout=10, what="B's write landed")
            await eventually(lambda: locate(r, "lease", jid) == [], timeout=10, what="the task done")
        assert stats(r, "lease")["processed"] == 1
        assert not r.exists(f"wrote:{child.pid}")
        assert not r.keys(qkey("lease", "slots:*"))  # no slot left held
    finally:
        child.signal(signal.SIGCONT)
