"""Task functions for the tests of ``@app.task`` (a Server in-process, and a real pool).

Module-level, so a pool (``tests.task_functions_app:app``) imports them.
In-process tests pass the workers to a ``Server`` themselves; the tasks that
write to Redis directly find it in ``TEST_REDIS_URL``. What a run saw is written to Redis
(``seen:*`` keys) so a test in another process can read it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import redis

from fencekit import App, FencedOutError, current_job


async def seed() -> None:
    """In the supervisor: a task function enqueues on the pool's own connection."""
    await greet.options(jid="seeded").enqueue("supervisor")


# Nothing listens on port 1: enqueues work only on the client of the process serving the app
# (a Server, a pool child, the supervisor), or on a client a test attaches.
app = App(redis_url="redis://127.0.0.1:1", on_pool_startup=[seed])


def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ["TEST_REDIS_URL"])


@app.task(queue="tf")
async def greet(name: str, *, greeting: str = "hello") -> str:
    return f"{greeting}, {name}"


@app.task(queue="tf")
def shout(name: str, times: int = 1) -> str:
    """A sync task: it runs in a thread of the consumer."""
    assert threading.current_thread() is not threading.main_thread()
    return (name.upper() + "!") * times


@app.task(queue="tf")
async def gather(first: int, *rest: int, scale: int = 1, **labels: str) -> dict[str, Any]:
    return {"total": (first + sum(rest)) * scale, "labels": labels}


@app.task(queue="tf")
def gather_sync(first: int, *rest: int, scale: int = 1, **labels: str) -> dict[str, Any]:
    return {"total": (first + sum(rest)) * scale, "labels": labels}


@app.task(queue="tf", name="who_sync")
def who() -> dict[str, Any]:
    """current_job() inside a sync task's thread, and where it ran."""
    job = current_job()
    return {"jid": job.jid, "operation": job.operation, "pid": os.getpid(), "thread": threading.get_ident()}


@app.task(queue="tf", retry_count=2)
def flaky_sync(key: str) -> int:
    """Fails on its first two runs (counted in Redis), then returns the attempt."""
    runs = int(_redis().incr(f"seen:{key}"))
    if runs < 3:
        raise RuntimeError(f"run {runs} fails")
    return current_job().attempt


@app.task(queue="tf", retry_count=1, timeout=0.5)
def slow_sync(key: str, seconds: float) -> str:
    """The first run outlives its timeout, then tries a fenced write: refused."""
    job = current_job()
    if job.attempt == 0:
        time.sleep(seconds)
        try:
            job.set_if_fresh_sync(f"effect:{key}", "late")
        except FencedOutError:
            _redis().set(f"seen:{key}:refused", "1")
            raise
        return "late"
    job.set_if_fresh_sync(f"effect:{key}", f"attempt {job.attempt}")
    return "on time"


@app.task(queue="tf", retry=False)
async def slow_async(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "slept"


@app.task(queue="tf")
def fan_out_sync(n: int) -> list[str]:
    """A sync task that enqueues follow-ups with enqueue_sync: through the serving loop's client."""
    return [greet.enqueue_sync(f"n{i}") for i in range(n)]
