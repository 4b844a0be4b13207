"""Drains of several cases side by side, in alternating rounds: the shared harness of the cost benches.

``python -m bench.hooks_cost``, ``bench.tasks_cost`` and ``bench.flow_cost``
each name their cases (a label and the options of :func:`bench.fk.drain`:
the app, priorities ...) and call :func:`run`: every round drains N no-op
tasks once per case, each on a fresh private Redis, with a pool of
``--procs`` children at concurrency 128; then it prints the medians, their
ratios to the first case, the extra µs per job and the spread of the rounds
(above the differences it compares, a ratio means nothing).
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


async def _drain(url: str, n: int, procs: int, options: dict[str, Any]) -> float:
    result = await fk.drain(url, Path(tempfile.mkdtemp()), n=n, procs=procs, conc=128, **options)
    if "error" in result:
        raise RuntimeError(f"{options}: {result['error']}")
    return float(result["rate"])


def run(prog: str, description: str, cases: Sequence[Case]) -> None:
    """Parse ``--rounds``, ``--n``, ``--procs``; drain every case each round; print the comparison."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--procs", type=int, default=1)
    args = parser.parse_args()
    width = max(len(label) for label, _ in cases)
    rates: dict[str, list[float]] = {label: [] for label, _ in cases}
    for round_no in range(args.rounds):
        for label, options in cases:
            with RedisServer() as server:
                rate = asyncio.run(_drain(server.url(), args.n, args.procs, options))
            rates[label].append(rate)
            print(f"round {round_no + 1}: {label:{width}} {rate:10,.0f} jobs/s", flush=True)
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
