"""Workers the end-to-end benchmarks run (``python -m fencekit.pool bench.apps:APP``).

- ``noop``: every operation of queue ``bench`` (``noop``, ``fenced``, ``result``, ``sleep``, ``lat``);
- ``many_queues``: a ``noop`` worker on each of the queues ``q000`` .. ``q099``.

``lat`` records ``time.time()`` at start minus the enqueue time carried in
``params["t"]``, pushed to the Redis list ``bench:lat`` (after the timestamp
is taken, so the push is not part of the figure).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as aredis

from fencekit.queue.job import current_job

QUEUE = "bench"
MANY = [f"q{i:03d}" for i in range(100)]


class Noop:
    queue = QUEUE
    operation = "noop"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        return None


class Fenced:
    """One fenced write per job: ``current_job().set_if_fresh``."""

    queue = QUEUE
    operation = "fenced"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        await current_job().set_if_fresh(f"bench:out:{payload.get('i', 0) % 1024}", payload.get("i", 0))


class Result:
    """Returns a small result (kept in the task's record when it has one)."""

    queue = QUEUE
    operation = "result"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "i": payload.get("i", 0)}


class Sleep:
    """I/O-bound: ``await asyncio.sleep(0.001)``."""

    queue = QUEUE
    operation = "sleep"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        await asyncio.sleep(0.001)


class Latency:
    queue = QUEUE
    operation = "lat"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        started = time.time()
        await _redis(payload["url"]).rpush("bench:lat", repr(started - payload["t"]))


_clients: dict[str, aredis.Redis] = {}


def _redis(url: str) -> aredis.Redis:
    """One connection pool per Redis URL per process, made on first use (the job's own I/O)."""
    client = _clients.get(url)
    if client is None:
        client = _clients[url] = aredis.Redis.from_url(url)
    return client


noop = [Noop, Fenced, Result, Sleep, Latency]


def _noop_on(queue: str) -> type:
    return type(f"Noop_{queue}", (Noop,), {"queue": queue, "operation": "noop"})


def many_queues() -> list[type]:
    return [_noop_on(q) for q in MANY]
