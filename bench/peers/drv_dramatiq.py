# ruff: noqa: E501
"""Dramatiq (RedisBroker): ``dramatiq drv_dramatiq --processes P --threads 8`` (the defaults' thread count).

With ``BENCH_USUAL``: Dramatiq's default log level (INFO) and its Results middleware on
a ``RedisBackend`` (the typical actor stores its result for the default ``result_ttl``,
10 minutes); ``BENCH_CONC`` sets ``--threads``.
"""

from __future__ import annotations

import os

import dramatiq
import redis
from _common import URL, mark, record_latency
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

ASYNC = False
CONC = int(os.environ.get("BENCH_CONC", "8"))
USUAL = os.environ.get("BENCH_USUAL") == "1"
SETTINGS = f"dramatiq --processes P --threads {CONC}, RedisBroker" + (
    ", Results(RedisBackend), INFO (default)" if USUAL else ""
)
KEPT = "the result in dramatiq-results:<queue>:<actor>:<message id> (Results middleware), kept result_ttl (10 min, the default)"
BULK = None

broker = RedisBroker(url=URL)
if USUAL:
    broker.add_middleware(Results(backend=RedisBackend(url=URL, use_namespace_prefix_keys=True)))
dramatiq.set_broker(broker)
_writer = redis.Redis.from_url(URL)


@dramatiq.actor(max_retries=0)
def noop(i, n):
    mark(i, n)


@dramatiq.actor(max_retries=0)
def lat(t):
    record_latency(t)


@dramatiq.actor(max_retries=0, store_results=USUAL)
def typical(i, n):
    _writer.set(f"bench:out:{i % 1024}", i)
    mark(i, n)
    return {"ok": True, "i": i}


def results_kept(r):
    return sum(1 for _ in r.scan_iter("dramatiq-results:*", count=1000))


def worker_argvs(bindir, procs):
    return [[f"{bindir}/dramatiq", "drv_dramatiq", "--processes", str(procs), "--threads", str(CONC)]]


class Producer:
    def start(self):
        pass

    def one(self, i, n):
        noop.send(i, n)

    def typical(self, i, n):
        typical.send(i, n)

    def lat(self, t):
        lat.send(t)

    def close(self):
        broker.close()
