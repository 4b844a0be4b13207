"""What hooks cost a job: ``python -m bench.hooks_cost [--rounds 3] [--n 100000] [--procs 1]``.

Drains N no-op tasks with a pool of ``--procs`` children, alternately with no
hooks (``bench.apps:noop``), with every job callback set to a no-op
(``bench.apps:hooked``: the events built and the calls made) and traced by
``fencekit.otel`` into an SDK provider without exporter (``bench.apps:traced``:
four spans per job), each round on a fresh private Redis; prints every rate,
the medians and their ratios to no hooks. What "no hooks" costs against the
code before hooks existed is an A/B of two checkouts: ``python -m bench.ab``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from bench import fk
from fencekit.testing import RedisServer

APPS = (
    ("no hooks", "bench.apps:noop"),
    ("no-op hooks", "bench.apps:hooked"),
    ("otel spans", "bench.apps:traced"),
)


async def _drain(url: str, app: str, n: int, procs: int) -> float:
    result = await fk.drain(url, Path(tempfile.mkdtemp()), n=n, procs=procs, conc=128, app=app)
    if "error" in result:
        raise RuntimeError(f"{app}: {result['error']}")
    return float(result["rate"])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.hooks_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--procs", type=int, default=1)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {label: [] for label, _ in APPS}
    for round_no in range(args.rounds):
        for label, app in APPS:
            with RedisServer() as server:
                rate = asyncio.run(_drain(server.url(), app, args.n, args.procs))
            rates[label].append(rate)
            print(f"round {round_no + 1}: {label:12} {rate:10,.0f} jobs/s", flush=True)
    base = statistics.median(rates["no hooks"])
    print(f"\nmedians of {args.rounds} rounds, {args.n:,} no-op tasks, pool --procs {args.procs}:")
    for label, _ in APPS:
        median = statistics.median(rates[label])
        print(f"  {label:12} {median:10,.0f} jobs/s   x{median / base:.3f} of no hooks")


if __name__ == "__main__":
    main()
