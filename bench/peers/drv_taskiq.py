"""taskiq + taskiq-redis: ``taskiq worker drv_taskiq:broker --workers P`` (max-async-tasks 100, default).

With ``BENCH_USUAL``: taskiq's default log level (INFO) and a result backend
(``RedisAsyncResultBackend``, results expiring after 3600 s, like fencekit's default
``keep_result``); ``BENCH_CONC`` sets ``--max-async-tasks``.
"""

from __future__ import annotations

import os

import redis.asyncio
from _common import URL, mark, record_latency
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

ASYNC = True
CONC = int(os.environ.get("BENCH_CONC", "100"))
USUAL = os.environ.get("BENCH_USUAL") == "1"
SETTINGS = f"taskiq worker --workers P, RedisStreamBroker (acknowledged), max-async-tasks {CONC}" + (
    ", RedisAsyncResultBackend (result_ex_time 3600), INFO (default)" if USUAL else ", WARNING"
)
KEPT = "the result in taskiq-result:<task id> (RedisAsyncResultBackend), kept result_ex_time (3600 s)"
BULK = None

broker = RedisStreamBroker(URL)
if USUAL:
    broker = broker.with_result_backend(
        RedisAsyncResultBackend(URL, result_ex_time=3600, prefix_str="taskiq-result")
    )
_writer = None


@broker.task
async def noop(i: int, n: int) -> None:
    mark(i, n)


@broker.task
async def lat(t: float) -> None:
    record_latency(t)


@broker.task
async def typical(i: int, n: int) -> dict:
    global _writer
    if _writer is None:
        _writer = redis.asyncio.Redis.from_url(URL)
    await _writer.set(f"bench:out:{i % 1024}", i)
    mark(i, n)
    return {"ok": True, "i": i}


def results_kept(r):
    return sum(1 for _ in r.scan_iter("taskiq-result:*", count=1000))


def worker_argvs(bindir, procs):
    return [
        [f"{bindir}/taskiq", "worker", "drv_taskiq:broker", "--workers", str(procs),
         "--max-async-tasks", str(CONC), "--log-level", "INFO" if USUAL else "WARNING"]
    ]  # fmt: skip


class Producer:
    async def start(self):
        await broker.startup()

    async def one(self, i, n):
        await noop.kiq(i, n)

    async def typical(self, i, n):
        await typical.kiq(i, n)

    async def lat(self, t):
        await lat.kiq(t)

    async def close(self):
        await broker.shutdown()
