"""arq: P ``arq`` worker processes (arq has no multi-process option); max_jobs=100, keep_result=0.

With ``BENCH_USUAL``: arq's default ``keep_result`` (3600 s) and log level (INFO);
``BENCH_CONC`` sets ``max_jobs``.
"""

from __future__ import annotations

import os

from _common import URL, mark, record_latency
from arq import create_pool
from arq.connections import RedisSettings

ASYNC = True
CONC = int(os.environ.get("BENCH_CONC", "100"))
USUAL = os.environ.get("BENCH_USUAL") == "1"
SETTINGS = (
    f"arq worker per process, max_jobs={CONC}, "
    + ("keep_result=3600 (default), INFO (default)" if USUAL else "keep_result=0")
    + ", default poll_delay 0.5 s"
)
KEPT = "the return value pickled in arq:result:<job id>, kept keep_result (3600 s)"
BULK = None


async def noop(ctx, i, n):
    mark(i, n)


async def lat(ctx, t):
    record_latency(t)


async def typical(ctx, i, n):
    await ctx["redis"].set(f"bench:out:{i % 1024}", i)
    mark(i, n)
    return {"ok": True, "i": i}


def results_kept(r):
    return sum(1 for _ in r.scan_iter("arq:result:*", count=1000))


class WorkerSettings:
    functions = [noop, lat, typical]
    redis_settings = RedisSettings.from_dsn(URL)
    max_jobs = CONC
    keep_result = 3600 if USUAL else 0


def worker_argvs(bindir, procs):
    return [[f"{bindir}/arq", "drv_arq.WorkerSettings"] for _ in range(procs)]


class Producer:
    async def start(self):
        self.pool = await create_pool(RedisSettings.from_dsn(URL))

    async def one(self, i, n):
        await self.pool.enqueue_job("noop", i, n)

    async def typical(self, i, n):
        await self.pool.enqueue_job("typical", i, n)

    async def lat(self, t):
        await self.pool.enqueue_job("lat", t)

    async def close(self):
        await self.pool.aclose()
