"""No head of line: a rate-limited operation's tasks without a token are parked per operation in
Redis while the claim goes on with the queue's other tasks, on real pools.

100 tasks of a ``"2/s"`` operation queued before 50 of another operation in the same queue: the
50 run while the limited ones wait for their tokens (before, the whole queue paused for 50 s),
and the limited ones run in their order, at their rate. A parked task whose pool is SIGKILLed
(the consumer that parked it, and would have looked again when its token came) is not lost: the
scheduler of any host wakes the queue when the token is due.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from tests.fault_helpers import PoolRunner, write_app
from tests.queue_helpers import qkey, worker

from fencekit import Client, Task
from fencekit._redis import scripts
from fencekit._redis.clients import aclose_client, async_client
from fencekit._redis.keys import KeySpace
from fencekit._redis.run import arun, run
from fencekit.jobs.flow import flow_specs
from fencekit.jobs.worker import inspect_worker
from fencekit.produce.sync_client import SyncClient
from fencekit.services.backlog import read_backlog
from fencekit.testing import wait_until
from fencekit.web._metrics import _scaling_metrics

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("faults")]

APP = textwrap.dedent(
    """
    import os, time
    from fencekit import current_job

    RUNS = os.environ["TEST_RUNS_DIR"]

    def record(kind, n):
        with open(os.path.join(RUNS, f"hol-{os.getpid()}.log"), "a") as f:
            f.write(f"{kind} {n} {current_job().token.value / 1e6}\\n")

    class Partner:
        queue = "mixed"
        operation = "partner"
        rate_limit = os.environ.get("PARTNER_RATE", "2/s")

        @staticmethod
        async def perform(payload):
            record("partner", payload["n"])

    class Thumb:
        queue = "mixed"
        operation = "thumb"

        @staticmethod
        async def perform(payload):
            record("thumb", payload["n"])

    class Render:
        queue = "docs"
        operation = "render"

        @staticmethod
        async def perform(payload):
            record("render", payload["version"])

    WORKERS = [Partner, Thumb, Render]
    """
)


def runs(directory: Path) -> list[tuple[float, str, int]]:
    """(claim time on Redis's clock, kind, n) of every run, in claim order."""
    out = []
    for path in directory.glob("hol-*.log"):
        for line in path.read_text().splitlines():
            kind, n, at = line.split()
            out.append((float(at), kind, int(n)))
    return sorted(out)


def enqueue(url: str, partners: int, thumbs: int) -> None:
    with SyncClient(url) as client:
        client.enqueue_many([Task("mixed", "partner", {"n": n}) for n in range(partners)])
        client.enqueue_many([Task("mixed", "thumb", {"n": n}) for n in range(thumbs)])


def test_free_tasks_run_past_a_rate_limited_operation_parked_in_front_of_them(
    tmp_path: Path, redis_url: str, r: redis.Redis
) -> None:
    directory = write_app(tmp_path)
    (tmp_path / "holapp.py").write_text(APP)
    enqueue(redis_url, 100, 50)
    pools = [PoolRunner(tmp_path, redis_url, "--procs", "1", app="holapp:WORKERS") for _ in range(2)]
    try:
        for pool in pools:
            pool.wait_ready()
        wait_until(
            lambda: sum(kind == "thumb" for _, kind, _ in runs(directory)) == 50, 30, what="the 50 free tasks"
        )
        done = runs(directory)
        wait_until(
            lambda: sum(kind == "partner" for _, kind, _ in runs(directory)) >= 14, 30, what="partners"
        )
        later = runs(directory)
        parked = r.llen(qkey("mixed", "rparked:partner"))
    finally:
        for pool in pools:
            pool.stop()
    partners_then = [n for _, kind, n in done if kind == "partner"]
    # every free task ran while the limited operation had its burst and a few tokens at 2/s
    # (before: the claim of the queue paused on the first limited task without a token, and
    # the 50 waited for the 100 -- 50 s)
    assert len(partners_then) <= 12, partners_then
    assert sorted(n for _, kind, n in done if kind == "thumb") == list(range(50))
    partners = [(at, n) for at, kind, n in later if kind == "partner"]
    assert [n for _, n in partners] == list(range(len(partners)))  # FIFO within the operation
    # at its rate: between any two claims, no more than the burst (2) and 2 a second
    for i, (at_i, _) in enumerate(partners):
        for j in range(i + 1, len(partners)):
            # + 0.01: the tokens come a little after the claim's TIME (2 ms at most: 0.004 token)
            assert j - i + 1 <= 2 + 2.0 * (partners[j][0] - at_i) + 0.01
    assert parked > 0  # the rest wait parked, not lost: 100 - ran - in flight


def test_a_parked_task_whose_pool_was_sigkilled_runs_on_another_pool(
    tmp_path: Path, redis_url: str, r: redis.Redis
) -> None:
    directory = write_app(tmp_path)
    (tmp_path / "holapp.py").write_text(APP)
    os.environ["PARTNER_RATE"] = "5/s"
    try:
        first = PoolRunner(tmp_path, redis_url, "--procs", "1", "--heartbeat-ttl", "2", app="holapp:WORKERS")
        first.wait_ready()
        enqueue(redis_url, 30, 0)
        wait_until(lambda: len(runs(directory)) >= 8, 30, what="the first runs")
        assert r.llen(qkey("mixed", "rparked:partner")) > 0  # parked by the pool about to die
        os.killpg(first.proc.pid, signal.SIGKILL)
        first.proc.wait(10)
        first.stop()
        time.sleep(1.0)  # the parked operation's token comes due with nobody to look again
        second = PoolRunner(tmp_path, redis_url, "--procs", "1", app="holapp:WORKERS")
        try:
            second.wait_ready()
            wait_until(lambda: {n for _, _, n in runs(directory)} == set(range(30)), 60, what="all 30 ran")
        finally:
            second.stop()
    finally:
        del os.environ["PARTNER_RATE"]
    assert not r.exists(qkey("mixed", "rparked:partner"), qkey("mixed", "rparkedops"))


def test_the_scheduler_wakes_the_queue_when_a_parked_operations_token_is_due(r: redis.Redis) -> None:
    """The sweep every host runs (``schedule.lua``) wakes the consumers of a queue whose parked
    operation's token is due, and only then: nobody else may be left to look again."""
    qk = KeySpace().queue("mixed")
    sweep = scripts.schedule(scheduled=qk.scheduled, pending=qk.pending, wake=qk.wake, limit=10)
    now_ms = int(r.time()[0]) * 1000
    r.zadd(qkey("mixed", "rparkedops"), {"partner": now_ms + 60_000})
    run(r, sweep)
    assert not r.exists(qk.wake)  # not due yet
    r.zadd(qkey("mixed", "rparkedops"), {"partner": now_ms - 1})
    run(r, sweep)
    assert r.exists(qk.wake)


async def test_parked_tasks_are_counted_listed_cancelled_and_purged_as_pending(
    redis_url: str, r: redis.Redis
) -> None:
    """Tasks parked for a token still wait in the queue: its length and listing show them,
    ``cancel`` finds them there, ``purge`` drops them with the parking keys; the scaling signal
    leaves them out (more workers would not run them sooner) and ``/metrics`` shows them per
    operation with the time to the next token."""

    async def perform(payload: dict[str, Any]) -> None:
        return None

    spec = inspect_worker(worker("mixed", "partner", perform, rate_limit="1/s"))
    qk = KeySpace().queue("mixed")
    flow = flow_specs([spec], {"mixed": qk})["mixed"]
    async with Client(redis_url) as client:
        jids = await client.enqueue_many([Task("mixed", "partner", {"n": n}) for n in range(5)])
        ar = async_client(redis_url)
        try:
            reply = await arun(
                ar,
                scripts.ack_claim(
                    pending=qk.pending, inflight=qk.inflight("c1"), token_counter=qk.token_counter,
                    stats=qk.stats, wake=qk.wake, want=5, acks=[], flow=flow,
                ),
            )  # fmt: skip
        finally:
            await aclose_client(ar)
        _, _, _, wait, *claimed = reply
        assert len(claimed) == 1  # the burst of "1/s"
        assert 0 < wait <= 1000  # the next token
        assert r.llen(qkey("mixed", "rparked:partner")) == 4
        queue = client.queue("mixed")
        assert await queue.length() == 4
        read = (await read_backlog(client.redis, client.keys, ["mixed"]))["mixed"]
        assert (read.pending, read.parked, read.total) == (4, 4, 0)  # waiting, none runnable now
        [(operation, count, due_ms)] = read.parked_ops
        assert (operation, count) == ("partner", 4)
        assert 0 < due_ms - read.now_ms <= 1000
        samples = {
            (m.name, tuple(s.labels.values())): s.value
            for m in _scaling_metrics({"mixed": read}, None)
            for s in m.samples
        }
        assert samples[("fencekit_queue_parked", ("mixed",))] == 4
        assert samples[("fencekit_queue_parked_for_token", ("mixed", "partner"))] == 4
        assert 0 < samples[("fencekit_queue_next_token_seconds", ("mixed", "partner"))] <= 1.0
        assert samples[("fencekit_queue_backlog", ("mixed",))] == 0
        assert [t.params["n"] for t in await queue.pending()] == [1, 2, 3, 4]
        assert await client.cancel(jids[2], queue="mixed") is True
        assert [t.params["n"] for t in await queue.pending()] == [1, 3, 4]
        assert await queue.purge() == 3
    assert not r.exists(
        qkey("mixed", "rparked:partner"), qkey("mixed", "rparkedops"), qkey("mixed", "rparkedspec")
    )


def test_ten_enqueues_of_one_debounce_key_run_once_with_the_last_params_over_two_pools(
    tmp_path: Path, redis_url: str
) -> None:
    directory = write_app(tmp_path)
    (tmp_path / "holapp.py").write_text(APP)
    pools = [PoolRunner(tmp_path, redis_url, "--procs", "1", app="holapp:WORKERS") for _ in range(2)]
    try:
        for pool in pools:
            pool.wait_ready()
        with SyncClient(redis_url) as client:
            jids = []
            for version in range(10):  # within 0.5 s
                task = Task("docs", "render", {"version": version}, debounce_key="doc-1", debounce=1.0)
                jids.append(client.enqueue(task))
                time.sleep(0.05)
        wait_until(lambda: any(kind == "render" for _, kind, _ in runs(directory)), 30, what="the render")
        time.sleep(2.0)  # a second run, on either pool, would have come by now
        renders = [n for _, kind, n in runs(directory) if kind == "render"]
    finally:
        for pool in pools:
            pool.stop()
    assert len(set(jids)) == 1
    assert renders == [9]
