"""The Redis ceiling: redis-benchmark on the commands of one fencekit job cycle.

A job costs Redis: ``LPUSH`` pending (enqueue), ``RPOP`` pending + ``HSET`` in-flight
(claim, inside ``ack_claim.lua``), ``HDEL`` in-flight (ack); the ``HINCRBY`` of the
counters is per batch, not per job. The jobs/s Redis could sustain is
``1 / sum(1 / rate_i)`` over those commands, measured with 50 clients, unpipelined
(``-P 1``) and pipelined (``-P 128``).

``replay`` measures the ceiling of each kind of job the drains run: ``replay.lua``
replays, batch by batch, the commands the drain sends Redis for a batch of jobs
(the claim's ``RPOP`` and in-flight ``HSET``, each ack's ``HDEL``; with a record its
outcome ``HSET``, ``PEXPIRE``, index entry and trim; with a fenced write its checks
and ``SET``, in a script of its own or riding the ack) inside one script, and reads
Redis's own time for it from ``INFO commandstats``: no network, no protocol, no
client. ``1e6 / µs per job`` is the most jobs/s Redis could give that kind of job;
a drain's rate over it is how near the limit the drain runs.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from pathlib import Path
from typing import Any

import redis

ENV = "x" * 160  # an envelope-sized value
CYCLE = [
    ("LPUSH", ["LPUSH", "bench:{c}:pending", ENV]),
    ("RPOP", ["RPOP", "bench:{c}:pending"]),
    ("HSET", ["HSET", "bench:{c}:inflight", "__rand_int__", ENV]),
    ("HDEL", ["HDEL", "bench:{c}:inflight", "__rand_int__"]),
]


def run(
    port: int, n: int = 200_000, pipelines: tuple[int, ...] = (1, 128), timeout: float = 120
) -> dict[str, Any]:
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return {"error": "redis-benchmark not on PATH (Debian: apt-get install redis-tools)"}
    out: dict[str, Any] = {}
    for p in pipelines:
        rates = {}
        for name, argv in CYCLE:
            proc = subprocess.run(
                [
                    binary,
                    "-p",
                    str(port),
                    "-n",
                    str(n),
                    "-c",
                    "50",
                    "-P",
                    str(p),
                    "-r",
                    "1000000",
                    "--csv",
                    *argv,
                ],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            rows = list(csv.reader(io.StringIO(proc.stdout)))
            rates[name] = float(rows[-1][1])
        out[f"P{p}"] = {"commands": rates, "jobs_per_s": 1 / sum(1 / r for r in rates.values())}
    return out


REPLAY = (Path(__file__).parent / "replay.lua").read_text()
# The kinds of job replay knows: the flags of replay.lua's ARGV[3] and the result each record holds.
KINDS: dict[str, tuple[str, str]] = {
    "nothing kept": ("", "null"),
    "record": ("r", "null"),
    "record + result": ("r", '{"ok":true,"i":12345}'),
    "fenced write": ("f", "null"),
    "fenced write + result kept": ("fr", '{"ok":true,"i":12345}'),
    "write on ack": ("a", "null"),
    "write on ack + result kept": ("ar", '{"ok":true,"i":12345}'),
}
# A record as enqueue writes it: a state, the envelope in three parts of at most 64 bytes
# (lua/_env.lua), its retention; about the 360 bytes MEMORY USAGE gives a real one.
RECORD_AT_ENQUEUE = {
    "state": "pending",
    "env": "x" * 64,
    "env1": "x" * 64,
    "env2": "x" * 32,
    "enqueued": "1765000000000",
    "keep": "3600000",
}


def replay(
    port: int,
    n: int = 200_000,
    batch: int = 64,
    keep_finished: int = 10_000,
    kinds: tuple[str, ...] = tuple(KINDS),
) -> dict[str, Any]:
    """Redis's own µs per job for each kind of job, and the jobs/s that makes (see the module doc).

    Runs on a private Redis: it flushes the database before each kind.
    """
    r = redis.Redis(port=port)
    try:
        sha = r.script_load(REPLAY)
        out: dict[str, Any] = {}
        for kind in kinds:
            flags, result = KINDS[kind]
            r.flushdb()
            pipe = r.pipeline(transaction=False)
            for start in range(0, n, 1000):
                pipe.lpush("{bench}:pending", *([ENV] * min(1000, n - start)))
                if "r" in flags:
                    for token in range(start + 1, min(start + 1000, n) + 1):
                        pipe.hset(f"{{bench}}:job:{token}", mapping=RECORD_AT_ENQUEUE)
                pipe.execute()
            record_bytes = r.memory_usage("{bench}:job:1") if "r" in flags else None
            r.config_resetstat()
            done, first = 0, 1
            while done < n:
                got = int(
                    r.evalsha(
                        sha, 4, "{bench}:pending", "{bench}:inflight", "{bench}:finished", "{bench}:fence",
                        batch, first, flags, keep_finished, result,
                    )
                )  # fmt: skip
                if got == 0:
                    break
                done, first = done + got, first + got
            stats = r.info("commandstats")["cmdstat_evalsha"]
            us = float(stats["usec"]) / done
            out[kind] = {"us_per_job": us, "jobs_per_s": 1e6 / us, "jobs": done, "record_bytes": record_bytes}
        return out
    finally:
        r.close()
