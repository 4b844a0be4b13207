"""Burst mode on real Redis and real processes: serve until drained, then stop.

``Server(burst=True)`` and ``python -m fencekit.pool APP --burst`` share one
rule (``fencekit.services.drain``); these tests check what it promises by
reading Redis afterwards: every task ran (follow-ups enqueued by running
tasks and retries after a delay included), nothing is left pending,
scheduled or in flight, and the counters add up (I6). A task scheduled far
ahead keeps the run going until ``burst_timeout``, which then says what is
left and leaves the task where it was.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import redis
from tests.queue_helpers import inflight_count, new_server, qkey, stats
from tests.servers import direct

from fencekit import Client, Task, current_job
from fencekit.errors import DrainTimeout
from fencekit.services.drain import DrainRule, Observation, QueueLeft, observe


async def _relay(payload: dict[str, Any], queue: str, operation: str) -> None:
    """A hop of a relay: wait ``pause`` s (several observations see this queue busy and the other
    one empty), then enqueue the next hop into the other queue and finish."""
    relay = payload.get("relay", 0)
    if relay:
        await asyncio.sleep(payload.get("pause", 0.0))
        next_hop = {"n": 0, "relay": relay - 1, "pause": payload.get("pause", 0.0)}
        await current_job().enqueue(Task(queue, operation, next_hop))


class Fan:
    """Queue burst-a: enqueues ``n`` leaves into burst-b; a ``relay`` hop hands on to a Leaf."""

    queue = "burst-a"
    operation = "fan"
    runs: list[int] = []

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        job = current_job()
        for i in range(payload["n"]):
            await job.enqueue(Task("burst-b", "leaf", {"i": i}))
        await _relay(payload, "burst-b", "leaf")
        cls.runs.append(payload["n"])


class Leaf:
    """Queue burst-b: counts its runs; a ``relay`` hop hands on to a Fan in burst-a."""

    queue = "burst-b"
    operation = "leaf"
    runs = 0

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        cls.runs += 1
        await _relay(payload, "burst-a", "fan")


class Flaky:
    """Queue burst-a: fails its first attempt, succeeds on the retry (scheduled after its delay)."""

    queue = "burst-a"
    operation = "flaky"
    retry_count = 2
    attempts: list[int] = []

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> str:
        attempt = current_job().attempt
        cls.attempts.append(attempt)
        if attempt == 0:
            raise RuntimeError("first attempt fails")
        return "ok"


def _reset() -> None:
    Fan.runs, Leaf.runs, Flaky.attempts = [], 0, []


def _left(r: redis.Redis, *queues: str) -> dict[str, tuple[int, int, int]]:
    return {
        q: (int(r.llen(qkey(q, "pending"))), int(r.zcard(qkey(q, "scheduled"))), inflight_count(r, q))
        for q in queues
    }


async def test_a_burst_server_returns_once_every_task_ran_follow_ups_and_retries_included(
    redis_url: str,
) -> None:
    _reset()
    r = direct(redis_url)
    async with Client(redis_url) as client:
        await client.enqueue_many(Task("burst-a", "fan", {"n": 3}) for _ in range(20))
        await client.enqueue_many(Task("burst-a", "flaky", {}) for _ in range(3))
    server = new_server(redis_url, Fan, Leaf, Flaky, burst=True, concurrency=8, web_port=None)
    await server.run()
    assert len(Fan.runs) == 20
    assert Leaf.runs == 60  # every follow-up enqueued by a running task ran too
    assert sorted(Flaky.attempts) == [0, 0, 0, 1, 1, 1]  # each retried once, after its delay
    assert _left(r, "burst-a", "burst-b") == {"burst-a": (0, 0, 0), "burst-b": (0, 0, 0)}
    a, b = stats(r, "burst-a"), stats(r, "burst-b")
    assert (a["enqueued"], a["processed"], a["retried"], a.get("failed", 0)) == (23, 23, 3, 0)
    assert (b["enqueued"], b["processed"]) == (60, 60)
    assert server.burst_left() is None


async def test_a_burst_server_on_empty_queues_returns_at_once(redis_url: str) -> None:
    server = new_server(redis_url, Fan, Leaf, burst=True, web_port=None)
    await server.run()
    assert server.burst_left() is None
    assert not server.started.is_set()


@pytest.mark.parametrize("pause", [0.0, 0.25], ids=["at-once", "after-observations"])
async def test_a_chain_of_follow_ups_across_two_queues_never_ends_the_run_early(
    redis_url: str, pause: float
) -> None:
    """Each hop enqueues the next into the other queue, which the watch has seen empty: all hops run.

    With ``pause`` each hop runs across several observations that see its
    own queue busy and the other one empty before the follow-up arrives.
    """
    _reset()
    r = direct(redis_url)
    hops = 8 if pause else 40
    async with Client(redis_url) as client:
        await client.enqueue(Task("burst-b", "leaf", {"relay": hops, "pause": pause}))
    server = new_server(redis_url, Fan, Leaf, burst=True, web_port=None)
    await server.run()
    assert Leaf.runs + len(Fan.runs) == hops + 1
    a, b = stats(r, "burst-a"), stats(r, "burst-b")
    assert a.get("processed", 0) + b["processed"] == hops + 1
    assert _left(r, "burst-a", "burst-b") == {"burst-a": (0, 0, 0), "burst-b": (0, 0, 0)}


async def test_a_task_scheduled_far_ahead_keeps_the_run_until_burst_timeout_which_says_what_is_left(
    redis_url: str,
) -> None:
    _reset()
    r = direct(redis_url)
    async with Client(redis_url) as client:
        await client.enqueue(Task("burst-b", "leaf", {}), delay=3600)
        await client.enqueue(Task("burst-b", "leaf", {}))
    server = new_server(redis_url, Fan, Leaf, burst=True, burst_timeout=1.0, web_port=None)
    left = r"burst-b: 0 pending, 1 scheduled, 0 in flight, next due in"
    with pytest.raises(DrainTimeout, match=left) as err:
        await server.run()
    assert "burst-b: 0 pending, 1 scheduled" in err.value.left
    assert Leaf.runs == 1  # the due one ran; the far one waits, untouched
    assert _left(r, "burst-b") == {"burst-b": (0, 1, 0)}


async def test_one_observation_reads_pending_scheduled_in_flight_and_counters_of_each_queue(
    redis_url: str,
) -> None:
    r = direct(redis_url)
    async with Client(redis_url) as client:
        await client.enqueue(Task("burst-a", "fan", {"n": 0}))
        await client.enqueue(Task("burst-b", "leaf", {}), delay=60)
        r.hset("fencekit:{registry}:consumers", "c1", "{}")
        r.hset(qkey("burst-b", "inflight:c1"), mapping={"1": "x", "2": "y"})
        seen = await observe(client.redis, client.keys, ["burst-a", "burst-b"])
    a, b = seen.queues
    assert (a.pending, a.scheduled, a.in_flight, a.next_due) == (1, 0, 0, None)
    assert (b.pending, b.scheduled, b.in_flight) == (0, 1, 2)
    assert b.next_due is not None
    assert a.stats["enqueued"] == 1
    assert not seen.empty


def _obs(**queues: tuple[int, int]) -> Observation:
    """Queues as (tasks held, enqueued counter)."""
    looks = (QueueLeft(name, held, 0, 0, None, {"enqueued": n}) for name, (held, n) in queues.items())
    return Observation(tuple(looks))


def test_the_rule_needs_two_empty_observations_with_unchanged_counters() -> None:
    rule = DrainRule()
    assert not rule.drained(_obs(a=(0, 5), b=(0, 3)))  # one empty look is not enough
    # a task of a enqueued into b after b was probed, and finished before a was: b's counter moved
    assert not rule.drained(_obs(a=(0, 5), b=(0, 4)))
    assert rule.drained(_obs(a=(0, 5), b=(0, 4)))


def test_the_rule_never_says_drained_while_a_queue_holds_a_task() -> None:
    rule = DrainRule()
    assert not rule.drained(_obs(a=(1, 5)))
    assert not rule.drained(_obs(a=(0, 5)))  # the look before held a task
    assert rule.drained(_obs(a=(0, 5)))


POOL_APP = textwrap.dedent(
    """
    from fencekit import Task, current_job

    class Fan:
        queue = "burst-a"
        operation = "fan"

        @classmethod
        async def perform(cls, payload):
            for i in range(payload["n"]):
                await current_job().enqueue(Task("burst-b", "leaf", {"i": i}))

    class Leaf:
        queue = "burst-b"
        operation = "leaf"

        @classmethod
        async def perform(cls, payload):
            return payload.get("i")

    WORKERS = [Fan, Leaf]
    """
)


def _pool(app_dir: Path, url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencekit.pool", "burstapp:WORKERS", "--redis-url", url, "--web-port", "off",
         "--procs", "2", "--heartbeat-ttl", "10", *flags],
        cwd=app_dir, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "burstapp.py").write_text(POOL_APP)
    return tmp_path


async def test_a_burst_pool_exits_0_after_draining_with_counters_adding_up(
    app_dir: Path, redis_url: str
) -> None:
    r = direct(redis_url)
    async with Client(redis_url) as client:
        await client.enqueue_many(Task("burst-a", "fan", {"n": 5}) for _ in range(100))
    done = _pool(app_dir, redis_url, "--burst", "--concurrency", "4")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "burst: every queue is empty" in done.stdout
    a, b = stats(r, "burst-a"), stats(r, "burst-b")
    assert (a["enqueued"], a["processed"]) == (100, 100)
    assert (b["enqueued"], b["processed"]) == (500, 500)
    assert _left(r, "burst-a", "burst-b") == {"burst-a": (0, 0, 0), "burst-b": (0, 0, 0)}


def test_a_burst_pool_on_empty_queues_exits_0_at_once(app_dir: Path, redis_url: str) -> None:
    done = _pool(app_dir, redis_url, "--burst")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "burst: every queue is empty" in done.stdout


async def test_a_burst_pool_with_a_task_scheduled_far_ahead_exits_5_at_burst_timeout_saying_what_is_left(
    app_dir: Path, redis_url: str
) -> None:
    r = direct(redis_url)
    async with Client(redis_url) as client:
        await client.enqueue(Task("burst-b", "leaf", {}), delay=3600)
    done = _pool(app_dir, redis_url, "--burst", "--burst-timeout", "1")
    assert done.returncode == 5, done.stdout + done.stderr
    assert "burst_timeout 1s passed with tasks left: burst-b: 0 pending, 1 scheduled" in done.stdout
    assert _left(r, "burst-b") == {"burst-b": (0, 1, 0)}


def test_fencekit_burst_in_the_environment_turns_burst_mode_on(app_dir: Path, redis_url: str) -> None:
    import os

    env = {**os.environ, "FENCEKIT_BURST": "yes"}
    done = subprocess.run(
        [sys.executable, "-m", "fencekit.pool", "burstapp:WORKERS", "--redis-url", redis_url,
         "--web-port", "off", "--procs", "1"],
        cwd=app_dir, capture_output=True, text=True, timeout=90, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "burst: every queue is empty" in done.stdout


async def test_an_embedded_burst_pool_stops_by_itself_once_drained_and_wait_returns_0(
    app_dir: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fencekit.pool import Pool

    monkeypatch.syspath_prepend(str(app_dir))
    monkeypatch.setenv("PYTHONPATH", str(app_dir))
    r = direct(redis_url)
    async with Client(redis_url) as client:
        await client.enqueue_many(Task("burst-a", "fan", {"n": 2}) for _ in range(10))
    pool = Pool("burstapp:WORKERS", procs=1, redis_url=redis_url, web_port=None, burst=True)
    try:
        await pool.start()
        assert await pool.wait() == 0
    finally:
        await pool.stop()
        sys.modules.pop("burstapp", None)
    assert stats(r, "burst-b")["processed"] == 20
    assert _left(r, "burst-a", "burst-b") == {"burst-a": (0, 0, 0), "burst-b": (0, 0, 0)}
