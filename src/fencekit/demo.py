"""A demo APP that enqueues its own sample work, so a newcomer sees jobs flow.

    python -m fencekit.pool fencekit.demo:app --procs 2

Every few seconds a ``produce`` task enqueues a batch of fake chess-game
analyses (the first one is enqueued by the pool's ``on_pool_startup`` hook, the next ones
by the task itself through ``current_job().enqueue``). Each ``analyse`` task
"thinks" for a few milliseconds, fails now and then to show retries, and
records its result through ``current_job().set_if_fresh`` -- a write that a
stale delivery could not make -- under the queue's keys (``fencekit:{demo}:result:<game>``):
the demo writes nothing outside its prefix. Watch the log, and the admin page at
http://127.0.0.1:3030/admin.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from fencekit.consume.job import current_job
from fencekit.jobs.task import Task
from fencekit.produce.client import Client
from fencekit.runtime.app import App

QUEUE = "demo"
BATCH = 20
EVERY = 5.0


class Produce:
    """Enqueues a batch of analyses, then itself again after ``EVERY`` seconds."""

    queue = QUEUE
    operation = "produce"

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        job = current_job()
        round_ = int(payload.get("round", 0))
        for game in range(BATCH):
            await job.enqueue(
                Task(QUEUE, "analyse", {"game": f"r{round_}-g{game}", "depth": random.randint(8, 20)})
            )
        await job.enqueue(Task(QUEUE, "produce", {"round": round_ + 1}), delay=EVERY)


class Analyse:
    """Pretends to analyse a game; one in ten attempts fails and is retried."""

    queue = QUEUE
    operation = "analyse"
    retry_count = 2

    @classmethod
    async def perform(cls, payload: dict[str, Any]) -> None:
        await asyncio.sleep(payload["depth"] / 1000)
        if random.random() < 0.1:
            raise RuntimeError("engine crashed (demo)")
        job = current_job()
        await job.set_if_fresh(
            f"fencekit:{{{QUEUE}}}:result:{payload['game']}", f"best move e2e4 at depth {payload['depth']}"
        )


async def seed(client: Client) -> None:
    """Pool startup hook (once, in the supervisor): enqueue the first ``produce`` task when none waits."""
    queue = client.queue(QUEUE)
    if not await queue.scheduled() and not await queue.length():
        await client.enqueue(Task(QUEUE, "produce", {"round": 0}))


app = App(workers=[Produce, Analyse], on_pool_startup=[seed])
