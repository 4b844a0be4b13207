"""The Redis ceiling: redis-benchmark on the commands of one fencekit job cycle.

A job costs Redis: ``LPUSH`` pending (enqueue), ``RPOP`` pending + ``HSET`` in-flight
(claim, inside ``ack_claim.lua``), ``HDEL`` in-flight (ack); the ``HINCRBY`` of the
counters is per batch, not per job. The jobs/s Redis could sustain is
``1 / sum(1 / rate_i)`` over those commands, measured with 50 clients, unpipelined
(``-P 1``) and pipelined (``-P 128``).
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from typing import Any

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
