"""Batches against plain jobs, side by side in one run: ``python -m bench.batches``.

Options: ``[--children 10000] [--rounds 3] [--procs 2] [--latency-batches 20]``.

Starts a private Redis and ``python -m fencekit.pool bench.apps:noop --procs N`` on it,
then, ``--rounds`` times each, in turn:

- ``plain (no record)``: ``--children`` no-op jobs enqueued with ``enqueue_many``
  (``keep_result=0``), timed from the first enqueue until the queue's ``processed``
  counter says all ran;
- ``plain (record kept)``: the same with the default record (``keep_result`` 3600 s);
- ``batch children``: the same jobs as the children of one batch (each keeps a record, as
  every batch child does), timed the same way, with an ``on_complete`` callback.

Prints jobs/s per case (the median of the rounds) and the ratio of the batch to each
plain case. Then ``--latency-batches`` batches of 200 children: the delay from the
moment the ``processed`` counter reaches the batch's last child (polled every 0.5 ms)
to the callback's start (the ``lat`` job records ``time.time()`` at its start), p50 and
p99. The callback's delay includes the note mover's pause (5 ms busy, 50 ms idle).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from bench import apps
from fencekit import Client, Task
from fencekit.testing import RedisServer

CHUNK = 1000


def _processed(r: redis.Redis) -> int:
    return int(r.hget(f"fencekit:{{{apps.QUEUE}}}:stats", "processed") or 0)


async def _until(r: redis.Redis, count: int, timeout: float = 300.0) -> float:
    start = time.monotonic()
    while _processed(r) < count:
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{count} processed not within {timeout}s")
        await asyncio.sleep(0.0005)
    return time.time()


async def _drain(url: str, r: redis.Redis, case: str, n: int) -> float:
    tasks = [Task(apps.QUEUE, "noop", {"i": i}) for i in range(n)]
    base = _processed(r)
    keep = 0 if case == "plain (no record)" else 3600
    async with Client(url, keep_result=keep) as client:
        start = time.perf_counter()
        if case == "batch children":
            await client.batch(tasks, on_complete=Task(apps.QUEUE, "noop", {}))
        else:
            for i in range(0, n, CHUNK):
                await client.enqueue_many(tasks[i : i + CHUNK])
        await _until(r, base + n)
        return n / (time.perf_counter() - start)


async def _latency(url: str, r: redis.Redis, batches: int) -> list[float]:
    delays: list[float] = []
    async with Client(url) as client:
        for _ in range(batches):
            r.delete("bench:lat")
            base = _processed(r)
            children = [Task(apps.QUEUE, "noop", {"i": i}) for i in range(200)]
            callback = Task(apps.QUEUE, "lat", {"url": url, "t": 0.0})
            await client.batch(children, on_complete=callback)
            last_ack = await _until(r, base + 200)
            reply = r.blpop(["bench:lat"], timeout=30)
            if reply is None:
                raise TimeoutError("the callback did not run within 30 s")
            delays.append(float(reply[1]) - last_ack)
            await asyncio.sleep(0.2)  # the mover back to its idle pace, as between real batches
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.batches", description=__doc__.split("\n\n")[0])
    parser.add_argument("--children", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--latency-batches", type=int, default=20)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp())
    server = RedisServer(home / "redis")
    server.start()
    url = server.url()
    argv = [sys.executable, "-m", "fencekit.pool", "bench.apps:noop", "--redis-url", url,
            "--procs", str(args.procs), "--web-port", "off", "--log-level", "WARNING"]  # fmt: skip
    pool = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    r = redis.Redis.from_url(url)
    try:
        time.sleep(3.0)
        cases = ("plain (no record)", "plain (record kept)", "batch children")
        rates: dict[str, list[float]] = {c: [] for c in cases}
        asyncio.run(_drain(url, r, "plain (no record)", 2000))  # warm up
        for _ in range(args.rounds):
            for case in cases:
                rates[case].append(asyncio.run(_drain(url, r, case, args.children)))
        medians = {c: statistics.median(v) for c, v in rates.items()}
        print(f"{args.children} jobs, pool --procs {args.procs}, median of {args.rounds} rounds (jobs/s)")
        for case in cases:
            print(
                f"  {case:22} {medians[case]:>10,.0f}   rounds: {', '.join(f'{x:,.0f}' for x in rates[case])}"
            )
        batch = medians["batch children"]
        print(f"  batch / plain (no record)   {batch / medians['plain (no record)']:.2f}")
        print(f"  batch / plain (record kept) {batch / medians['plain (record kept)']:.2f}")
        delays = sorted(asyncio.run(_latency(url, r, args.latency_batches)))
        p99 = delays[min(len(delays) - 1, round(0.99 * (len(delays) - 1)))]
        print(
            f"last child's ack -> callback start, {len(delays)} batches of 200: "
            f"p50 {statistics.median(delays) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms"
        )
    finally:
        pool.terminate()
        pool.wait(30)
        r.close()
        server.cleanup()


if __name__ == "__main__":
    main()
