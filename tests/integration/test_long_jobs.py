"""Long jobs on a real Redis: ``iterate`` resumes where the last checkpoint left it (a sequence
and a cursor-based source), a stop interrupts a checkpointing job at its next step and sends it
back without counting an attempt ("interrupted" in its runs, ``on_interrupted``), a job that
swallows ``Interrupted`` is logged, and a pool SIGKILLed then SIGTERMed (a deploy) finishes 20
jobs of 200 items with no item done more than twice and no attempt spent by the SIGTERM."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest
from tests.fault_helpers import PoolRunner
from tests.queue_helpers import eventually, new_server, running, stats, worker

from fencekit import Client, FenceKitHooks, Interrupted, JobEvent, Task, current_job
from fencekit._redis.keys import KeySpace


async def test_iterate_over_a_sequence_resumes_after_the_last_checkpoint(redis_url: str) -> None:
    seen: list[tuple[int, int]] = []  # (attempt, item)

    async def walk(payload: dict[str, Any]) -> int:
        job = current_job()
        async for item in job.iterate(list(range(10))):
            seen.append((job.attempt, item))
            if item == 6 and job.attempt == 0:
                raise RuntimeError("crash while item 6 is in hand")
        return len(seen)

    server = new_server(redis_url, worker("iter", "walk", walk, checkpoint_every=1))
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("iter", "walk", {}))
        assert await client.result(jid, timeout=20) == 11
        info = await client.job(jid)
    assert [item for _, item in seen] == [0, 1, 2, 3, 4, 5, 6, 6, 7, 8, 9]  # only 6 twice
    assert info is not None
    assert info.progress is not None
    assert info.progress.message == "9 of 10"  # the last checkpoint's (before the last item)


async def test_iterate_over_a_cursor_based_source_resumes_inside_a_page(redis_url: str) -> None:
    pages = {None: (["a", "b", "c"], "p2"), "p2": (["d", "e", "f"], "p3"), "p3": (["g"], None)}
    fetched: list[Any] = []
    seen: list[str] = []

    async def fetch(cursor: Any) -> tuple[list[str], Any]:
        fetched.append(cursor)
        return pages[cursor]

    async def walk(payload: dict[str, Any]) -> None:
        job = current_job()
        async for item in job.iterate(fetch, every=1):
            seen.append(item)
            if item == "e" and job.attempt == 0:
                raise RuntimeError("crash in the middle of page p2")

    server = new_server(redis_url, worker("pages", "walk", walk))
    async with Client(redis_url=redis_url) as client, running(server):
        jid = await client.enqueue(Task("pages", "walk", {}))
        await client.result(jid, timeout=20)
    assert seen == ["a", "b", "c", "d", "e", "e", "f", "g"]
    assert fetched == [None, "p2", "p2", "p3"]  # the retry fetched p2 again and skipped d


async def test_a_stop_interrupts_a_checkpointing_job_which_resumes_without_an_attempt(redis_url: str) -> None:
    seen: list[tuple[int, int]] = []
    interrupted: list[JobEvent] = []

    async def walk(payload: dict[str, Any]) -> int:
        job = current_job()
        async for item in job.iterate(list(range(60)), every=1):
            seen.append((job.attempt, item))
            await asyncio.sleep(0.02)
        return job.attempt

    hooks = FenceKitHooks(on_interrupted=interrupted.append)
    first = new_server(redis_url, worker("drain", "walk", walk), grace=60.0, hooks=hooks)
    async with Client(redis_url=redis_url) as client:
        jid = await client.enqueue(Task("drain", "walk", {}))
        async with running(first):
            await eventually(lambda: len(seen) >= 10, what="ten items done")
        # running() stopped it: far inside its 60-s grace, at the next step
        assert len(seen) < 60
        stopped_after = len(seen)
        second = new_server(redis_url, worker("drain", "walk", walk))
        async with running(second):
            assert await client.result(jid, timeout=30) == 0  # the same attempt: none was spent
        info = await client.job(jid)
    items = [item for _, item in seen]
    assert items == list(range(60))  # nothing redone: the stop checkpointed the item in hand
    assert len(seen) > stopped_after
    assert [e.jid for e in interrupted] == [jid]
    assert info is not None
    assert [run.outcome for run in info.runs] == ["interrupted", "done"]
    assert info.attempt == 1  # one attempt: the interrupted run and its resumption share it


async def test_a_job_that_swallows_interrupted_is_logged(redis_url: str) -> None:
    async def stubborn(payload: dict[str, Any]) -> str:
        job = current_job()
        for n in range(100):
            try:
                await job.checkpoint({"n": n})
            except Interrupted:
                return "swallowed"  # it should have let it propagate
            await asyncio.sleep(0.02)
        return "done"

    server = new_server(redis_url, worker("stubborn", "go", stubborn), grace=30.0)
    async with Client(redis_url=redis_url) as client:
        jid = await client.enqueue(Task("stubborn", "go", {}))
        async with running(server):
            await eventually(lambda: client.job(jid), what="it started")
            await asyncio.sleep(0.2)
        messages = server.logger.list_handler.messages()  # type: ignore[attr-defined]
    assert any("caught fencekit.Interrupted" in m and jid in m for m in messages), messages


APP = textwrap.dedent(
    """
    import asyncio, os
    from fencekit import current_job

    RUNS = os.environ["TEST_RUNS_DIR"]

    class Analyse:
        queue = "long"
        operation = "analyse"
        checkpoint_every = 1
        retry_count = 5

        @classmethod
        async def perform(cls, payload):
            job = current_job()
            out = open(os.path.join(RUNS, f"runs-{os.getpid()}.log"), "a", buffering=1)
            async for item in job.iterate(list(range(200))):
                await asyncio.sleep(0.02)
                out.write(f"{job.jid} {item} {job.attempt}\\n")
            return job.attempt

    WORKERS = [Analyse]
    """
)


def resumed(runs: Path) -> set[str]:
    """The jobs seen running their second attempt (after the SIGKILL's reap)."""
    lines = [line.split() for path in runs.glob("runs-*.log") for line in path.read_text().splitlines()]
    return {jid for jid, _, attempt in lines if attempt == "1"}


@pytest.mark.xdist_group("faults")  # with the other fault campaigns, one at a time
async def test_a_pool_sigkilled_then_sigtermed_finishes_every_job_redoing_at_most_the_item_in_hand(
    tmp_path: Path, redis_url: str
) -> None:
    (tmp_path / "faultapp.py").write_text(APP)
    runs = tmp_path / "runs"
    runs.mkdir()
    args = ("--procs", "2", "--concurrency", "10", "--heartbeat-ttl", "2", "--grace", "30")
    pool = PoolRunner(tmp_path, redis_url, *args)
    pool.wait_ready()
    try:
        async with Client(redis_url=redis_url) as client:
            jids = await client.enqueue_many([Task("long", "analyse", {"n": n}) for n in range(20)])
            await asyncio.sleep(1.0)
            os.killpg(pool.proc.pid, signal.SIGKILL)  # a crash: the items in hand are lost
            pool.proc.wait(10)
            pool.stop()
            pool = PoolRunner(tmp_path, redis_url, *args)
            pool.wait_ready()
            # the reaper returns the crashed deliveries; they run again (attempt 1) for a while
            await eventually(lambda: len(resumed(runs)) >= 10, timeout=30, what="the crashed jobs resumed")
            await asyncio.sleep(0.5)
            pool.proc.send_signal(signal.SIGTERM)  # a deploy: interrupted at the next step
            assert pool.proc.wait(25) == 0  # far inside the 30-s grace
            pool.stop()
            pool = PoolRunner(tmp_path, redis_url, *args)
            pool.wait_ready()
            results = [await client.result(jid, timeout=120) for jid in jids]
            infos = [await client.job(jid) for jid in jids]
    finally:
        pool.stop()
    lines = [line.split() for path in runs.glob("runs-*.log") for line in path.read_text().splitlines()]
    done = collections.Counter((jid, int(item)) for jid, item, _ in lines)
    for jid in jids:
        assert {item for (j, item) in done if j == jid} == set(range(200)), jid
    assert max(done.values()) <= 2  # at most the item in hand at the SIGKILL, once more
    per_job = collections.Counter(j for (j, _), n in done.items() if n == 2)
    assert max(per_job.values(), default=0) <= 1  # one item redone per job at most
    assert max(results) <= 1  # the SIGKILL counted an attempt; the SIGTERM none
    interrupted = [
        run for info in infos if info is not None for run in info.runs if run.outcome == "interrupted"
    ]
    assert interrupted, "the SIGTERM interrupted no job: the jobs ended before it"


STALE_APP = textwrap.dedent(
    """
    import asyncio, os
    from fencekit import FencedOutError, current_job

    RUNS = os.environ["TEST_RUNS_DIR"]

    class Analyse:
        queue = "stale"
        operation = "analyse"
        retry_count = 5

        @classmethod
        async def perform(cls, payload):
            job = current_job()
            pool = os.getpgrp()  # the pool's process group: which pool ran an item
            out = open(os.path.join(RUNS, f"runs-{os.getpid()}.log"), "a", buffering=1)
            start = job.state["next"] if job.state else 0
            for item in range(start, 300):
                await asyncio.sleep(0.05)
                out.write(f"{pool} {item} done\\n")
                try:
                    await job.checkpoint({"next": item + 1, "pool": pool})
                except FencedOutError:
                    out.write(f"{pool} {item} refused\\n")
                    raise
            return pool

    WORKERS = [Analyse]
    """
)


def run_lines(runs: Path) -> list[tuple[int, int, str]]:
    """(pool, item, what) of every line the jobs wrote, in no particular order across files."""
    return [
        (int(pool), int(item), what)
        for path in runs.glob("runs-*.log")
        for pool, item, what in (line.split() for line in path.read_text().splitlines())
    ]


@pytest.mark.xdist_group("faults")  # with the other fault campaigns, one at a time
async def test_a_sigstopped_pool_s_stale_checkpoint_is_refused_and_the_newer_state_stands(
    tmp_path: Path, redis_url: str, r: Any
) -> None:
    """Pool A is SIGSTOPped past its lease while a job checkpoints each item; pool B's reaper
    returns the job and B resumes it from A's last checkpoint. A, resumed (SIGCONT), finishes the
    item it had in hand and its checkpoint is refused: it stops there, the state B wrote stands."""
    (tmp_path / "faultapp.py").write_text(STALE_APP)
    runs = tmp_path / "runs"
    runs.mkdir()
    args = ("--procs", "1", "--heartbeat-ttl", "2", "--grace", "10")
    first = PoolRunner(tmp_path, redis_url, *args)
    second: PoolRunner | None = None
    key = KeySpace().queue("stale").state
    try:
        first.wait_ready()
        a = first.proc.pid
        async with Client(redis_url=redis_url) as client:
            jid = await client.enqueue(Task("stale", "analyse", {}))
            await eventually(lambda: sum(p == a for p, _, _ in run_lines(runs)) >= 10, what="A did 10 items")
            os.killpg(a, signal.SIGSTOP)
            stopped_at = json.loads(r.get(key(jid)))["next"]
            second = PoolRunner(tmp_path, redis_url, *args)
            second.wait_ready()
            b = second.proc.pid
            # B's reaper returns A's delivery after the lease; B resumes where A checkpointed
            await eventually(
                lambda: sum(p == b for p, _, _ in run_lines(runs)) >= 20, timeout=30, what="B did 20 items"
            )
            os.killpg(a, signal.SIGCONT)
            await eventually(
                lambda: any(p == a and w == "refused" for p, _, w in run_lines(runs)),
                timeout=15,
                what="A's stale checkpoint refused",
            )
            state = json.loads(r.get(key(jid)))
            assert await client.result(jid, timeout=60) == b
    finally:
        first.stop()
        if second is not None:
            second.stop()
    lines = run_lines(runs)
    by_a = sorted(item for p, item, w in lines if p == a and w == "done")
    by_b = sorted(item for p, item, w in lines if p == b and w == "done")
    assert by_b[0] == stopped_at  # B resumed at A's last checkpoint, not at 0
    assert by_a == list(range(stopped_at + 1))  # A's last item: the one in hand at the SIGSTOP
    assert by_b == list(range(stopped_at, 300))  # so that one item ran twice, and no other
    assert [item for p, item, w in lines if w == "refused"] == [stopped_at]
    assert state["pool"] == b  # A wrote nothing over it
    assert state["next"] >= stopped_at + 20
    assert int(stats(r, "stale").get("fenced_out", 0)) >= 1
