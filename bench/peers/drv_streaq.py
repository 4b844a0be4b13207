"""streaQ: ``streaq run drv_streaq:worker --workers P`` (default concurrency 16)."""

from __future__ import annotations

from _common import URL, mark, record_latency
from streaq import Worker

ASYNC = True
SETTINGS = "streaq run --workers P, concurrency=16 (default)"
BULK = "enqueue_many"

worker = Worker(redis_url=URL, queue_name="bench")


@worker.task()
async def noop(i: int, n: int) -> None:
    mark(i, n)


@worker.task()
async def lat(t: float) -> None:
    record_latency(t)


def worker_argvs(bindir, procs):
    return [[f"{bindir}/streaq", "run", "drv_streaq:worker", "--workers", str(procs)]]


class Producer:
    async def start(self):
        self.ctx = worker
        await worker.__aenter__()

    async def one(self, i, n):
        await noop.enqueue(i, n)

    async def bulk(self, items):
        await worker.enqueue_many([noop.enqueue(i, n) for i, n in items])

    async def lat(self, t):
        await lat.enqueue(t)

    async def close(self):
        await worker.__aexit__(None, None, None)
