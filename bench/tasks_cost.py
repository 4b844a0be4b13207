"""What a task function costs a job: ``python -m bench.tasks_cost [--rounds 3] [--n 100000] [--procs 1]``.

Drains N no-op tasks (operation ``noop`` of queue ``bench``, params
``{"i": ...}``) with a pool of ``--procs`` children at concurrency 128,
alternately served by the class worker (``bench.apps:noop``), an async task
function (``bench.apps:task_fn``: the params bound back to the signature),
a sync task function (``bench.apps:sync_task_fn``: run in the consumer's
threads, ``sync_concurrency`` 16) and a class worker with a plain ``def
perform`` (``bench.apps:sync_class``), each round on a fresh private Redis;
prints every rate, the medians, their ratios to the class worker and the
extra µs per job. What the class worker's path costs against the code
before task functions existed is an A/B of two checkouts: ``python -m bench.ab``.
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
    ("class worker", "bench.apps:noop"),
    ("async task fn", "bench.apps:task_fn"),
    ("sync task fn", "bench.apps:sync_task_fn"),
    ("sync class", "bench.apps:sync_class"),
)


async def _drain(url: str, app: str, n: int, procs: int) -> float:
    result = await fk.drain(url, Path(tempfile.mkdtemp()), n=n, procs=procs, conc=128, app=app)
    if "error" in result:
        raise RuntimeError(f"{app}: {result['error']}")
    return float(result["rate"])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tasks_cost", description=__doc__.splitlines()[0])
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
            print(f"round {round_no + 1}: {label:14} {rate:10,.0f} jobs/s", flush=True)
    base = statistics.median(rates["class worker"])
    print(f"\nmedians of {args.rounds} rounds, {args.n:,} no-op tasks, pool --procs {args.procs}:")
    for label, _ in APPS:
        median = statistics.median(rates[label])
        extra = (1 / median - 1 / base) * 1e6
        print(
            f"  {label:14} {median:10,.0f} jobs/s   x{median / base:.3f} of the class worker"
            f"   {extra:+6.1f} µs/job"
        )


if __name__ == "__main__":
    main()
