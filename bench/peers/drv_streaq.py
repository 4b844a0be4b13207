"""streaQ: ``streaq run drv_streaq:worker --workers P`` (default concurrency 16).

``BENCH_CONC`` sets the concurrency. streaQ's CLI logs at INFO and keeps each task's
result for the task's ``ttl`` (5 minutes by default) whatever the setting.
"""

from __future__ import annotations

import os

from _common import URL, mark, record_latency
from streaq import Worker

ASYNC = True
CONC = int(os.environ.get("BENCH_CONC", "16"))
SETTINGS = (
    f"streaq run --workers P, concurrency={CONC}" + (" (default)" if CONC == 16 else "") + ", INFO (default)"
)
KEPT = "the result in streaq:<queue>:task:results:<id>, kept the task's ttl (5 min, the default)"
BULK = "enqueue_many"

worker = Worker(redis_url=URL, queue_name="bench", concurrency=CONC)


@worker.task()
async def noop(i: int, n: int) -> None:
    mark(i, n)


@worker.task()
async def lat(t: float) -> None:
    record_latency(t)


@worker.task()
async def typical(i: int, n: int) -> dict:
    await worker.redis.set(f"bench:out:{i % 1024}", str(i))
    mark(i, n)
    return {"ok": True, "i": i}


def results_kept(r):
    return sum(1 for _ in r.scan_iter("streaq:bench:task:results:*", count=1000))


def worker_argvs(bindir, procs):
    return [[f"{bindir}/streaq", "run", "drv_streaq:worker", "--workers", str(procs)]]


class Producer:
    async def start(self):
        self.ctx = worker
        await worker.__aenter__()

    async def one(self, i, n):
        await noop.enqueue(i, n)

    async def typical(self, i, n):
        await typical.enqueue(i, n)

    async def bulk(self, items):
        await worker.enqueue_many([noop.enqueue(i, n) for i, n in items])

    async def lat(self, t):
        await lat.enqueue(t)

    async def close(self):
        await worker.__aexit__(None, None, None)
