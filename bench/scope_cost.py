"""What starting a job's task through the consumer's task scope costs: ``python -m bench.scope_cost``.

``python -m bench.scope_cost [--rounds 7] [--n 200000] [--loop uvloop|asyncio]``

The consumer starts one task per job (``Consumer._start``). Before task scopes
that was ``loop.create_task`` + its ``_running`` dict entry + its done
callback, on the loop ``asyncio.get_running_loop()`` gave (about 170 ns of
the whole); now it is ``TaskScope.start`` on the loop ``run()`` kept + the
same dict entry, its callback passed as ``then`` and called from the scope's
one done callback, which adds a dict insert and a pop and a Python call
(:mod:`fencekit._aio.scope`). Each round starts N tasks of a coroutine that
returns at once, 128 at a time (a consumer's concurrency in the drains), each
128 left to finish (their callbacks run) before the next, both ways
alternately, on one event loop; prints the CPU ns per task of each way (process
time: a shared machine's other processes count less), the minima and medians,
and their differences. Nothing else of a job is in it: the difference is the
scope's whole cost per job, to set against the drain's µs per job
(``python -m bench.ab`` compares whole drains of two checkouts).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

from fencekit._aio.scope import TaskScope

BATCH = 128
"""Tasks started together, then waited for (the consumer's concurrency in the drains)."""


async def job() -> None:
    return None


def _finished(running: dict[tuple[str, int], Any], key: tuple[str, int], _task: object = None) -> None:
    running.pop(key, None)


async def bare(n: int, batch: int = BATCH) -> float:
    """The consumer's start before scopes: create_task on get_running_loop(), dict entry, done callback."""
    running: dict[tuple[str, int], asyncio.Task[None]] = {}
    token = 0
    started = time.process_time()
    for _ in range(n // batch):
        for _ in range(batch):
            token += 1
            task = asyncio.get_running_loop().create_task(job())
            key = ("q", token)
            running[key] = task
            task.add_done_callback(functools.partial(_finished, running, key))
        while running:
            await asyncio.sleep(0)
    return (time.process_time() - started) / token * 1e9


async def scoped(n: int, batch: int = BATCH) -> float:
    """The same through ``TaskScope.start`` (the consumer's path now: its loop, kept by ``run()``)."""
    loop = asyncio.get_running_loop()
    scope = TaskScope("bench")
    spawn = scope.start
    running: dict[tuple[str, int], asyncio.Task[None]] = {}
    token = 0
    started = time.process_time()
    for _ in range(n // batch):
        for _ in range(batch):
            token += 1
            key = ("q", token)
            running[key] = spawn(job(), then=functools.partial(_finished, running, key), loop=loop)
        while running:
            await asyncio.sleep(0)
    elapsed = (time.process_time() - started) / token * 1e9
    await scope.aclose()
    return elapsed


def new_loop(kind: str) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scope_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = parser.parse_args()
    ways: dict[str, Callable[[int], Any]] = {"create_task": bare, "TaskScope.start": scoped}
    figures: dict[str, list[float]] = {name: [] for name in ways}
    loop = new_loop(args.loop)
    try:
        loop.run_until_complete(bare(10_000))  # warm up
        loop.run_until_complete(scoped(10_000))
        for _ in range(args.rounds):
            for name, way in ways.items():
                figures[name].append(loop.run_until_complete(way(args.n)))
    finally:
        loop.close()
    print(f"| {args.loop}, {args.n:,} tasks per round | ns per task (CPU), each round | min | median |")
    print("|---|---|---|---|")
    for name, values in figures.items():
        each = " / ".join(f"{v:,.0f}" for v in values)
        print(f"| {name} | {each} | {min(values):,.0f} | {statistics.median(values):,.0f} |")
    scoped_, bare_ = figures["TaskScope.start"], figures["create_task"]
    print(
        f"\nthe scope's cost per task: {min(scoped_) - min(bare_):+,.0f} ns (mins), "
        f"{statistics.median(scoped_) - statistics.median(bare_):+,.0f} ns (medians)"
    )


if __name__ == "__main__":
    main()
