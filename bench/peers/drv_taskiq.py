"""taskiq + taskiq-redis: ``taskiq worker drv_taskiq:broker --workers P`` (max-async-tasks 100, default)."""

from __future__ import annotations

from _common import URL, mark, record_latency
from taskiq_redis import RedisStreamBroker

ASYNC = True
SETTINGS = "taskiq worker --workers P, RedisStreamBroker (acknowledged), max-async-tasks 100"
BULK = None

broker = RedisStreamBroker(URL)


@broker.task
async def noop(i: int, n: int) -> None:
    mark(i, n)


@broker.task
async def lat(t: float) -> None:
    record_latency(t)


def worker_argvs(bindir, procs):
    return [
        [f"{bindir}/taskiq", "worker", "drv_taskiq:broker", "--workers", str(procs), "--log-level", "WARNING"]
    ]


class Producer:
    async def start(self):
        await broker.startup()

    async def one(self, i, n):
        await noop.kiq(i, n)

    async def lat(self, t):
        await lat.kiq(t)

    async def close(self):
        await broker.shutdown()
