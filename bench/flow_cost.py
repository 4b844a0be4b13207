"""What priorities and rate limits cost a job: ``python -m bench.flow_cost``.

Options: ``[--rounds 3] [--n 100000] [--procs 1]``.

Drains N no-op tasks (queue ``bench``) with a pool of ``--procs`` children at
concurrency 128, in alternating rounds, each on a fresh private Redis:

- ``plain``: none of the flow features (the path every job takes by default);
- ``rate limit``: the worker sets ``rate_limit = "1000000/s"`` (``bench.apps:rated``),
  so every claim runs the token bucket in ``ack_claim.lua`` but never waits;
- ``priorities``: the tasks alternate between priorities 0, 3 and -2, so every
  claim reads the priority marker and pops from several lists.

Prints every rate, the medians, their ratios to ``plain`` and the extra µs per
job. The plain path against the code before these features is an A/B of two
checkouts: ``python -m bench.ab``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench import fk
from fencekit.testing import RedisServer

CASES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("plain", {"app": "bench.apps:noop"}),
    ("rate limit", {"app": "bench.apps:rated"}),
    ("priorities", {"app": "bench.apps:noop", "priorities": [0, 3, -2]}),
)


async def _drain(url: str, n: int, procs: int, options: dict[str, Any]) -> float:
    result = await fk.drain(url, Path(tempfile.mkdtemp()), n=n, procs=procs, conc=128, **options)
    if "error" in result:
        raise RuntimeError(f"{options}: {result['error']}")
    return float(result["rate"])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.flow_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--procs", type=int, default=1)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {label: [] for label, _ in CASES}
    for round_no in range(args.rounds):
        for label, options in CASES:
            with RedisServer() as server:
                rate = asyncio.run(_drain(server.url(), args.n, args.procs, options))
            rates[label].append(rate)
            print(f"round {round_no + 1}: {label:11} {rate:10,.0f} jobs/s", flush=True)
    base = statistics.median(rates["plain"])
    print(f"\nmedians of {args.rounds} rounds, {args.n:,} no-op tasks, pool --procs {args.procs}:")
    for label, _ in CASES:
        median = statistics.median(rates[label])
        spread = (max(rates[label]) - min(rates[label])) / median
        extra = (1 / median - 1 / base) * 1e6
        print(
            f"  {label:11} {median:10,.0f} jobs/s   x{median / base:.3f} of plain"
            f"   {extra:+6.1f} µs/job   (spread of rounds {spread:.1%})"
        )


if __name__ == "__main__":
    main()
