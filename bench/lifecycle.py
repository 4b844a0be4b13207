"""What a job's life costs on the drain: ``python -m bench.lifecycle --rounds 3 --n 100000``.

In alternating rounds on one private Redis, a pool (``--procs``, concurrency
128) drains N pre-enqueued tasks in each case:

- ``nothing kept``: no-op tasks, ``keep_result=0`` (no task records: the
  baseline, and what ``bench.ab`` compares across checkouts);
- ``records kept``: no-op tasks with the default ``keep_result`` (each task's
  record written at enqueue, its final state at the ack);
- ``records + result``: the same, each job returning a small dict;
- ``timeout on every job``: no-op tasks with ``Task(timeout=60)``, no records.

It prints each figure, the medians and their ratio to ``nothing kept``, and
Redis's memory after each drain (the records left are bounded by
``keep_finished``).
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
    ("nothing kept", {}),
    ("records kept", {"keep_result": 3600.0}),
    ("records + result", {"keep_result": 3600.0, "op": "result"}),
    ("timeout on every job", {"task_timeout": 60.0}),
)


async def main(rounds: int, n: int, procs: int) -> None:
    logdir = Path(tempfile.mkdtemp(prefix="fencekit-lifecycle-"))
    rates: dict[str, list[float]] = {name: [] for name, _ in CASES}
    memory: dict[str, Any] = {}
    with RedisServer() as srv:
        url = srv.url()
        for _ in range(rounds):
            for name, kw in CASES:
                result = await fk.drain(url, logdir, n=n, procs=procs, conc=128, memory=True, **kw)
                if "error" in result:
                    raise SystemExit(f"{name}: {result['error']}")
                rates[name].append(result["rate"])
                memory[name] = result["redis"]["after"]
                print(f"{name}: {result['rate']:,.0f} jobs/s", flush=True)
    base = statistics.median(rates["nothing kept"])
    print(f"\npool --procs {procs}, -c 128, N={n:,}, {rounds} rounds (median jobs/s, ÷ nothing kept)")
    for name, _ in CASES:
        median = statistics.median(rates[name])
        after = memory[name]
        print(
            f"| {name} | {' / '.join(f'{r:,.0f}' for r in rates[name])} | {median:,.0f} | "
            f"{median / base:.2f} | {after['keys']:,} keys, {after['used_memory'] / 1e6:.1f} MB |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.lifecycle", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--procs", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.n, args.procs))
