"""Batches under real faults: three pools (real forked processes) serve one batch of 3,000
children while one pool is SIGKILLed and restarted and another is SIGSTOPped past its
heartbeat TTL (its deliveries are reaped and run again elsewhere; its stale acks arrive when it
resumes), 30 children failing for good. Every callback run is recorded outside Redis, in an
append-only file per process: ``on_complete`` and ``on_failure`` run exactly once,
``on_success`` never, and the counts are exact."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from tests.fault_helpers import PoolRunner
from tests.queue_helpers import consumer_of

from fencekit import Batch, BatchInfo, Client, Task
from fencekit._redis.keys import KeySpace
from fencekit.jobs.batches import BatchState
from fencekit.testing.cluster import LocalCluster

# with the other fault campaigns, one at a time (on one worker)
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.xdist_group("faults")]

APP = textwrap.dedent(
    """
    import asyncio, os
    from fencekit import current_job

    RUNS = os.environ["TEST_RUNS_DIR"]
    _f = None

    def record(line):
        global _f
        if _f is None or _f[0] != os.getpid():
            _f = (os.getpid(), open(os.path.join(RUNS, f"runs-{os.getpid()}.log"), "a", buffering=1))
        _f[1].write(line + "\\n")

    class Analyse:
        queue = "bgames"
        operation = "analyse"
        retry_count = 2

        @classmethod
        async def perform(cls, payload):
            job = current_job()
            await asyncio.sleep(0.02)
            record(f"child {job.jid} {job.batch_id}")
            if payload.get("corrupt"):
                raise RuntimeError("corrupt game")
            return payload["n"]

    def callback(kind):
        class Callback:
            queue = "breports"
            operation = kind

            @classmethod
            async def perform(cls, payload):
                record(f"callback {kind} {current_job().batch_id}")

        return Callback

    WORKERS = [Analyse, callback("complete"), callback("success"), callback("failure")]
    """
)


def lines(runs: Path) -> list[str]:
    out: list[str] = []
    for path in runs.glob("runs-*.log"):
        out += [line for line in path.read_text().splitlines() if line]
    return out


CORRUPT = set(range(0, 3000, 100))
"""30 of the 3,000 children fail for good (3 runs each)."""


async def start_batch(client: Client) -> Batch:
    tasks = [Task("bgames", "analyse", {"n": n, "corrupt": n in CORRUPT}) for n in range(3000)]
    return await client.batch(
        tasks,
        on_complete=Task("breports", "complete", {}),
        on_success=Task("breports", "success", {}),
        on_failure=Task("breports", "failure", {}),
    )


async def holding_work(url: str, pool: PoolRunner, timeout: float = 20.0) -> None:
    """Until ``pool``'s child has tasks of queue bgames in flight (its consumer's in-flight hash)."""
    r = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            kids = Path(f"/proc/{pool.proc.pid}/task/{pool.proc.pid}/children").read_text().split()
            cid = next((c for k in kids if (c := consumer_of(r, int(k))) is not None), None)
            if cid is not None and r.hlen(f"fencekit:{{bgames}}:inflight:{cid}") > 0:
                return
            await asyncio.sleep(0.005)
        raise AssertionError("the pool to pause never held a task of the batch")
    finally:
        r.close()


async def finish(client: Client, handle: Batch, runs: Path) -> tuple[BatchInfo, dict[str, Any]]:
    """The batch's final info and results, once the callbacks ran and a second run of one (a
    stale finisher, a reconciler) had 2 s to show."""
    info = await handle.wait(timeout=180)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sum(1 for x in lines(runs) if x.startswith("callback")) < 2:
        await asyncio.sleep(0.1)
    await asyncio.sleep(2.0)
    return info, await client.batch_results(handle.bid)


async def test_a_batch_over_three_pools_with_a_killed_and_a_paused_one_fires_each_callback_once(
    tmp_path: Path, redis_url: str
) -> None:
    (tmp_path / "faultapp.py").write_text(APP)
    runs = tmp_path / "runs"
    runs.mkdir()
    args = ("--procs", "1", "--concurrency", "4", "--heartbeat-ttl", "2", "--grace", "1")
    pools = [PoolRunner(tmp_path, redis_url, *args) for _ in range(3)]
    try:
        for pool in pools:
            pool.wait_ready()
        async with Client(redis_url=redis_url) as client:
            handle = await start_batch(client)
            await asyncio.sleep(1.0)
            killed = pools[0]
            os.killpg(killed.proc.pid, signal.SIGKILL)  # supervisor and child, mid-batch
            killed.proc.wait(10)
            killed.stop()  # closes its log
            pools[0] = PoolRunner(tmp_path, redis_url, *args)
            paused = pools[1]
            await holding_work(redis_url, paused)  # so that it has late acks to send
            os.killpg(paused.proc.pid, signal.SIGSTOP)  # past its TTL: reaped, run elsewhere
            await asyncio.sleep(4.0)
            os.killpg(paused.proc.pid, signal.SIGCONT)  # its stale acks arrive now
            info, results = await finish(client, handle, runs)
    finally:
        outputs = []
        for pool in pools:
            pool.stop()
            outputs.append(pool.output())
    recorded = lines(runs)
    callbacks = collections.Counter(x for x in recorded if x.startswith("callback"))
    assert callbacks == {f"callback complete {handle.bid}": 1, f"callback failure {handle.bid}": 1}, (
        callbacks,
        outputs[1][-3000:],
    )
    assert (info.state, info.total, info.succeeded, info.failed, info.cancelled) == (
        BatchState.DONE,
        3000,
        2970,
        30,
        0,
    )
    children = collections.Counter(x.split()[1] for x in recorded if x.startswith("child"))
    assert set(children) == set(handle.jids)  # every child ran (some twice: reaped, or retried)
    assert {x.split()[2] for x in recorded if x.startswith("child")} == {handle.bid}
    assert len(results) == 2970
    assert sorted(results.values()) == sorted(n for n in range(3000) if n not in CORRUPT)
    assert "reaped consumer" in "".join(outputs), "the pause was not long enough to be reaped"
    stats = redis.Redis.from_url(redis_url).hgetall("fencekit:{bgames}:stats")
    assert int(stats.get(b"fenced_out", 0)) > 0  # the paused pool's late acks were refused


async def test_on_a_cluster_a_failover_of_the_batch_s_primary_mid_batch_loses_no_count(
    tmp_path: Path, server_binary: str
) -> None:
    """3 primaries with a replica each; the batch's bookkeeping lives on one of them (its own
    slot), the children on another's; a graceful failover of the batch's primary mid-batch and a
    SIGKILLed pool: the callbacks still run exactly once and the counts are exact."""
    cluster = LocalCluster(tmp_path / "cluster", replicas=1, node_timeout_ms=1000, binary=server_binary)
    cluster.start(timeout=60)
    try:
        url = cluster.url()
        (tmp_path / "faultapp.py").write_text(APP)
        runs = tmp_path / "runs"
        runs.mkdir()
        args = ("--procs", "1", "--concurrency", "4", "--heartbeat-ttl", "2", "--grace", "1")
        pools = [PoolRunner(tmp_path, url, *args) for _ in range(2)]
        try:
            for pool in pools:
                pool.wait_ready()
            async with Client(redis_url=url) as client:
                handle = await start_batch(client)
                await asyncio.sleep(1.0)
                batch_primary = cluster.owner(KeySpace().batch(handle.bid).meta)
                cluster.failover(batch_primary)
                os.killpg(pools[0].proc.pid, signal.SIGKILL)
                pools[0].proc.wait(10)
                pools[0].stop()
                pools[0] = PoolRunner(tmp_path, url, *args)
                info, results = await finish(client, handle, runs)
        finally:
            for pool in pools:
                pool.stop()
    finally:
        cluster.cleanup()
    callbacks = collections.Counter(x for x in lines(runs) if x.startswith("callback"))
    assert callbacks == {f"callback complete {handle.bid}": 1, f"callback failure {handle.bid}": 1}
    assert (info.total, info.succeeded, info.failed, info.cancelled) == (3000, 2970, 30, 0)
    assert len(results) == 2970
