"""What the long-job features cost, side by side in one run: ``python -m bench.long_jobs``.

Options: ``[--rounds 5] [--procs 2] [--checkpoints 2000] [--items 100000] [--jobs 50000]``.

Starts a private Redis and ``python -m fencekit.pool bench.apps:long_jobs --procs N
--concurrency 128`` on it (``noop`` and the probes ``checkpoints``, ``walk``, ``walk_sync`` of
:mod:`bench.apps`, which time themselves and return their figures as the task's result), then,
``--rounds`` times, in turn, one job at a time:

1. **a checkpoint**: one job making ``--checkpoints`` calls of
   ``await current_job().checkpoint(state)`` in a row, with ``{"cursor": i}`` and with
   ``{"cursor": i, "pad": "x" * 1000}`` (about 1 KB). Redis's side from ``INFO commandstats``
   (``CONFIG RESETSTAT`` before each job, the ``eval``/``evalsha`` calls and µs after it has
   finished): script calls and µs of Redis time per checkpoint, once the same job without
   checkpoints (``k`` 0: enqueue, claim, ack, result) and the idle pool's own script calls over
   the same time (measured once, before the rounds) are taken off -- the calls should come
   to 1.00, one round trip. Also ``usec_per_call`` of the window as Redis printed it. The
   task's side: µs per call (each call timed with ``perf_counter``; the median over rounds of
   each job's p50, p99 and mean). Beside them, ``iterate`` with ``every=1`` over
   ``--checkpoints`` + 1 items: one checkpoint per item (its position, ``{"iterate": {...}}``,
   and the progress into the task's record), the task's µs per item (the mean; the iterator's
   own part, a fraction of a µs, included).
2. **``iterate``**: one job walking ``--items`` no-op items (``range(N)``) with ``async for
   item in current_job().iterate(...)`` at the worker's defaults (``checkpoint_every`` 100,
   ``checkpoint_seconds`` 5), with ``iterate`` told to checkpoint never (``every`` beyond the
   walk: the iterator alone) and with a plain ``for``; the same in a sync task
   (``iterate_sync``, never and at the defaults; its checkpoints hop from the task's thread to
   the event loop and back). ns per item (the walk timed inside the task), the overhead per
   item against the plain loop of the same kind of task, the script calls per job beyond the
   job's own (its checkpoints: one every 100 items, none after the last, so 999 for 100,000),
   and from the difference between the walks with and without them, the µs of one checkpoint
   inside ``iterate``.
3. **the hot path**: ``--jobs`` no-op jobs (``enqueue_many``, 1,000 a call) drained with
   ``keep_result=0`` and with the default record (3600 s), jobs/s from the first enqueue
   until the queue's ``processed`` counter has them all (as ``bench.batches``; the producer
   enqueues while the pool drains, on the same cores). Jobs that never checkpoint should pay
   nothing for the feature; within one run this only gives the rates.
   The real check is an A/B (``bench.ab``: the drain, pool ``--procs`` 1 and 2, in alternating
   rounds, this ÷ other) against the commit before the feature: ``b12d824`` comes before the
   fenced checkpoints (``b78d74e``), the paused queues (``177df70``) and ``iterate`` and the
   interrupting stop (``9984eac``). Each checkout runs with its own ``.venv``::

       git worktree add /tmp/before b12d824
       (cd /tmp/before && python -m venv .venv && .venv/bin/pip install -e ".[dev,bench]")
       python -m bench.ab /tmp/before --rounds 5 --n 100000 --case pool
       python -m bench.ab /tmp/before --rounds 5 --n 100000 --case pool --keep-result 3600

Prints the medians of the rounds, every round's figure and the ratios; no thresholds.

The task's µs per checkpoint is one round trip, and on a small VM it depends on where the
scheduler puts the child and Redis: on the same vCPU about 20 µs, on two about 80 µs (the
wake-up of the other, idle vCPU; measured by pinning both with ``sched_setaffinity`` on the
2-core machine), so rounds can be bimodal; a loaded machine (no idle vCPU) hides it. Redis's
µs per checkpoint does not move with it: compare those, and the ratios within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from bench import apps
from fencekit import Client, Task
from fencekit.testing import RedisServer

CHUNK = 1000
TIMES = "\N{MULTIPLICATION SIGN}"
PAD = 1000  # the ~1 KB state: {"cursor": i, "pad": "x" * PAD}
CHECKPOINT_CASES = (("small ({'cursor': i})", 0), ("~1 KB (+ 'pad': 'x' * 1000)", PAD))
EVERY_1 = "iterate(every=1), per item"
# (label, operation, mode, checkpoints)
WALK_CASES = (
    ("async: plain for", "walk", "plain", False),
    ("async: iterate, never checkpoints", "walk", "iterate", False),
    ("async: iterate, defaults (100 / 5 s)", "walk", "iterate", True),
    ("sync: plain for", "walk_sync", "plain", False),
    ("sync: iterate_sync, never checkpoints", "walk_sync", "iterate", False),
    ("sync: iterate_sync, defaults", "walk_sync", "iterate", True),
)
DRAIN_CASES = (("keep_result=0 (no record)", 0.0), ("default record", None))


def _scripts(r: redis.Redis) -> tuple[int, int]:
    """Script calls and their µs of Redis time since the last ``CONFIG RESETSTAT``."""
    stats: dict[str, dict[str, Any]] = r.info("commandstats")
    calls = usec = 0
    for name in ("cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro"):
        entry = stats.get(name)
        if entry:
            calls, usec = calls + int(entry["calls"]), usec + int(entry["usec"])
    return calls, usec


class Window:
    """Script calls and Redis µs over one job, less the idle pool's own over the same time."""

    def __init__(self, r: redis.Redis, idle_calls: float, idle_usec: float) -> None:
        self.r, self.idle_calls, self.idle_usec = r, idle_calls, idle_usec

    async def job(self, client: Client, task: Task) -> tuple[Any, float, float, float]:
        """Runs ``task`` alone; returns its result, the script calls and µs beyond the idle
        pool's, and Redis's own ``usec_per_call`` of the window (every script call in it)."""
        self.r.config_resetstat()
        started = time.perf_counter()
        jid = await client.enqueue(task)
        result = await client.result(jid, timeout=300)
        window = time.perf_counter() - started
        calls, usec = _scripts(self.r)
        raw = usec / calls if calls else 0.0
        return result, calls - self.idle_calls * window, usec - self.idle_usec * window, raw


def _idle_rates(r: redis.Redis, seconds: float = 2.0) -> tuple[float, float]:
    """The idle pool's script calls and Redis µs per second (its loops' polls, heartbeats)."""
    r.config_resetstat()
    time.sleep(seconds)
    calls, usec = _scripts(r)
    return calls / seconds, usec / seconds


def _client(url: str, keep: float | None = None) -> Client:
    """A producer that logs nothing per task; ``keep`` None: the default record (``keep_result``)."""
    client = Client(url) if keep is None else Client(url, keep_result=keep)
    client.logger.setLevel(logging.WARNING)  # enqueue logs each task at INFO otherwise
    return client


def _processed(r: redis.Redis) -> int:
    return int(r.hget(f"fencekit:{{{apps.QUEUE}}}:stats", "processed") or 0)


async def _drain(url: str, r: redis.Redis, n: int, keep: float | None) -> float:
    tasks = [Task(apps.QUEUE, "noop", {"i": i}) for i in range(n)]
    base = _processed(r)
    async with _client(url, keep) as client:
        started = time.perf_counter()
        for i in range(0, n, CHUNK):
            await client.enqueue_many(tasks[i : i + CHUNK])
        deadline = time.monotonic() + 300
        while _processed(r) < base + n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{n} jobs not drained within 300 s")
            await asyncio.sleep(0.0005)
        return n / (time.perf_counter() - started)


Figures = dict[str, list[float]]


async def _round(url: str, r: redis.Redis, window: Window, args: argparse.Namespace, out: Figures) -> None:
    def add(key: str, value: float) -> None:
        out.setdefault(key, []).append(value)

    async with _client(url) as client:  # the default record: the probes' figures are their results
        _, base_calls, base_usec, _ = await window.job(client, Task(apps.QUEUE, "checkpoints", {"k": 0}))
        add("base calls", base_calls)
        add("base usec", base_usec)
        k = args.checkpoints
        for label, pad in CHECKPOINT_CASES:
            task = Task(apps.QUEUE, "checkpoints", {"k": k, "pad": pad})
            spread, calls, usec, raw = await window.job(client, task)
            add(f"{label} calls", (calls - base_calls) / k)
            add(f"{label} redis", (usec - base_usec) / k)
            add(f"{label} raw", raw)
            for what in ("p50_us", "p99_us", "mean_us"):
                add(f"{label} {what}", spread[what])
        # iterate with every=1 over k + 1 items: k checkpoints (none after the last item)
        task = Task(apps.QUEUE, "walk", {"n": k + 1, "mode": "iterate", "every": 1})
        walked, calls, usec, raw = await window.job(client, task)
        add(f"{EVERY_1} calls", (calls - base_calls) / k)
        add(f"{EVERY_1} redis", (usec - base_usec) / k)
        add(f"{EVERY_1} raw", raw)
        add(f"{EVERY_1} mean_us", walked["seconds"] / (k + 1) * 1e6)
        n = args.items
        for label, operation, mode, checkpoints in WALK_CASES:
            task = Task(apps.QUEUE, operation, {"n": n, "mode": mode, "checkpoints": checkpoints})
            walked, calls, usec, _ = await window.job(client, task)
            if walked["items"] != n:
                raise RuntimeError(f"{label}: walked {walked['items']} of {n} items")
            add(f"{label} ns", walked["seconds"] / n * 1e9)
            add(f"{label} calls", calls - base_calls)
            add(f"{label} redis", usec - base_usec)
    for label, keep in DRAIN_CASES:
        add(label, await _drain(url, r, args.jobs, keep))


def _rounds(values: list[float], fmt: str) -> str:
    return " / ".join(format(v, fmt) for v in values)


def _report(args: argparse.Namespace, f: Figures, idle: tuple[float, float]) -> None:
    med = {key: statistics.median(values) for key, values in f.items()}
    k, n = args.checkpoints, args.items
    print(
        f"pool --procs {args.procs} -c 128, median of {args.rounds} rounds; idle pool: {idle[0]:.1f} script "
        f"calls/s, {idle[1]:.0f} µs/s of Redis time (taken off each job's window)"
    )
    print(
        f"the job itself (k=0: enqueue, claim, ack, result): {med['base calls']:.1f} script calls, "
        f"{med['base usec']:.0f} µs of Redis time (taken off the cases below)"
    )
    print()
    print(f"1. one checkpoint ({k:,} in a row in one job, one job at a time)")
    head = ("state", "calls/ckpt", "Redis µs/ckpt", "usec_per_call", "task µs p50", "p99", "mean")
    print(f"  {head[0]:30} {head[1]:>10} {head[2]:>14} {head[3]:>14} {head[4]:>12} {head[5]:>8} {head[6]:>8}")
    for label, _ in CHECKPOINT_CASES:
        print(
            f"  {label:30} {med[label + ' calls']:>10.3f} {med[label + ' redis']:>14.2f} "
            f"{med[label + ' raw']:>14.2f} {med[label + ' p50_us']:>12.1f} {med[label + ' p99_us']:>8.1f} "
            f"{med[label + ' mean_us']:>8.1f}"
        )
    print(
        f"  {EVERY_1:30} {med[EVERY_1 + ' calls']:>10.3f} {med[EVERY_1 + ' redis']:>14.2f} "
        f"{med[EVERY_1 + ' raw']:>14.2f} {'-':>12} {'-':>8} {med[EVERY_1 + ' mean_us']:>8.1f}"
    )
    small, big = (label for label, _ in CHECKPOINT_CASES)
    print(
        f"  Redis time ÷ small: ~1 KB {TIMES}{med[big + ' redis'] / med[small + ' redis']:.2f}, iterate's "
        f"checkpoint (its position, the progress into the record) "
        f"{TIMES}{med[EVERY_1 + ' redis'] / med[small + ' redis']:.2f}; the task's µs are one round "
        "trip each, ~20 or ~80 µs by where the child and Redis run (see the docstring): read the rounds"
    )
    for label, _ in CHECKPOINT_CASES:
        print(
            f"  rounds, {label}: Redis µs {_rounds(f[label + ' redis'], '.2f')}; "
            f"task p50 µs {_rounds(f[label + ' p50_us'], '.1f')}; "
            f"mean {_rounds(f[label + ' mean_us'], '.1f')}"
        )
    print(
        f"  rounds, {EVERY_1}: Redis µs {_rounds(f[EVERY_1 + ' redis'], '.2f')}; "
        f"task mean µs {_rounds(f[EVERY_1 + ' mean_us'], '.1f')}"
    )
    print()
    print(f"2. iterate over {n:,} no-op items (one job at a time; ns per item, the walk timed in the task)")
    cols = ("walk", "ns/item", "÷ plain", "+ns/item", "ckpt calls", "Redis µs/job")
    print(f"  {cols[0]:38} {cols[1]:>9} {cols[2]:>8} {cols[3]:>9} {cols[4]:>10} {cols[5]:>12}")
    for label, operation, _, _ in WALK_CASES:
        plain = med[("async" if operation == "walk" else "sync") + ": plain for ns"]
        ns = med[label + " ns"]
        print(
            f"  {label:38} {ns:>9,.1f} {ns / plain:>8.2f} {ns - plain:>+9,.1f} "
            f"{med[label + ' calls']:>10.1f} {med[label + ' redis']:>12,.0f}"
        )
    for kind, never, default in (("async", 1, 2), ("sync", 4, 5)):
        never_label, default_label = WALK_CASES[never][0], WALK_CASES[default][0]
        ckpts = med[default_label + " calls"]
        if ckpts >= 1:  # the defaults' checkpoints: the walk with them less the walk without
            per = (med[default_label + " ns"] - med[never_label + " ns"]) * n / ckpts / 1e3
            print(
                f"  {kind}, defaults - never: {ckpts:.0f} checkpoints per walk, {per:.1f} µs each in the "
                f"task, {med[default_label + ' redis'] / ckpts:.2f} µs each in Redis (with the progress)"
            )
    for label, *_ in WALK_CASES:
        print(f"  rounds, {label}: ns/item {_rounds(f[label + ' ns'], ',.1f')}")
    print()
    print(f"3. hot path: drain of {args.jobs:,} no-op jobs that never checkpoint (jobs/s)")
    for label, _ in DRAIN_CASES:
        print(f"  {label:28} {med[label]:>10,.0f}   rounds: {_rounds(f[label], ',.0f')}")
    none, record = (label for label, _ in DRAIN_CASES)
    print(f"  default record ÷ no record  {TIMES}{med[record] / med[none]:.2f}")
    print(
        "  (against the code before the feature: git worktree add /tmp/before b12d824, then "
        "python -m bench.ab /tmp/before --rounds 5 --n 100000 --case pool)"
    )


def main() -> None:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(prog="python -m bench.long_jobs", description=doc.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--checkpoints", type=int, default=2000, help="checkpoints in a row in one job")
    parser.add_argument("--items", type=int, default=100_000, help="items each iterate job walks")
    parser.add_argument("--jobs", type=int, default=50_000, help="no-op jobs per hot-path drain")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp())
    server = RedisServer(home / "redis")
    server.start()
    url = server.url()
    argv = [sys.executable, "-m", "fencekit.pool", "bench.apps:long_jobs", "--redis-url", url,
            "--procs", str(args.procs), "--concurrency", "128", "--web-port", "off",
            "--log-level", "WARNING"]  # fmt: skip
    pool = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    r = redis.Redis.from_url(url)
    try:
        time.sleep(3.0)
        asyncio.run(_drain(url, r, 2000, 0.0))  # warm up
        idle = _idle_rates(r)
        window = Window(r, *idle)
        figures: Figures = {}
        for _ in range(args.rounds):
            asyncio.run(_round(url, r, window, args, figures))
        _report(args, figures, idle)
    finally:
        pool.terminate()
        pool.wait(30)
        r.close()
        server.cleanup()


if __name__ == "__main__":
    main()
