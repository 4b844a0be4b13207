"""FenceKitHooks on a real Redis: the primitives' eight callbacks and the job queue's.

The queue's callbacks are checked on a real ``Server`` (enqueued, started,
succeeded, failed, retried, fenced out, cancelled, returned) and on a real
pool whose child is SIGKILLed mid-job (the supervisor's reaper calls
``on_reaped``); a hook that raises never breaks the work it observes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from tests.queue_helpers import eventually, new_server, reaped_while_running, running, worker

import fencekit
from fencekit import (
    AsyncDistributedLock,
    AsyncFenceGate,
    AsyncIdempotencyGuard,
    BeginOutcome,
    Client,
    DistributedLock,
    FencedOutError,
    FenceGate,
    FenceKitHooks,
    IdempotencyGuard,
    JobEvent,
    LockNotAcquired,
    Task,
    current_job,
)
from fencekit.testing import wait_until


class Recorder:
    """Hooks recording every call: ``(callback name, args)``."""

    NAMES = [n for n in FenceKitHooks.__dataclass_fields__ if n.startswith("on_")]

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def hooks(self, **overrides: Any) -> FenceKitHooks:
        def record(name: str) -> Callable[..., None]:
            return lambda *args: self.calls.append((name, args))

        callbacks = {name: record(name) for name in self.NAMES}
        callbacks.update(overrides)
        return FenceKitHooks(**callbacks)

    def named(self, *names: str) -> list[tuple[str, tuple[Any, ...]]]:
        return [c for c in self.calls if c[0] in names]

    def jobs(self, jid: str) -> list[str]:
        """The job callbacks of ``jid``, in order, without the ``on_``."""
        return [
            n[3:] for n, args in self.calls if args and isinstance(args[0], JobEvent) and args[0].jid == jid
        ]

    def event(self, name: str, jid: str) -> JobEvent:
        (event,) = [a[0] for n, a in self.calls if n == name and a[0].jid == jid]
        return event


# -- the primitives (fencekit 0.6.1's eight callbacks) ------------------------------------------


def test_the_sync_primitives_call_their_eight_callbacks(redis_url: str) -> None:
    rec = Recorder()
    hooks = rec.hooks()
    client = redis.Redis.from_url(redis_url)
    try:
        lock = DistributedLock(client, prefix="hk", hooks=hooks)
        guard = IdempotencyGuard(client, prefix="hk", hooks=hooks)
        gate = FenceGate(client, prefix="hk", hooks=hooks)
        assert guard.try_begin("k1", ttl=timedelta(seconds=30)) is True
        assert guard.try_begin("k1", ttl=timedelta(seconds=30)) is False
        guard.mark_done("k1", result={"ok": 1})
        assert (
            guard.try_begin_or_reclaim("k1", lock=lock, lock_resource="r1", ttl=timedelta(seconds=30))
            is BeginOutcome.ALREADY_DONE
        )
        handle = lock.acquire("r1", ttl=timedelta(seconds=5))
        with pytest.raises(LockNotAcquired):
            lock.acquire("r1", ttl=timedelta(seconds=5))
        newer = fencekit.FenceToken(handle.token.value + 10, "r1")
        gate.check_and_advance(newer)
        with pytest.raises(FencedOutError):
            gate.set_if_fresh(handle.token, "{r1}:out", "stale")
        gate.set_if_fresh(newer, "{r1}:out", "fresh")
        lock.release(handle)
    finally:
        client.close()
    assert rec.calls == [
        ("on_idempotency_begin", ("k1", True)),
        ("on_idempotency_begin", ("k1", False)),
        ("on_idempotency_done", ("k1", True)),
        ("on_idempotency_outcome", ("k1", BeginOutcome.ALREADY_DONE)),
        ("on_lock_acquired", ("r1", handle.token.value)),
        ("on_lock_acquire_failed", ("r1",)),
        ("on_fence_advanced", ("r1", newer.value)),
        ("on_fence_rejected", ("r1", handle.token.value)),
        ("on_fence_advanced", ("r1", newer.value)),
        ("on_lock_released", ("r1",)),
    ]


async def test_the_async_primitives_call_the_same_callbacks(redis_url: str) -> None:
    rec = Recorder()
    hooks = rec.hooks()
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        lock = AsyncDistributedLock(client, prefix="ahk", hooks=hooks)
        guard = AsyncIdempotencyGuard(client, prefix="ahk", hooks=hooks)
        gate = AsyncFenceGate(client, prefix="ahk", hooks=hooks)
        outcome = await guard.try_begin_or_reclaim(
            "k", lock=lock, lock_resource="r", ttl=timedelta(seconds=30)
        )
        assert outcome is BeginOutcome.BEGUN
        handle = await lock.acquire("r", ttl=timedelta(seconds=5), owner_id=guard.owner_id)
        await gate.set_if_fresh(handle.token, "{r}:x", "1")
        assert await gate.check(handle.token) == handle.token.value  # a check does not advance
        await guard.mark_done("k")
        await lock.release(handle)
        with pytest.raises(FencedOutError):
            await gate.check(fencekit.FenceToken(handle.token.value - 1, "r"))
    finally:
        await client.aclose()
    assert rec.calls == [
        ("on_idempotency_outcome", ("k", BeginOutcome.BEGUN)),
        ("on_lock_acquired", ("r", handle.token.value)),
        ("on_fence_advanced", ("r", handle.token.value)),
        ("on_idempotency_done", ("k", False)),
        ("on_lock_released", ("r",)),
        ("on_fence_rejected", ("r", handle.token.value - 1)),
    ]


def test_a_raising_hook_is_logged_and_never_breaks_the_primitive(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(*_: object) -> None:
        raise RuntimeError("hook bug")

    hooks = FenceKitHooks(on_lock_acquired=boom, on_lock_released=boom)
    client = redis.Redis.from_url(redis_url)
    try:
        lock = DistributedLock(client, prefix="boom", hooks=hooks)
        with caplog.at_level(logging.WARNING, logger="fencekit.hooks"):
            for _ in range(3):
                with lock.hold("r", ttl=timedelta(seconds=5)) as handle:
                    assert handle.token.value > 0
    finally:
        client.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "fencekit.hooks"]
    # once per callback, with the traceback; the other four errors are counted, not logged
    assert len(lines) == 2
    assert (
        "hook on_lock_acquired raised (1 time(s) so far; the work went on): RuntimeError: hook bug"
        in lines[0]
    )
    assert "on_lock_released" in lines[1]


def test_hooks_of_the_wrong_type_are_refused() -> None:
    client = redis.Redis()
    with pytest.raises(TypeError, match=r"hooks must be a fencekit\.FenceKitHooks, got dict"):
        DistributedLock(client, hooks={"on_lock_acquired": print})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="FenceKitHooks"):
        fencekit.App([worker("q", "op", _noop)], hooks=object())  # type: ignore[arg-type]


async def _noop(payload: dict[str, Any]) -> None:
    return None


# -- the job queue on a real Server -------------------------------------------------------------


def server_stages(stages: list[str]) -> list[str]:
    return [stage for stage in stages if stage != "enqueued"]


async def test_a_server_tells_each_stage_of_a_job_once_redis_accepted_it(redis_url: str) -> None:
    rec = Recorder()
    seen_inside: list[str | None] = []

    def started(event: JobEvent) -> None:
        rec.calls.append(("on_started", (event,)))
        seen_inside.append(event.jid)

    hooks = rec.hooks(on_started=started)
    attempts: dict[str, int] = {}

    async def perform(payload: dict[str, Any]) -> str:
        job = current_job()
        attempts[job.jid] = attempts.get(job.jid, 0) + 1
        if payload["how"] == "fail" or (payload["how"] == "flaky" and job.attempt == 0):
            raise ValueError(f"{payload['how']} attempt {job.attempt}")
        return "ok"

    server = new_server(redis_url, worker("hk", "run", perform, retry_count=1), hooks=hooks)
    async with Client(redis_url=redis_url, hooks=hooks) as client, running(server):
        ok = await client.enqueue(Task("hk", "run", {"how": "ok"}))
        flaky = await client.enqueue(Task("hk", "run", {"how": "flaky"}))
        fail = await client.enqueue(Task("hk", "run", {"how": "fail"}))
        await eventually(
            lambda: (
                {"succeeded", "failed"} <= set(rec.jobs(flaky) + rec.jobs(fail))
                and rec.jobs(ok)[-1:] == ["succeeded"]
            ),
            timeout=20,
            what="every job settled",
        )
        await eventually(lambda: rec.jobs(fail)[-1:] == ["failed"], timeout=10)
    # The client's on_enqueued and the server's stages are told by two parties: with both on one
    # loop the server may start the task before the client's await resumes. Each is told once, and
    # the server's stages come in their order.
    for jid in (ok, flaky, fail):
        assert rec.jobs(jid).count("enqueued") == 1
    assert server_stages(rec.jobs(ok)) == ["started", "succeeded"]
    assert server_stages(rec.jobs(flaky)) == ["started", "retried", "started", "succeeded"]
    assert server_stages(rec.jobs(fail)) == ["started", "retried", "started", "failed"]
    done = rec.event("on_succeeded", ok)
    assert (done.queue, done.operation, done.attempt, done.error) == ("hk", "run", 1, None)
    assert done.token is not None
    assert done.token > 0
    assert done.claimed_ns is not None
    assert done.started_ns is not None
    assert done.finished_ns is not None
    assert done.claimed_ns <= done.started_ns <= done.finished_ns <= done.at_ns
    retried = rec.event("on_retried", flaky)
    assert isinstance(retried.error, ValueError)
    assert str(retried.error) == "flaky attempt 0"
    assert retried.delay == pytest.approx(1.0)
    failed = rec.event("on_failed", fail)
    assert failed.attempt == 2  # its second run, "attempt 2 of 2" in the log
    assert isinstance(failed.error, ValueError)
    enqueued = rec.event("on_enqueued", ok)
    assert enqueued.token is None
    assert enqueued.error is None
    assert enqueued.trace is None
    assert seen_inside.count(ok) == 1


async def test_a_refused_enqueue_is_told_with_its_error(redis_url: str) -> None:
    rec = Recorder()
    async with Client(redis_url=redis_url, hooks=rec.hooks(), max_payload=200) as client:
        with pytest.raises(fencekit.PayloadError):
            await client.enqueue(Task("hk", "big", {"x": "y" * 500}, jid="big-1"))
    ((name, (event,)),) = rec.calls
    assert name == "on_enqueued"
    assert event.jid == "big-1"
    assert isinstance(event.error, fencekit.PayloadError)


async def test_a_delivery_reaped_while_it_ran_is_fenced_out_not_succeeded(redis_url: str) -> None:
    rec = Recorder()
    jid = await reaped_while_running(redis_url, "hkf", rec.hooks(), lambda: rec.named("on_succeeded"))
    assert rec.jobs(jid) == ["started", "reaped", "fenced_out", "started", "succeeded"]
    fenced = rec.event("on_fenced_out", jid)
    second = rec.event("on_succeeded", jid)
    assert fenced.token is not None
    assert second.token is not None
    assert second.token > fenced.token
    assert rec.event("on_reaped", jid).token == fenced.token  # the reaper's call went through the hooks


async def test_cancelled_and_returned_jobs_are_told(redis_url: str) -> None:
    rec = Recorder()
    started = asyncio.Event()

    async def perform(payload: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(60)

    server = new_server(redis_url, worker("hkc", "wait", perform), hooks=rec.hooks(), grace=0.2)
    async with Client(redis_url=redis_url) as client:
        async with running(server):
            cancelled = await client.enqueue(Task("hkc", "wait", {}, keep_result=60))
            await asyncio.wait_for(started.wait(), 10)
            assert await client.cancel(cancelled)
            await eventually(lambda: "cancelled" in rec.jobs(cancelled), what="the cancel")
            started.clear()
            returned = await client.enqueue(Task("hkc", "wait", {}))
            await asyncio.wait_for(started.wait(), 10)
        # the server stopped while `returned` ran: back to its queue, told as returned
        assert rec.jobs(returned) == ["started", "returned"]
        assert rec.jobs(cancelled) == ["started", "cancelled"]
        assert await client.queue("hkc").length() == 1


async def test_a_timeout_is_a_retry_with_a_timeout_error(redis_url: str) -> None:
    rec = Recorder()

    async def perform(payload: dict[str, Any]) -> None:
        if current_job().attempt == 0:
            await asyncio.sleep(30)

    server = new_server(
        redis_url, worker("hkt", "slow", perform, timeout=0.2, retry_count=1), hooks=rec.hooks()
    )
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("hkt", "slow", {}))
        await eventually(lambda: rec.jobs(jid)[-1:] == ["succeeded"], timeout=15)
    assert rec.jobs(jid) == ["started", "retried", "started", "succeeded"]
    error = rec.event("on_retried", jid).error
    assert isinstance(error, TimeoutError)
    assert "timed out after 0.2s" in str(error)


async def test_a_raising_job_hook_never_stops_the_consumer(redis_url: str) -> None:
    def boom(event: JobEvent) -> None:
        raise RuntimeError("bad hook")

    done: list[str] = []

    async def perform(payload: dict[str, Any]) -> None:
        done.append(current_job().jid)

    hooks = FenceKitHooks(
        on_started=boom, on_succeeded=boom, on_enqueued=boom, trace_enqueue=lambda *a: 1 / 0
    )  # type: ignore[misc,return-value]
    server = new_server(redis_url, worker("hkb", "op", perform), hooks=hooks)
    async with Client(redis_url=redis_url, hooks=hooks) as client, running(server):
        jids = [await client.enqueue(Task("hkb", "op", {"i": i})) for i in range(20)]
        await eventually(lambda: len(done) == 20, timeout=15)
        await eventually(lambda: server.consumer is not None and server.consumer.stats.processed == 20)
    assert sorted(done) == sorted(jids)


# -- the pool: a child SIGKILLed mid-job, reaped by the supervisor --------------------------------

POOL_APP = textwrap.dedent(
    """
    import asyncio, json, os
    import fencekit
    from fencekit import FenceKitHooks, current_job

    EVENTS = os.environ["HOOK_EVENTS"]

    def record(name):
        def callback(event):
            with open(EVENTS, "a") as f:
                f.write(json.dumps({"hook": name, "pid": os.getpid(), "jid": event.jid,
                                    "token": event.token, "attempt": event.attempt}) + "\\n")
        return callback

    hooks = FenceKitHooks(**{n: record(n[3:]) for n in ("on_started", "on_succeeded", "on_reaped")})

    class Hang:
        queue = "hkpool"
        operation = "hang"

        @classmethod
        async def perform(cls, payload):
            if current_job().attempt == 0:
                await asyncio.sleep(600)
            return "second time"

    app = fencekit.App([Hang], hooks=hooks)
    """
)


@pytest.mark.slow
def test_the_supervisor_reaps_a_killed_childs_job_and_tells_on_reaped(redis_url: str, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    (tmp_path / "hookapp.py").write_text(POOL_APP)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    env["HOOK_EVENTS"] = str(events)
    pool = subprocess.Popen(
        [sys.executable, "-m", "fencekit.pool", "hookapp:app", "--redis-url", redis_url, "--procs", "1",
         "--web-port", "off"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    jid = "reap-me-1"
    try:
        asyncio.run(_enqueue(redis_url, Task("hkpool", "hang", {}, jid=jid)))
        wait_until(lambda: _hooked(events, "started"), 30, what="the first run")
        (first,) = _hooked(events, "started")
        os.kill(first["pid"], signal.SIGKILL)
        wait_until(lambda: _hooked(events, "succeeded"), 30, what="the second run")
    finally:
        pool.send_signal(signal.SIGTERM)
        try:
            out, _ = pool.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(pool.pid, signal.SIGKILL)
            out, _ = pool.communicate()
    assert pool.returncode == 0, out.decode(errors="replace")[-3000:]
    (reaped,) = _hooked(events, "reaped")
    assert (reaped["jid"], reaped["token"], reaped["attempt"]) == (jid, first["token"], 1)
    assert reaped["pid"] == pool.pid  # told in the supervisor, whose reaper returned it
    (second,) = _hooked(events, "succeeded")
    assert second["attempt"] == 2
    assert second["token"] > first["token"]
    assert second["pid"] not in (first["pid"], pool.pid)  # the restarted child


def _hooked(path: Path, hook: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in entries if e["hook"] == hook]


async def _enqueue(url: str, task: Task) -> str:
    async with Client(redis_url=url) as client:
        return await client.enqueue(task)
