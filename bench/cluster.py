"""One Redis node against a 3-primary Redis Cluster, side by side: ``python -m bench.cluster``.

Options: ``[--rounds 3] [--n 60000] [--procs 2] [--single 5000]``.

Each round runs, on a fresh private single Redis and then on a fresh private
``LocalCluster`` of 3 primaries (no replicas), the same three measurements with the
work spread over 12 queues (``q000`` .. ``q011``: 6, 3 and 3 of them on the three
primaries, since a queue is one slot):

- **drain**: ``n`` no-op tasks pre-enqueued, then ``python -m fencekit.pool
  bench.apps:many_queues_12 --procs P -c 128``; jobs/s from the first to the last ack
  (the ``processed`` counters polled in one pipeline);
- **enqueue**: one ``Client.enqueue`` at a time (``--single`` of them, round-robin over
  the queues), then ``enqueue_many`` in batches of 1,000 (one script call per queue per
  batch: on the cluster, a share per node sent at once).

It prints every round, the medians, and the ratio cluster / single node. On one 2-core
machine the cluster's three servers share the same two cores as the pool and the
producer, so the ratio is the cost of cluster routing (slot lookup, a connection per
primary, the pipeline split by node), not scale-out: see bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import apps
from bench.common import spawn, stop
from bench.fk import fill, pool_argv, quiet_client, stats_key
from fencekit import Task
from fencekit._redis.clients import aclose_client, async_client
from fencekit.testing import RedisServer
from fencekit.testing.cluster import LocalCluster

QUEUES = apps.queue_names(12)


async def _processed(r: Any, keys: list[str]) -> int:
    pipe = r.pipeline(transaction=False)  # plain HGETs: redis-py's cluster pipeline splits them by node
    for key in keys:
        pipe.hget(key, "processed")
    return sum(int(x or 0) for x in await pipe.execute())


async def drain(url: str, n: int, procs: int, logdir: Path, timeout: float = 600.0) -> float:
    r = async_client(url)
    client = quiet_client(url)
    keys = [stats_key(q) for q in QUEUES]
    try:
        await r.flushall()
        await fill(client, n, queues=QUEUES)
        proc = spawn(
            pool_argv(url, procs, 128, "bench.apps:many_queues_12"), logdir / f"pool-{time.time_ns()}.log"
        )
        try:
            deadline = time.perf_counter() + timeout
            first = None
            while True:
                count = await _processed(r, keys)
                now = time.perf_counter()
                if count and first is None:
                    first = now
                if count >= n:
                    break
                if now > deadline or proc.poll() is not None:
                    raise RuntimeError(f"only {count}/{n} processed (pool exit {proc.poll()})")
                await asyncio.sleep(0.002)
        finally:
            stop(proc)
        assert first is not None
        return n / (now - first)
    finally:
        await client.close()
        await aclose_client(r)


async def enqueue(url: str, n_single: int, n_bulk: int, batch: int = 1000) -> tuple[float, float]:
    r = async_client(url)
    client = quiet_client(url)
    try:
        await r.flushall()
        for i in range(50):  # warm: connections, scripts, queue registration
            await client.enqueue(Task(QUEUES[i % len(QUEUES)], "noop", {"i": i}))
        t0 = time.perf_counter()
        for i in range(n_single):
            await client.enqueue(Task(QUEUES[i % len(QUEUES)], "noop", {"i": i}))
        single = n_single / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for start in range(0, n_bulk, batch):
            await client.enqueue_many(
                Task(QUEUES[i % len(QUEUES)], "noop", {"i": i}) for i in range(start, start + batch)
            )
        bulk = n_bulk / (time.perf_counter() - t0)
        pending = 0
        for queue in QUEUES:
            pending += int(await r.llen(f"fencekit:{{{queue}}}:pending"))
        assert pending == 50 + n_single + n_bulk, pending
        return single, bulk
    finally:
        await client.close()
        await aclose_client(r)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=60_000)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--single", type=int, default=5_000)
    args = parser.parse_args()
    logdir = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    rows: dict[str, dict[str, list[float]]] = {
        topology: {"drain": [], "enqueue": [], "enqueue_many": []} for topology in ("single", "cluster")
    }
    for round_no in range(args.rounds):
        for topology in ("single", "cluster"):
            server: RedisServer | LocalCluster
            if topology == "single":
                server = RedisServer()
                server.start()
                url = server.url()
            else:
                server = LocalCluster()
                server.start(timeout=60)
                url = server.url()
            try:
                rate = asyncio.run(drain(url, args.n, args.procs, logdir))
                single, bulk = asyncio.run(enqueue(url, args.single, args.n))
            finally:
                server.cleanup()
            for name, value in (("drain", rate), ("enqueue", single), ("enqueue_many", bulk)):
                rows[topology][name].append(value)
            print(
                f"round {round_no + 1}: {topology:7} drain {rate:9,.0f} jobs/s   enqueue {single:8,.0f}/s   "
                f"enqueue_many {bulk:9,.0f}/s",
                flush=True,
            )
    print(
        f"\nmedians of {args.rounds} rounds; {args.n:,} no-op tasks over {len(QUEUES)} queues, "
        f"pool --procs {args.procs} -c 128; {args.single:,} single enqueues:"
    )
    print(f"  {'':14} {'1 node':>12} {'3 primaries':>12} {'cluster / 1 node':>17}")
    for name in ("drain", "enqueue", "enqueue_many"):
        one = statistics.median(rows["single"][name])
        three = statistics.median(rows["cluster"][name])
        print(f"  {name:14} {one:12,.0f} {three:12,.0f} {three / one:16.2f}x")
    print(f"(logs in {logdir})")


if __name__ == "__main__":
    main()
