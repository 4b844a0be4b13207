"""What recycling costs, side by side in one run: ``python -m bench.recycle``.

Options: ``[--jobs 40000] [--max-jobs 4000] [--rounds 3] [--procs 1]``.

Starts a private Redis, pre-enqueues ``--jobs`` no-op jobs (``stamp`` of :mod:`bench.apps`: each
appends ``time.time()`` to a file of its process) and drains them with ``python -m fencekit.pool
bench.apps:stamped --procs N -c 128``, ``--rounds`` times each, alternately:

- without ``--max-jobs``;
- with ``--max-jobs`` (so about ``jobs / max-jobs`` replacements per child).

Prints the drain rate of each (jobs/s from the first to the last stamp, the median of the
rounds) and the ratio, then the pause of each replacement: from the last job a process ran to
the first job its successor ran (ms, p50 and max; with ``--procs 1`` that is the slot's gap:
the old child's drain and exit, the supervisor's return of its tasks, the fork, the new child's
connection and first claim).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from bench import apps
from fencekit import SyncClient, Task
from fencekit.testing import RedisServer


def _stamps(directory: Path) -> dict[int, list[float]]:
    return {int(p.name): [float(x) for x in p.read_text().split()] for p in directory.iterdir()}


def _round(url: str, jobs: int, procs: int, max_jobs: int | None) -> tuple[float, list[float]]:
    """(jobs/s, the pauses in ms between one process's last job and the next one's first)."""
    redis.Redis.from_url(url).flushall()
    with SyncClient(url, keep_result=0) as client:
        for start in range(0, jobs, 1000):
            count = min(jobs, start + 1000) - start
            client.enqueue_many([Task(apps.QUEUE, "stamp", {}) for _ in range(count)])
    stamps = Path(tempfile.mkdtemp())
    args = [sys.executable, "-m", "fencekit.pool", "bench.apps:stamped", "--redis-url", url,
            "--procs", str(procs), "--concurrency", "128", "--web-port", "off",
            "--log-level", "WARNING"]  # fmt: skip
    if max_jobs is not None:
        args += ["--max-jobs", str(max_jobs)]
    pool = subprocess.Popen(args, env={**os.environ, "BENCH_STAMPS": str(stamps)})
    try:
        deadline = time.monotonic() + 300
        while sum(len(v) for v in _stamps(stamps).values()) < jobs:
            if time.monotonic() > deadline or pool.poll() is not None:
                raise RuntimeError("the pool did not drain the jobs")
            time.sleep(0.05)
    finally:
        pool.terminate()
        pool.wait(30)
    per = _stamps(stamps)
    first = min(min(v) for v in per.values())
    last = max(max(v) for v in per.values())
    spans = sorted((min(v), max(v)) for v in per.values())
    pauses = [(b[0] - a[1]) * 1000 for a, b in itertools.pairwise(spans)] if procs == 1 else []
    return jobs / (last - first), pauses


def _scale_up(url: str, jobs: int) -> float:
    """Seconds from enqueueing ``jobs`` slow jobs (``stamp`` with a 20-ms sleep, ``-c 10``) into an idle
    ``--procs 1 --max-procs 2`` pool until the second child's first job."""
    redis.Redis.from_url(url).flushall()
    stamps = Path(tempfile.mkdtemp())
    args = [sys.executable, "-m", "fencekit.pool", "bench.apps:stamped", "--redis-url", url,
            "--procs", "1", "--max-procs", "2", "--concurrency", "10", "--web-port", "off",
            "--log-level", "WARNING"]  # fmt: skip
    pool = subprocess.Popen(args, env={**os.environ, "BENCH_STAMPS": str(stamps)})
    try:
        with SyncClient(url, keep_result=0) as client:
            client.enqueue(Task(apps.QUEUE, "stamp", {}))  # the first child serves
            while not list(stamps.iterdir()):
                time.sleep(0.01)
            start = time.time()
            client.enqueue_many([Task(apps.QUEUE, "stamp", {"sleep": 0.02}) for _ in range(jobs)])
        deadline = time.monotonic() + 60
        while len(per := _stamps(stamps)) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the pool did not grow")
            time.sleep(0.005)
        return min(min(v) for v in per.values() if v and min(v) > start) - start
    finally:
        pool.terminate()
        pool.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--max-jobs", type=int, default=4_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--procs", type=int, default=1)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            url = server.url(0)
            growth = [_scale_up(url, 2000) for _ in range(opts.rounds)]
            rates: dict[str, list[float]] = {"no max_jobs": [], f"--max-jobs {opts.max_jobs}": []}
            pauses: list[float] = []
            for _ in range(opts.rounds):
                for case, limit in (("no max_jobs", None), (f"--max-jobs {opts.max_jobs}", opts.max_jobs)):
                    rate, gaps = _round(url, opts.jobs, opts.procs, limit)
                    rates[case].append(rate)
                    pauses += gaps
        finally:
            server.cleanup()
    print(f"drain of {opts.jobs:,} no-op jobs, pool --procs {opts.procs} -c 128, median of {opts.rounds}")
    medians = {case: statistics.median(values) for case, values in rates.items()}
    for case, values in rates.items():
        shown = " / ".join(f"{v:,.0f}" for v in values)
        print(f"  {case:<22} {medians[case]:>10,.0f} jobs/s   rounds: {shown}")
    base, recycled = medians.values()
    print(f"  with / without: x{recycled / base:.2f} (the replacements' pauses included)")
    shown = " / ".join(f"{g * 1000:.0f}" for g in growth)
    grew = statistics.median(growth) * 1000
    print(f"autoscaling: from a backlog of 2,000 to the second child's first job {grew:.0f} ms")
    print(f"  rounds: {shown} (the backlog is read every 1 s)")
    if pauses:
        pauses.sort()
        print(
            f"replacements: {len(pauses)}; pause in the slot, last job of one child to the first of "
            f"the next: p50 {statistics.median(pauses):.1f} ms, max {pauses[-1]:.1f} ms"
        )


if __name__ == "__main__":
    main()
