"""Recycled children on real pools: ``--max-jobs`` replaces each child after the tasks it claimed
(every task processed once, none failed or retried, new pids take the slots), ``--max-memory``
replaces a child whose resident memory grew past the limit (no task lost), and the admin data
and ``/metrics`` count the replacements by reason."""

from __future__ import annotations

import asyncio
import collections
import textwrap
from pathlib import Path
from typing import Any

import pytest
from tests.fault_helpers import PoolRunner, http_body
from tests.queue_helpers import eventually, stats

from fencekit import Client, Task

APP = textwrap.dedent(
    """
    import asyncio, os, time

    RUNS = os.environ["TEST_RUNS_DIR"]
    HELD = []  # what a greedy task leaves behind in its process

    class Note:
        queue = "recycle"
        operation = "note"

        @classmethod
        async def perform(cls, payload):
            if payload.get("grow_mb"):
                HELD.append("x" * (payload["grow_mb"] << 20))  # written: resident, not just reserved
            if payload.get("block"):
                time.sleep(payload["block"])  # holds the event loop: its ticks come late
            if payload.get("sleep"):
                await asyncio.sleep(payload["sleep"])
            with open(os.path.join(RUNS, f"runs-{os.getpid()}.log"), "a") as out:
                out.write(f"{payload['n']} {os.getpid()}\\n")
            return os.getpid()

    WORKERS = [Note]
    """
)


def done(runs: Path) -> list[tuple[int, int]]:
    """(task number, pid) of every run, from the per-process files."""
    return [
        (int(n), int(pid))
        for path in runs.glob("runs-*.log")
        for n, pid in (line.split() for line in path.read_text().splitlines())
    ]


def metric_lines(pool: PoolRunner, name: str) -> list[str]:
    body = http_body(f"http://127.0.0.1:{pool.web_port}/metrics")
    return [line for line in body.splitlines() if line.startswith(name)]


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "faultapp.py").write_text(APP)
    (tmp_path / "runs").mkdir()
    return tmp_path


@pytest.mark.xdist_group("faults")  # with the other pool campaigns, one at a time
async def test_max_jobs_replaces_each_child_after_its_tasks_and_loses_or_repeats_none(
    app_dir: Path, redis_url: str, r: Any
) -> None:
    pool = PoolRunner(app_dir, redis_url, "--procs", "2", "--concurrency", "20", "--max-jobs", "300")
    try:
        pool.wait_ready()
        async with Client(redis_url=redis_url) as client:
            await client.enqueue_many([Task("recycle", "note", {"n": n}) for n in range(3000)])
            await eventually(lambda: len(done(app_dir / "runs")) >= 3000, timeout=90, what="3,000 tasks")
            await asyncio.sleep(0.5)  # a task run twice would show by now
        lines = metric_lines(pool, "fencekit_pool_child_recycles_total")
    finally:
        assert pool.stop() == 0
    runs = done(app_dir / "runs")
    assert sorted(n for n, _ in runs) == list(range(3000))  # each once
    per_pid = collections.Counter(pid for _, pid in runs)
    assert len(per_pid) >= 4, per_pid  # 3,000 / 300: about ten processes took turns
    assert max(per_pid.values()) <= 300  # none claimed past its budget
    counts = stats(r, "recycle")
    assert counts["processed"] == 3000
    assert counts.get("failed", 0) == 0
    assert counts.get("retried", 0) == 0
    recycled = sum(float(line.split()[-1]) for line in lines if 'reason="max_jobs"' in line)
    assert recycled >= 4
    assert "recycled (max_jobs)" in pool.output()
    assert "ERROR" not in pool.output(), pool.output()[-3000:]


@pytest.mark.xdist_group("faults")
async def test_max_jobs_with_jitter_gives_each_child_a_budget_within_the_jitter(
    app_dir: Path, redis_url: str
) -> None:
    args = ("--procs", "1", "--concurrency", "1", "--max-jobs", "20", "--max-jobs-jitter", "10")
    pool = PoolRunner(app_dir, redis_url, *args)
    try:
        pool.wait_ready()
        async with Client(redis_url=redis_url) as client:
            await client.enqueue_many([Task("recycle", "note", {"n": n}) for n in range(200)])
            await eventually(lambda: len(done(app_dir / "runs")) >= 200, timeout=60, what="200 tasks")
    finally:
        assert pool.stop() == 0
    runs = done(app_dir / "runs")
    assert sorted(n for n, _ in runs) == list(range(200))
    per_pid = collections.Counter(pid for _, pid in runs)
    assert max(per_pid.values()) <= 30, per_pid  # 20 + at most 10
    short = [count for count in per_pid.values() if count < 20]
    assert len(short) <= 1, per_pid  # only the last process may not have used its budget up
    full = [count for count in per_pid.values() if count >= 20]
    assert len(full) >= 6
    assert len(set(full)) > 1, per_pid  # each process drew its own jitter


@pytest.mark.xdist_group("faults")
async def test_max_memory_replaces_a_child_that_grew_and_loses_no_task(
    app_dir: Path, redis_url: str, r: Any
) -> None:
    pool = PoolRunner(app_dir, redis_url, "--procs", "1", "--concurrency", "4", "--max-memory", "200")
    try:
        pool.wait_ready()
        async with Client(redis_url=redis_url) as client:
            # the greedy task, and three that are still running when the child is told to leave
            first = [Task("recycle", "note", {"n": 0, "grow_mb": 300, "sleep": 0.2})]
            first += [Task("recycle", "note", {"n": n, "sleep": 3.0}) for n in range(1, 4)]
            jids = await client.enqueue_many(first)
            await eventually(
                lambda: "recycled (max_memory)" in pool.output(), timeout=30, what="the replacement"
            )
            jids += await client.enqueue_many([Task("recycle", "note", {"n": n}) for n in range(4, 40)])
            await eventually(lambda: len(done(app_dir / "runs")) >= 40, timeout=60, what="40 tasks")
            infos = [await client.job(jid) for jid in jids]
        lines = metric_lines(pool, "fencekit_pool_child_recycles_total")
    finally:
        assert pool.stop() == 0
    runs = done(app_dir / "runs")
    assert sorted(n for n, _ in runs) == list(range(40))  # none lost, none twice
    grown = next(pid for n, pid in runs if n == 0)
    assert {pid for n, pid in runs if n < 4} == {grown}  # the running ones finished there
    assert {pid for n, pid in runs if n >= 4} - {grown}  # and the slot went on in a new process
    assert all(info is not None and info.attempt == 1 for info in infos)  # no attempt spent
    assert stats(r, "recycle").get("retried", 0) == 0
    assert any('reason="max_memory"' in line and not line.endswith(" 0") for line in lines), lines
    assert "above max_memory" in pool.output()


def test_a_bad_max_jobs_is_a_usage_error(app_dir: Path, redis_url: str) -> None:
    pool = PoolRunner(app_dir, redis_url, "--max-jobs", "0")
    assert pool.proc.wait(30) == 2
    pool.stop()
    assert "max_jobs" in pool.output()


def children_now(pool: PoolRunner) -> int:
    lines = metric_lines(pool, "fencekit_pool_children ")
    return int(float(lines[0].split()[-1])) if lines else -1


@pytest.mark.xdist_group("faults")
async def test_autoscaling_grows_to_max_procs_under_a_backlog_and_back_to_procs_losing_nothing(
    app_dir: Path, redis_url: str, r: Any
) -> None:
    """``--procs 1 --max-procs 3`` with the default ``scale_backlog`` (100) and ``scale_cooldown`` (15 s)."""
    pool = PoolRunner(app_dir, redis_url, "--procs", "1", "--max-procs", "3", "--concurrency", "10")
    seen: list[int] = []
    desired: list[int] = []
    try:
        pool.wait_ready()
        assert children_now(pool) == 1
        async with Client(redis_url=redis_url) as client:
            await client.enqueue_many([Task("recycle", "note", {"n": n, "sleep": 0.02}) for n in range(3000)])

            async def all_done() -> bool:
                seen.append(children_now(pool))
                lines = metric_lines(pool, "fencekit_desired_workers ")
                desired.append(int(float(lines[0].split()[-1])) if lines else -1)
                return len(done(app_dir / "runs")) >= 3000

            await eventually(all_done, timeout=120, interval=0.2, what="3,000 tasks")
            await eventually(lambda: children_now(pool) == 1, timeout=40, what="back to one child")
    finally:
        assert pool.stop() == 0
    assert max(seen) == 3, seen
    assert max(desired) == 3, desired
    runs = done(app_dir / "runs")
    assert sorted(n for n, _ in runs) == list(range(3000))  # none lost, none twice
    assert len({pid for _, pid in runs}) >= 3
    counts = stats(r, "recycle")
    assert counts.get("retried", 0) == 0
    assert counts.get("failed", 0) == 0
    output = pool.output()
    assert "autoscaling: 3000 tasks waiting" in output or "growing to 3" in output, output[-3000:]
    assert "shrinking to 1" in output
    assert "ERROR" not in output, output[-3000:]


def test_max_procs_below_procs_is_a_usage_error(app_dir: Path, redis_url: str) -> None:
    pool = PoolRunner(app_dir, redis_url, "--procs", "2", "--max-procs", "1")
    assert pool.proc.wait(30) == 2
    pool.stop()
    assert "max_procs (1) must be at least procs (2)" in pool.output()


@pytest.mark.xdist_group("faults")
async def test_autoscaling_grows_on_lagging_loops_when_the_backlog_alone_would_not(
    app_dir: Path, redis_url: str, r: Any
) -> None:
    """Tasks that hold the child's event loop (0.4 s each): the backlog (30) is far below
    ``--scale-backlog``, but every child's loop runs late past ``--scale-lag`` (0.25 s), so the
    pool grows by one child, shows the lag, and runs each task once."""
    pool = PoolRunner(
        app_dir, redis_url, "--procs", "1", "--max-procs", "2", "--scale-backlog", "100000",
        "--concurrency", "2",
    )  # fmt: skip
    seen: list[int] = []
    lags: list[float] = []
    try:
        pool.wait_ready()
        async with Client(redis_url=redis_url) as client:
            await client.enqueue_many([Task("recycle", "note", {"n": n, "block": 0.4}) for n in range(30)])

            async def all_done() -> bool:
                seen.append(children_now(pool))
                lags.extend(
                    float(line.split()[-1]) for line in metric_lines(pool, "fencekit_pool_child_loop_lag")
                )
                return len(done(app_dir / "runs")) >= 30

            await eventually(all_done, timeout=60, interval=0.2, what="30 tasks")
    finally:
        assert pool.stop() == 0
    assert max(seen) == 2, seen
    assert max(lags) >= 0.25, lags
    runs = done(app_dir / "runs")
    assert sorted(n for n, _ in runs) == list(range(30))
    assert len({pid for _, pid in runs}) == 2  # both children ran some
    assert stats(r, "recycle").get("retried", 0) == 0
    output = pool.output()
    assert "every child's loop" in output, output[-3000:]
    assert "growing to 2" in output, output[-3000:]
    assert "ERROR" not in output, output[-3000:]
