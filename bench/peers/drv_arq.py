"""arq: P ``arq`` worker processes (arq has no multi-process option); max_jobs=100, keep_result=0."""

from __future__ import annotations

from _common import URL, mark, record_latency
from arq import create_pool
from arq.connections import RedisSettings

ASYNC = True
SETTINGS = "arq worker per process, max_jobs=100, keep_result=0, default poll_delay 0.5 s"
BULK = None


async def noop(ctx, i, n):
    mark(i, n)


async def lat(ctx, t):
    record_latency(t)


class WorkerSettings:
    functions = [noop, lat]
    redis_settings = RedisSettings.from_dsn(URL)
    max_jobs = 100
    keep_result = 0


def worker_argvs(bindir, procs):
    return [[f"{bindir}/arq", "drv_arq.WorkerSettings"] for _ in range(procs)]


class Producer:
    async def start(self):
        self.pool = await create_pool(RedisSettings.from_dsn(URL))

    async def one(self, i, n):
        await self.pool.enqueue_job("noop", i, n)

    async def lat(self, t):
        await self.pool.enqueue_job("lat", t)

    async def close(self):
        await self.pool.aclose()
