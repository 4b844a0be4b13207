"""What debounce costs an enqueue: ``python -m bench.debounce_cost``.

Options: ``[--rounds 3] [--n 5000]``.

Debounce acts at enqueue, not at claim, so this times ``Client.enqueue`` (one
awaited call at a time, as a web handler sends them; no task records) of N tasks
per case, in alternating rounds on one private Redis emptied before each case:

- ``plain``: ``Task("bench", "noop", {"i": i})`` onto the pending list;
- ``delay 0.5 s``: the same with ``delay=0.5``, into the scheduled set (where a
  debounced task waits too);
- ``debounce, distinct keys``: ``debounce_key=f"d{i}"``, ``debounce=0.5``: every
  enqueue makes a new debounced task (its key's hash and its place in the
  scheduled set, ``enqueue_debounce.lua``);
- ``debounce, one key``: ``debounce_key="d"``, ``debounce=60``: after the first,
  every enqueue replaces the task still waiting (the window never passes here).

For each: µs per enqueue at the client (wall time / N) and Redis's own µs per
enqueue (``EVALSHA`` of ``INFO commandstats``, reset before the case), the
medians and their ratios to ``plain``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

import redis

from bench.common import ratio_table
from bench.fk import quiet_client
from fencekit import Task
from fencekit.testing import RedisServer

CASES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("plain", {}),
    ("delay 0.5 s", {"delay": 0.5}),
    ("debounce, distinct keys", {"debounce": 0.5, "distinct": True}),
    ("debounce, one key", {"debounce": 60.0, "distinct": False}),
)


def _task(i: int, options: dict[str, Any]) -> Task:
    if "debounce" not in options:
        return Task("bench", "noop", {"i": i})
    key = f"d{i}" if options["distinct"] else "d"
    return Task("bench", "noop", {"i": i}, debounce_key=key, debounce=options["debounce"])


async def _enqueue(url: str, n: int, options: dict[str, Any], reset: Callable[[], object]) -> float:
    """Seconds for ``n`` single enqueues of the case; ``reset`` runs after a warm-up enqueue of the
    same kind (connection made, scripts loaded), just before the timed ones."""
    client = quiet_client(url)
    delay = options.get("delay")
    try:
        await client.enqueue(_task(-1, {**options, "distinct": True}), delay=delay)
        tasks = [_task(i, options) for i in range(n)]
        reset()
        started = time.perf_counter()
        for task in tasks:
            await client.enqueue(task, delay=delay)
        return time.perf_counter() - started
    finally:
        await client.close()


def one_case(r: redis.Redis, url: str, n: int, options: dict[str, Any]) -> tuple[float, float]:
    """(client µs per enqueue, Redis µs per enqueue in ``EVALSHA``), on ``r`` emptied first."""
    r.flushall()
    seconds = asyncio.run(_enqueue(url, n, options, r.config_resetstat))
    usec = float(r.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))
    return seconds / n * 1e6, usec / n


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.debounce_cost", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=5000)
    args = parser.parse_args()
    width = max(len(label) for label, _ in CASES)
    figures: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in CASES}
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url())
        for round_no in range(args.rounds):
            for label, options in CASES:
                wall, script = one_case(r, server.url(), args.n, options)
                figures[label].append((wall, script))
                print(
                    f"round {round_no + 1}: {label:{width}} {wall:7.1f} µs per enqueue,"
                    f" Redis {script:5.2f} µs per enqueue",
                    flush=True,
                )
    print(f"\nmedians of {args.rounds} rounds, {args.n:,} single enqueues a case:")
    ratio_table(figures, ["µs per enqueue", "Redis µs per enqueue"])


if __name__ == "__main__":
    main()
