"""SAQ: ``saq drv_saq.settings --workers P``, concurrency=100 per worker."""

from __future__ import annotations

from _common import URL, mark, record_latency
from saq import Queue

ASYNC = True
SETTINGS = "saq --workers P, concurrency=100"
BULK = None

queue = Queue.from_url(URL)


async def noop(ctx, *, i, n):
    mark(i, n)


async def lat(ctx, *, t):
    record_latency(t)


settings = {"queue": queue, "functions": [noop, lat], "concurrency": 100}


def worker_argvs(bindir, procs):
    return [[f"{bindir}/saq", "drv_saq.settings", "--workers", str(procs), "--quiet"]]


class Producer:
    async def start(self):
        self.q = Queue.from_url(URL)
        await self.q.connect()

    async def one(self, i, n):
        await self.q.enqueue("noop", i=i, n=n)

    async def lat(self, t):
        await self.q.enqueue("lat", t=t)

    async def close(self):
        await self.q.disconnect()
