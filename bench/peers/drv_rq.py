"""RQ: P ``rq worker --worker-class rq.worker.SimpleWorker`` processes (no fork per job)."""

from __future__ import annotations

import redis
from _common import URL, mark, record_latency
from rq import Queue

ASYNC = False
SETTINGS = "P x rq worker --worker-class rq.worker.SimpleWorker"
BULK = "enqueue_many"


def noop(i, n):
    mark(i, n)


def lat(t):
    record_latency(t)


def worker_argvs(bindir, procs):
    return [
        [f"{bindir}/rq", "worker", "--worker-class", "rq.worker.SimpleWorker", "--url", URL, "-q", "bench"]
        for _ in range(procs)
    ]


class Producer:
    def start(self):
        self.q = Queue("bench", connection=redis.Redis.from_url(URL))

    def one(self, i, n):
        self.q.enqueue("drv_rq.noop", i, n)

    def bulk(self, items):
        self.q.enqueue_many([Queue.prepare_data("drv_rq.noop", (i, n)) for i, n in items])

    def lat(self, t):
        self.q.enqueue("drv_rq.lat", t)

    def close(self):
        pass
