"""Drains of several cases side by side, in alternating rounds: the shared harness of the cost benches.

``python -m bench.hooks_cost``, ``bench.tasks_cost`` and ``bench.flow_cost``
each name their cases (a label and the options of :func:`bench.fk.drain`:
the app, priorities ...) and call :func:`run`: every round drains N no-op
tasks once per case, each on a fresh private Redis, with a pool of
``--procs`` children at concurrency 128; then it prints the medians, their
ratios to the first case, the extra µs per job and the spread of the rounds
(above the differences it compares, a ratio means nothing). With
``redis_time`` it also reads Redis's ``INFO commandstats`` over each drain
(:func:`bench.fk.drain`) and prints the medians of Redis's µs per job in the
scripts (``EVALSHA``: the claim script mostly) and of the jobs per script call.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import fk
from fencekit.testing import RedisServer

Case = tuple[str, dict[str, Any]]


async def _drain(url: str, n: int, procs: int, options: dict[str, Any]) -> dict[str, Any]:
    result = await fk.drain(url, Path(tempfile.mkdtemp()), n=n, procs=procs, conc=128, **options)
    if "error" in result:
        raise RuntimeError(f"{options}: {result['error']}")
    return result


def run(prog: str, description: str, cases: Sequence[Case], *, redis_time: bool = False) -> None:
    """Parse ``--rounds``, ``--n``, ``--procs``; drain every case each round; print the comparison
    (with ``redis_time``, Redis's µs per job too)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--procs", type=int, default=1)
    args = parser.parse_args()
    width = max(len(label) for label, _ in cases)
    rates: dict[str, list[float]] = {label: [] for label, _ in cases}
    script_us: dict[str, list[float]] = {label: [] for label, _ in cases}
    per_call: dict[str, list[float]] = {label: [] for label, _ in cases}
    extra_options = {"redis_time": True} if redis_time else {}
    for round_no in range(args.rounds):
        for label, options in cases:
            with RedisServer() as server:
                result = asyncio.run(_drain(server.url(), args.n, args.procs, {**options, **extra_options}))
            rate = float(result["rate"])
            rates[label].append(rate)
            line = f"round {round_no + 1}: {label:{width}} {rate:10,.0f} jobs/s"
            if redis_time:
                script_us[label].append(result["script_us_per_job"])
                per_call[label].append(result["jobs_per_script_call"])
                line += (
                    f"   Redis {result['script_us_per_job']:5.2f} µs/job in scripts,"
                    f" {result['jobs_per_script_call']:5.1f} jobs a call"
                )
            print(line, flush=True)
    first = cases[0][0]
    base = statistics.median(rates[first])
    print(f"\nmedians of {args.rounds} rounds, {args.n:,} no-op tasks, pool --procs {args.procs}:")
    for label, _ in cases:
        median = statistics.median(rates[label])
        spread = (max(rates[label]) - min(rates[label])) / median
        extra = (1 / median - 1 / base) * 1e6
        print(
            f"  {label:{width}} {median:10,.0f} jobs/s   x{median / base:.3f} of {first}"
            f"   {extra:+6.1f} µs/job   (spread of rounds {spread:.1%})"
        )
    if redis_time:
        base_script = statistics.median(script_us[first])
        print(f"\nRedis's time per job (INFO commandstats over the drain), medians, x of {first}:")
        for label, _ in cases:
            script = statistics.median(script_us[label])
            print(
                f"  {label:{width}} {script:6.2f} µs/job in scripts (x{script / base_script:.2f}),"
                f" {statistics.median(per_call[label]):6.1f} jobs a script call"
            )
