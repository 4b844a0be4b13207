"""Celery (redis broker): prefork ``-c P``, prefetch multiplier 64, no results, no gossip/mingle/heartbeat.

Celery's "Optimizing" guide: for many short tasks a large prefetch multiplier.
"""

from __future__ import annotations

from _common import URL, mark, record_latency
from celery import Celery

ASYNC = False
SETTINGS = "celery worker --pool prefork -c P, prefetch multiplier 64, ignore_result, -O fair off"
BULK = None

app = Celery("drv_celery", broker=URL)
app.conf.update(
    worker_prefetch_multiplier=64,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task
def noop(i, n):
    mark(i, n)


@app.task
def lat(t):
    record_latency(t)


def worker_argvs(bindir, procs):
    return [
        [
            f"{bindir}/celery",
            "-A",
            "drv_celery",
            "worker",
            "--pool",
            "prefork",
            "-c",
            str(procs),
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "WARNING",
        ]
    ]


class Producer:
    def start(self):
        pass

    def one(self, i, n):
        noop.delay(i, n)

    def lat(self, t):
        lat.delay(t)

    def close(self):
        pass
