"""SAQ: ``saq drv_saq.settings --workers P``, concurrency=100 per worker.

With ``BENCH_USUAL``: SAQ's CLI default logging (verbosity 0: ERROR, not ``--quiet``);
``BENCH_CONC`` sets the concurrency. SAQ keeps every job, its result included, for
the job's ``ttl`` (600 s by default) whatever the setting.
"""

from __future__ import annotations

import os

from _common import URL, mark, record_latency
from saq import Queue

ASYNC = True
CONC = int(os.environ.get("BENCH_CONC", "100"))
USUAL = os.environ.get("BENCH_USUAL") == "1"
SETTINGS = f"saq --workers P, concurrency={CONC}" + (", default logging (ERROR)" if USUAL else ", --quiet")
KEPT = "the job with its result in saq:job:<queue>:<key>, kept ttl (600 s, the default)"
BULK = None

queue = Queue.from_url(URL)


async def noop(ctx, *, i, n):
    mark(i, n)


async def lat(ctx, *, t):
    record_latency(t)


async def typical(ctx, *, i, n):
    await ctx["worker"].queue.redis.set(f"bench:out:{i % 1024}", i)
    mark(i, n)
    return {"ok": True, "i": i}


def results_kept(r):
    return sum(1 for _ in r.scan_iter("saq:job:*", count=1000))


settings = {"queue": queue, "functions": [noop, lat, typical], "concurrency": CONC}


def worker_argvs(bindir, procs):
    return [[f"{bindir}/saq", "drv_saq.settings", "--workers", str(procs), *([] if USUAL else ["--quiet"])]]


class Producer:
    async def start(self):
        self.q = Queue.from_url(URL)
        await self.q.connect()

    async def one(self, i, n):
        await self.q.enqueue("noop", i=i, n=n)

    async def typical(self, i, n):
        await self.q.enqueue("typical", i=i, n=n)

    async def lat(self, t):
        await self.q.enqueue("lat", t=t)

    async def close(self):
        await self.q.disconnect()
