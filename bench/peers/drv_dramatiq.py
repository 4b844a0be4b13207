# ruff: noqa: E501
"""Dramatiq (RedisBroker): ``dramatiq drv_dramatiq --processes P --threads 8`` (the defaults' thread count)."""

from __future__ import annotations

import dramatiq
from _common import URL, mark, record_latency
from dramatiq.brokers.redis import RedisBroker

ASYNC = False
SETTINGS = "dramatiq --processes P --threads 8, RedisBroker"
BULK = None

broker = RedisBroker(url=URL)
dramatiq.set_broker(broker)


@dramatiq.actor(max_retries=0)
def noop(i, n):
    mark(i, n)


@dramatiq.actor(max_retries=0)
def lat(t):
    record_latency(t)


def worker_argvs(bindir, procs):
    return [[f"{bindir}/dramatiq", "drv_dramatiq", "--processes", str(procs), "--threads", "8"]]


class Producer:
    def start(self):
        pass

    def one(self, i, n):
        noop.send(i, n)

    def lat(self, t):
        lat.send(t)

    def close(self):
        broker.close()
