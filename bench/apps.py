"""Workers the end-to-end benchmarks run (``python -m fencekit.pool bench.apps:APP``).

- ``noop``: every operation of queue ``bench`` (``noop``, ``fenced``, ``fenced_result``,
  ``on_ack``, ``on_ack_result``, ``result``, ``checkpoint_once``, ``sleep``, ``lat``);
- ``many_queues``: a ``noop`` worker on each of the queues ``q000`` .. ``q099``;
  ``many_queues_10``, ``many_queues_100``, ``many_queues_1000``: the same on the first
  10, 100 or 1000 of ``q000`` .. ``q999`` (:func:`queue_names`);
- ``hooked``, ``traced``: ``noop`` with every job hook set to a no-op, or traced by
  ``fencekit.integrations.otel`` into an SDK provider without exporter (:mod:`bench.hooks_cost`);
- ``many_ops_1``, ``many_ops_10``, ``many_ops_100``: 1, 10 or 100 no-op worker classes
  on queue ``bench``, operations ``op000`` .. ``op099`` (:func:`op_names`);
- ``task_fn``, ``sync_task_fn``, ``sync_class``: operation ``noop`` as an async task
  function, a sync one, and a class worker with a plain ``def perform`` (:mod:`bench.tasks_cost`);
- ``long_jobs``: ``noop`` and the long-job probes ``checkpoints``, ``walk`` and ``walk_sync``,
  timed inside the task, their figures returned as its result (:mod:`bench.long_jobs`).

``lat`` records ``time.time()`` at start minus the enqueue time carried in
``params["t"]``, pushed to the Redis list ``bench:lat`` (after the timestamp
is taken, so the push is not part of the figure).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aredis

from fencekit.consume.job import current_job
from fencekit.runtime.app import App

QUEUE = "bench"


def queue_names(count: int) -> list[str]:
    """``q000`` .. : the queues of ``many_queues_<count>`` (at most 1000)."""
    if not 0 < count <= 1000:
        raise ValueError(f"1 to 1000 queues, not {count}")
    return [f"q{i:03d}" for i in range(count)]


def op_names(count: int) -> list[str]:
    """``op000`` .. : the operations of ``many_ops_<count>`` on queue ``bench`` (at most 1000)."""
    if not 0 < count <= 1000:
        raise ValueError(f"1 to 1000 operations, not {count}")
    return [f"op{i:03d}" for i in range(count)]


MANY = queue_names(100)


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


class FencedResult:
    """One fenced write, then a small result (kept in the task's record when it has one)."""

    queue = QUEUE
    operation = "fenced_result"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> dict[str, Any]:
        i = payload.get("i", 0)
        await current_job().set_if_fresh(f"bench:out:{i % 1024}", i)
        return {"ok": True, "i": i}


class OnAck:
    """One fenced write that rides the job's ack: ``current_job().set_on_ack``."""

    queue = QUEUE
    operation = "on_ack"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        current_job().set_on_ack(f"bench:out:{payload.get('i', 0) % 1024}", payload.get("i", 0))


class OnAckResult:
    """A fenced write riding the ack, then a small result (kept in the task's record when it has one)."""

    queue = QUEUE
    operation = "on_ack_result"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> dict[str, Any]:
        i = payload.get("i", 0)
        current_job().set_on_ack(f"bench:out:{i % 1024}", i)
        return {"ok": True, "i": i}


class Result:
    """Returns a small result (kept in the task's record when it has one)."""

    queue = QUEUE
    operation = "result"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "i": payload.get("i", 0)}


class CheckpointOnce:
    """One ``await current_job().checkpoint({"cursor": i})`` per job (a long job's step, on a no-op)."""

    queue = QUEUE
    operation = "checkpoint_once"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        await current_job().checkpoint({"cursor": payload.get("i", 0)})


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


noop = [Noop, Fenced, FencedResult, OnAck, OnAckResult, Result, CheckpointOnce, Sleep, Latency]


def _noop_on(queue: str, operation: str = "noop") -> type:
    return type(f"Noop_{queue}_{operation}", (Noop,), {"queue": queue, "operation": operation})


def many_queues() -> list[type]:
    return [_noop_on(q) for q in MANY]


def _queues_app(count: int) -> Callable[[], list[type]]:
    def app() -> list[type]:
        return [_noop_on(q) for q in queue_names(count)]

    app.__name__ = app.__qualname__ = f"many_queues_{count}"
    app.__doc__ = f"A no-op worker on each of the {count} queues of ``queue_names({count})``."
    return app


def _ops_app(count: int) -> Callable[[], list[type]]:
    def app() -> list[type]:
        return [_noop_on(QUEUE, op) for op in op_names(count)]

    app.__name__ = app.__qualname__ = f"many_ops_{count}"
    app.__doc__ = f"{count} no-op worker classes on queue ``bench``: ``op_names({count})``."
    return app


many_queues_10 = _queues_app(10)
many_queues_12 = _queues_app(12)  # bench.cluster: work spread over the primaries of a cluster
many_queues_100 = _queues_app(100)
many_queues_1000 = _queues_app(1000)
many_ops_1 = _ops_app(1)
many_ops_10 = _ops_app(10)
many_ops_100 = _ops_app(100)


def hooked() -> Any:
    """``noop``'s workers with every job callback of :class:`~fencekit.FenceKitHooks` set (no-ops).

    What the hooks themselves cost a job: the events built and the calls made.
    """
    from fencekit import App, FenceKitHooks

    def nothing(*_: object) -> None:
        return None

    names = [n for n in FenceKitHooks.__dataclass_fields__ if n.startswith("on_")]
    return App(noop, hooks=FenceKitHooks(**dict.fromkeys(names, nothing)))


def traced() -> Any:
    """``noop``'s workers traced by ``fencekit.integrations.otel`` into an SDK provider that keeps nothing.

    The spans are made and ended (the SDK's cost) but go to no exporter.
    """
    from opentelemetry.sdk.trace import TracerProvider

    from fencekit import App
    from fencekit.integrations.otel import otel_hooks

    return App(noop, hooks=otel_hooks(tracer_provider=TracerProvider()))


# Task functions (``@app.task``) and a sync class worker, each the only worker of operation
# ``noop``: ``python -m bench.tasks_cost`` drains them beside the class worker ``Noop``.

task_fn = App()


@task_fn.task(queue=QUEUE, name="noop")
async def noop_task(i: int = 0) -> None:
    """The no-op as an async task function (its params bound back to ``i``)."""


sync_task_fn = App()


@sync_task_fn.task(queue=QUEUE, name="noop")
def noop_sync_task(i: int = 0) -> None:
    """The no-op as a sync task function (run in the consumer's threads)."""


class SyncNoop:
    """The no-op as a class worker with a plain ``def perform`` (run in the consumer's threads)."""

    queue = QUEUE
    operation = "noop"

    @classmethod
    def perform(cls, payload: dict[str, Any]) -> None:
        return None


sync_class = [SyncNoop]


class RatedNoop(Noop):
    """The no-op with a rate limit far above any drain rate: the claim script's bucket, never binding."""

    rate_limit = "1000000/s"


rated = [RatedNoop]


# Long jobs (``python -m bench.long_jobs``): checkpoints and ``iterate`` timed inside the task,
# each figure returned as the task's result.


def _spread(seconds: list[float]) -> dict[str, float]:
    """µs per call: the mean, p50 and p99 of ``seconds`` (one entry per call)."""
    if not seconds:
        return {"mean_us": 0.0, "p50_us": 0.0, "p99_us": 0.0}
    ordered = sorted(seconds)
    last = len(ordered) - 1
    return {
        "mean_us": sum(ordered) / len(ordered) * 1e6,
        "p50_us": ordered[last // 2] * 1e6,
        "p99_us": ordered[round(0.99 * last)] * 1e6,
    }


class Checkpoints:
    """``params["k"]`` calls of ``await current_job().checkpoint(state)`` in a row, each timed:
    ``state`` is ``{"cursor": i}``, with ``params["pad"]`` > 0 also ``"pad": "x" * pad``.
    Returns the µs per call (mean, p50, p99); ``k`` 0 is the job without checkpoints."""

    queue = QUEUE
    operation = "checkpoints"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> dict[str, float]:
        job = current_job()
        k, pad = int(payload.get("k", 0)), int(payload.get("pad", 0))
        filler = "x" * pad
        clock = time.perf_counter
        seconds: list[float] = []
        for i in range(k):
            state: dict[str, Any] = {"cursor": i, "pad": filler} if pad else {"cursor": i}
            started = clock()
            await job.checkpoint(state)
            seconds.append(clock() - started)
        return _spread(seconds)


def _walk_bounds(payload: dict[str, Any]) -> tuple[range, dict[str, Any]]:
    """The items (``range(params["n"])``) and ``iterate``'s options: the worker's pace (the
    defaults, every 100 items or 5 s), or ``params["every"]`` items, unless
    ``params["checkpoints"]`` is false (then ``every`` and ``seconds`` beyond the walk: the
    iterator alone, no checkpoint)."""
    n = int(payload["n"])
    if not payload.get("checkpoints", True):
        return range(n), {"every": n + 1, "seconds": 1e9}
    every = payload.get("every")
    return range(n), {} if every is None else {"every": int(every)}


class Walk:
    """Walks ``range(params["n"])`` of no-op items: ``async for`` over ``current_job().iterate``
    (``params["mode"]`` ``"iterate"``) or a plain ``for`` (``"plain"``); returns the walk's seconds."""

    queue = QUEUE
    operation = "walk"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> dict[str, float]:
        items, pace = _walk_bounds(payload)
        count = 0
        started = time.perf_counter()
        if payload.get("mode") == "iterate":
            async for _ in current_job().iterate(items, **pace):
                count += 1
        else:
            for _ in items:
                count += 1
        return {"seconds": time.perf_counter() - started, "items": count}


class SyncWalk:
    """:class:`Walk` in a sync task (a plain ``def perform``, the consumer's threads):
    ``current_job().iterate_sync`` (``"iterate"``) or a plain ``for`` (``"plain"``)."""

    queue = QUEUE
    operation = "walk_sync"

    @classmethod
    def perform(cls, payload: dict[str, Any]) -> dict[str, float]:
        items, pace = _walk_bounds(payload)
        count = 0
        started = time.perf_counter()
        if payload.get("mode") == "iterate":
            for _ in current_job().iterate_sync(items, **pace):
                count += 1
        else:
            for _ in items:
                count += 1
        return {"seconds": time.perf_counter() - started, "items": count}


long_jobs = [Noop, Checkpoints, Walk, SyncWalk]


# Recycling (``python -m bench.recycle``): each job stamps its process and time.


class Stamp:
    """A no-op job that appends ``"<time.time()>"`` to ``$BENCH_STAMPS/<pid>`` (one file per process)."""

    queue = QUEUE
    operation = "stamp"
    _out: Any = None

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        if payload.get("sleep"):
            await asyncio.sleep(payload["sleep"])
        if cls._out is None or cls._out[0] != os.getpid():
            path = os.path.join(os.environ["BENCH_STAMPS"], str(os.getpid()))
            cls._out = (os.getpid(), open(path, "a", buffering=1))  # noqa: SIM115, ASYNC230 (once per process)
        cls._out[1].write(f"{time.time()}\n")


stamped = [Stamp]
