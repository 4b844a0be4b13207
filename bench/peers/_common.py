"""Shared by the peer drivers; runs inside each peer's own virtualenv (stdlib + redis-py only).

Jobs call :func:`mark` (job ``0`` records when it started, job ``n-1`` when it
ran: the drain is timed between the two, so a peer pays no extra Redis call
per job) and :func:`record_latency` (start time minus the enqueue time the job
carries, pushed to ``bench:lat``).
"""

from __future__ import annotations

import os
import time

import redis

URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
_client: redis.Redis | None = None


def client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(URL)
    return _client


def mark(i: int, n: int) -> None:
    if i == 0:
        client().set("bench:mark:first", repr(time.time()))
    if i == n - 1:
        client().set("bench:mark:last", repr(time.time()))


def record_latency(t: float) -> None:
    started = time.time()
    client().rpush("bench:lat", repr(started - t))
