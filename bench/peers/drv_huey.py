# ruff: noqa: E501
"""Huey (RedisHuey, blocking): ``huey_consumer drv_huey.huey -k process -w P`` (the README's multi-process form)."""

from __future__ import annotations

from _common import URL, mark, record_latency
from huey import RedisHuey

ASYNC = False
SETTINGS = "huey_consumer -k process -w P -n, RedisHuey(blocking=True); no acknowledgement"
BULK = None

huey = RedisHuey("bench", url=URL, blocking=True, results=False)


@huey.task()
def noop(i, n):
    mark(i, n)


@huey.task()
def lat(t):
    record_latency(t)


def worker_argvs(bindir, procs):
    return [[f"{bindir}/huey_consumer", "drv_huey.huey", "-k", "process", "-w", str(procs), "-n", "-q"]]


class Producer:
    def start(self):
        pass

    def one(self, i, n):
        noop(i, n)

    def lat(self, t):
        lat(t)

    def close(self):
        pass
