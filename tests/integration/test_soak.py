"""Soak (issue 6, item 6): ~60 s of steady load through every fault at once.

A pool (2 children) on a Redis with an AOF; a producer enqueuing a mix of
tasks (plain ones, ones that fail and succeed on a retry, ones that fail for
good); malformed entries pushed straight into the queue; a child SIGKILLed
every few seconds; one Redis restart in the middle. At the end every task is
accounted for exactly once (I1, I6 of docs/design.md), and the counts are printed.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import orjson
import pytest
from tests.fault_helpers import PoolRunner, Producer, runs_from_files, write_app

from fencekit import Task
from fencekit.testing import RedisServer, wait_until

pytestmark = pytest.mark.slow

LOAD_SECONDS = 45.0
KILL_EVERY = 7.0
RESTART_AT = 22.0


def mix(n: int) -> Task:
    kind = n % 20
    if kind == 0:
        return Task("work", "flaky", {"fail_times": 1})  # fails once, succeeds on retry
    if kind == 10:
        return Task("work", "flaky", {"fail_times": 9})  # fails on every attempt: failed for good
    return Task("work", "do", {"sleep": 0.003})


def test_soak_every_task_accounted_for_exactly_once(tmp_path: Path, server_binary: str) -> None:
    server = RedisServer(
        tmp_path / "redis", binary=server_binary, appendonly=True, config={"appendfsync": "always"}
    )
    server.start()
    runs_dir = write_app(tmp_path)
    url = server.url()
    pool = PoolRunner(
        tmp_path, url, "--procs", "2", "--concurrency", "4", "--heartbeat-ttl", "2", "--grace", "1",
    )  # fmt: skip
    producer: Producer | None = None
    rng = random.Random(6)
    kills = restarts = malformed = 0
    try:
        pool.wait_ready()
        producer = Producer(url, interval=0.004, mix=mix)
        producer.start()
        started = time.monotonic()
        next_kill = started + KILL_EVERY
        next_bad = started + 0.5
        restarted = False
        while time.monotonic() - started < LOAD_SECONDS:
            now = time.monotonic()
            if now >= next_kill:
                pids = child_pids(server, pool.proc.pid)
                if pids:
                    os.kill(rng.choice(sorted(pids)), signal.SIGKILL)
                    kills += 1
                next_kill = now + KILL_EVERY
            if not restarted and now - started >= RESTART_AT:
                server.restart()  # SIGTERM + start: the AOF brings everything back
                restarts += 1
                restarted = True
            if now >= next_bad:
                try:
                    with server.client(socket_timeout=1) as r:
                        r.lpush("fencekit:{work}:pending", b"\x00not json" + str(malformed).encode())
                        r.lpush("fencekit:{work}:wake", "1")
                    malformed += 1
                except Exception:
                    pass  # Redis is restarting
                next_bad = now + 1.0
            time.sleep(0.05)
        report = producer.stop()
        producer = None
        with server.client(socket_timeout=5) as r:

            def drained() -> bool:
                places = (
                    int(r.llen("fencekit:{work}:pending"))
                    + int(r.zcard("fencekit:{work}:scheduled"))
                    + sum(int(r.hlen(k)) for k in r.scan_iter("fencekit:{work}:inflight:*"))
                )
                return places == 0

            wait_until(drained, 40, interval=0.2, what="every task settled")
            time.sleep(1.0)
            stats = {k.decode(): int(v) for k, v in r.hgetall("fencekit:{work}:stats").items()}
            dead = int(r.zcard("fencekit:{work}:dead:index"))
            incr_effects = {
                k.decode().removeprefix("runs:"): int(v or 0)
                for k, v in zip(r.keys("runs:*"), r.mget(r.keys("runs:*")) if r.keys("runs:*") else [])
            }
            dead_jids = set()
            for key, raw in r.hgetall("fencekit:{work}:dead").items():
                if key.endswith(b":why"):
                    jid = orjson.loads(raw).get("jid")
                    if jid:
                        dead_jids.add(jid)
        assert pool.proc.poll() is None, pool.output()[-3000:]
    finally:
        if producer is not None:
            producer.stop()
        code = pool.stop()
        server.cleanup()
    out = pool.output()
    runs = runs_from_files(runs_dir)
    accepted = report.accepted
    must_fail = {j for j in accepted if report.tasks[j].params.get("fail_times", 0) > 3}
    must_run = set(accepted) - must_fail
    not_run = sorted(j for j in must_run if j not in runs and j not in dead_jids)
    duplicated = sum(1 for j in must_run if runs[j] > 1)
    missing_incr = sum(1 for j in must_run if j in runs and not incr_effects.get(j))
    processed, failed, enqueued = stats.get("processed", 0), stats.get("failed", 0), stats.get("enqueued", 0)
    print(
        f"\n[soak {LOAD_SECONDS:.0f}s] accepted={len(accepted)} refused={len(report.refused)} "
        f"(other errors {len(report.other)}) enqueued(stat)={enqueued} malformed_pushed={malformed} "
        f"processed={processed} failed={failed} dead={dead} retried={stats.get('retried', 0)} "
        f"fenced_out={stats.get('fenced_out', 0)} child_kills={kills} redis_restarts={restarts} "
        f"ran_more_than_once={duplicated} not_run={len(not_run)} incr_effect_missing={missing_incr} "
        f"child_starts={out.count('started child')}"
    )
    assert code == 0, out[-3000:]
    assert kills >= 5
    assert restarts == 1
    assert report.other == [], report.other[:5]
    # I6: every finished task counted exactly once; nothing left anywhere.
    assert processed + failed == enqueued + malformed
    # Every acknowledged task ran (its effect is in the run log) or is a dead letter.
    assert not_run == [], not_run[:10]
    # Retries exhausted: failed for good (seed: "dropped and counted as failed"), never ran to the end.
    assert not [j for j in must_fail if j in runs]
    assert failed >= len(must_fail) + malformed
    assert dead >= malformed
    # Restarted children: one per kill (plus the first two).
    assert out.count("started child") == 2 + kills


def child_pids(server: RedisServer, supervisor: int) -> set[int]:
    try:
        with server.client(socket_timeout=1) as r:
            infos = [orjson.loads(raw) for raw in r.hvals("fencekit:{registry}:consumers")]
    except Exception:
        return set()
    return {int(i["pid"]) for i in infos if i.get("supervisor") == supervisor and i.get("pid")}
