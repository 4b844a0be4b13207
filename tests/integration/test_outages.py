"""Redis going away under a running pool (issue 6, item 3).

Redis (with an AOF) stopped for longer than ``--heartbeat-ttl`` and started
again: nothing in the pool dies, running tasks finish and are counted once,
consumers re-register, ``/ready`` follows, and every loop -- consumer,
scheduler, reaper, heartbeat -- logs its failure and its recovery. Redis
restarted empty: the pool recovers and serves new work.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis
from tests.fault_helpers import PoolRunner, ReadyProbe, runs_from_files, write_app

from fencekit import Client, Task
from fencekit.testing import RedisServer, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def aof_redis(tmp_path: Path, server_binary: str) -> Iterator[RedisServer]:
    server = RedisServer(
        tmp_path / "redis", binary=server_binary, appendonly=True, config={"appendfsync": "always"}
    )
    server.start()
    yield server
    server.cleanup()


def enqueue(url: str, tasks: list[Task]) -> list[str]:
    async def go() -> list[str]:
        async with Client(url) as client:
            return await client.enqueue_many(tasks)

    return asyncio.run(go())


def stats(r: redis.Redis, queue: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in r.hgetall(f"fencekit:{{{queue}}}:stats").items()}


def registered(r: redis.Redis, supervisor_pid: int) -> list[dict[str, object]]:
    infos = [orjson.loads(raw) for raw in r.hvals("fencekit:{registry}:consumers")]
    return [i for i in infos if i.get("supervisor") == supervisor_pid or i.get("pid") == supervisor_pid]


def child_pids(r: redis.Redis, supervisor_pid: int) -> set[int]:
    return {
        int(str(i["pid"]))
        for i in registered(r, supervisor_pid)
        if i.get("supervisor") == supervisor_pid and i.get("pid")
    }


def test_redis_stopped_past_the_heartbeat_ttl_and_back(aof_redis: RedisServer, tmp_path: Path) -> None:
    url = aof_redis.url()
    runs_dir = write_app(tmp_path)
    pool = PoolRunner(
        tmp_path, url, "--procs", "2", "--concurrency", "2", "--heartbeat-ttl", "1", "--grace", "1",
    )  # fmt: skip
    r = aof_redis.client(socket_timeout=2)
    probe: ReadyProbe | None = None
    try:
        pool.wait_ready()
        before = child_pids(r, pool.proc.pid)
        assert len(before) == 2
        probe = ReadyProbe(f"http://127.0.0.1:{pool.web_port}/ready")
        probe.start()
        jids = enqueue(url, [Task("hold", "hold", {"seconds": 1.5}) for _ in range(4)])
        wait_until(
            lambda: sum(r.hlen(k) for k in r.scan_iter("fencekit:{hold}:inflight:*")) == 4, 10,
            what="four tasks running",
        )  # fmt: skip
        r.close()
        t_down = time.monotonic()
        aof_redis.stop()  # SIGTERM: the AOF is flushed
        time.sleep(3.0)  # > --heartbeat-ttl 1: every beat in Redis is stale when it returns
        assert set(runs_from_files(runs_dir)) == set(jids), "running tasks did not finish during the outage"
        aof_redis.start()
        t_up = time.monotonic()
        r = aof_redis.client(socket_timeout=2)
        wait_until(lambda: stats(r, "hold").get("processed", 0) == 4, 20, what="acks landed after the outage")
        wait_until(lambda: child_pids(r, pool.proc.pid) == before, 10, what="consumers re-registered")
        wait_until(lambda: pool.ready_status() == 200, 10, what="/ready 200 again")
        enqueue(url, [Task("work", "do", {}) for _ in range(20)])
        wait_until(lambda: stats(r, "work").get("processed", 0) == 20, 20, what="serving new work")
        time.sleep(1.0)
        assert stats(r, "hold")["processed"] == 4  # counted once, even if one ran twice
        assert pool.proc.poll() is None
        out = pool.output()
    finally:
        if probe is not None:
            probe.stop()
        r.close()
        code = pool.stop()
    assert code == 0
    during = probe.statuses_between(t_down + 0.7, t_up - 0.2)
    assert during, "the probe took no samples during the outage"
    assert set(during) == {503}, during
    # nothing died: two children started once, none exited, none restarted
    assert out.count("started child") == 2, out[-3000:]
    assert "killed by" not in out
    assert "exited" not in out.split("pool stopping")[0]
    assert "Traceback" not in out
    duplicated = [j for j, n in runs_from_files(runs_dir).items() if n > 1 and j in jids]
    print(f"\n[outage past TTL] hold tasks run twice (seed consequence 2): {len(duplicated)} of 4")
    # One outage per process, two lines each (the loops' own back-off lines go to DEBUG).
    lines = out.splitlines()
    loud = [line for line in lines if " WARNING " in line or " ERROR " in line]
    print("\n".join(loud))
    starts = [line for line in loud if "Redis is not answering" in line]
    ends = [line for line in loud if "Redis answers again" in line and "after an outage of" in line]
    assert len(starts) == 3, loud  # the supervisor and its two children
    assert len(ends) == 3, loud
    assert not [line for line in loud if "retrying" in line and "quietly" not in line], loud
    assert not [line for line in loud if "not claiming" in line], loud  # the outage says why


def test_redis_restarted_empty_the_pool_recovers(private_redis: RedisServer, tmp_path: Path) -> None:
    url = private_redis.url()
    write_app(tmp_path)
    pool = PoolRunner(tmp_path, url, "--procs", "2", "--concurrency", "2", "--heartbeat-ttl", "1")
    try:
        pool.wait_ready()
        enqueue(url, [Task("work", "do", {}) for _ in range(10)])
        with private_redis.client() as r:
            wait_until(lambda: stats(r, "work").get("processed", 0) == 10, 20, what="first batch")
            pids = child_pids(r, pool.proc.pid)
        private_redis.kill()  # no AOF: everything is gone
        time.sleep(1.5)
        assert pool.ready_status() == 503
        private_redis.start()
        with private_redis.client() as r:
            assert r.dbsize() == 0 or r.exists("fencekit:{work}:stats") == 0
            wait_until(lambda: child_pids(r, pool.proc.pid) == pids, 10, what="consumers re-registered")
            wait_until(lambda: pool.ready_status() == 200, 10, what="/ready 200")
            enqueue(url, [Task("work", "do", {}) for _ in range(10)])
            wait_until(lambda: stats(r, "work").get("processed", 0) == 10, 20, what="new work served")
            assert stats(r, "work").get("enqueued", 0) == 10
        assert pool.proc.poll() is None
    finally:
        code = pool.stop()
    out = pool.output()
    assert code == 0, out[-3000:]
    assert out.count("started child") == 2
    assert "Traceback" not in out
