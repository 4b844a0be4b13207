"""Concurrent enqueues on one ``Client`` share their round trip and their script calls.

A web process's request handlers call ``await client.enqueue(...)`` at the
same time. Each call validates and encodes its own tasks at once (a bad task
raises to its own caller). A call made while no send is in flight is sent
at once, by its caller. A call made while one is in flight joins the next
*batch*; when the send in flight ends, one task sends the batch as one
:class:`~fencekit.queue.enqueue.EnqueuePlan` per delay -- one
``enqueue.lua`` call per queue for all of its callers' plain tasks, one
pipeline, one round trip -- while the calls made meanwhile gather in the
batch after it. Each caller gets the jids of its own tasks, or the error of
the call that carried them (a connection failure fails every caller of the
batch, as it would have failed each of them alone).

Order: tasks of one caller keep their order; callers are sent in the order
they called.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from fencekit.queue.enqueue import Enqueued
from fencekit.queue.task import Task

__all__ = ["EnqueueBatcher"]

Send = Callable[[list[Task], list[bytes], int], Awaitable[list["Enqueued | BaseException"]]]
"""Sends tasks (and their envelopes) with one delay; per task its outcome or the error of its call."""


@dataclass(slots=True)
class _Batch:
    """The callers of one iteration that share a delay."""

    tasks: list[Task] = field(default_factory=list)
    envelopes: list[bytes] = field(default_factory=list)
    callers: list[tuple[int, int, asyncio.Future[list[Enqueued]]]] = field(default_factory=list)


class EnqueueBatcher:
    """Sends at once when idle, else batches (see the module docstring)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._batches: dict[int, _Batch] = {}
        self._busy = False  # a send is in flight
        self._sender: asyncio.Task[None] | None = None

    async def enqueue(self, tasks: list[Task], envelopes: list[bytes], delay_ms: int) -> list[Enqueued]:
        """The outcome of each of ``tasks``, sent now or with the next batch."""
        if self._busy or self._batches:
            return await self._join(tasks, envelopes, delay_ms)
        self._busy = True
        try:
            outcomes = await self._send(tasks, envelopes, delay_ms)
        finally:
            self._busy = False
            self._kick()
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return outcomes  # type: ignore[return-value]

    def _join(
        self, tasks: list[Task], envelopes: list[bytes], delay_ms: int
    ) -> asyncio.Future[list[Enqueued]]:
        batch = self._batches.get(delay_ms)
        if batch is None:
            batch = self._batches[delay_ms] = _Batch()
        fut: asyncio.Future[list[Enqueued]] = asyncio.get_running_loop().create_future()
        start = len(batch.tasks)
        batch.tasks.extend(tasks)
        batch.envelopes.extend(envelopes)
        batch.callers.append((start, len(batch.tasks), fut))
        self._kick()
        return fut

    def _kick(self) -> None:
        """Start sending the waiting batch unless a send is in flight."""
        if self._batches and not self._busy and (self._sender is None or self._sender.done()):
            self._busy = True
            self._sender = asyncio.get_running_loop().create_task(self._run(), name="fencekit-enqueue-batch")

    async def _run(self) -> None:
        try:
            batches, self._batches = self._batches, {}
            for delay_ms, batch in batches.items():
                await self._send_batch(delay_ms, batch)
        finally:
            self._busy = False
            self._kick()

    async def _send_batch(self, delay_ms: int, batch: _Batch) -> None:
        try:
            outcomes = await self._send(batch.tasks, batch.envelopes, delay_ms)
        except BaseException as exc:
            for _, _, fut in batch.callers:
                if not fut.done():
                    fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for start, end, fut in batch.callers:
            if fut.done():
                continue  # its caller was cancelled; its tasks were sent all the same
            mine = outcomes[start:end]
            error = next((o for o in mine if isinstance(o, BaseException)), None)
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(mine)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        """Wait for the batch being sent (a closing client lets its accepted calls finish)."""
        if self._sender is not None and not self._sender.done():
            await asyncio.gather(self._sender, return_exceptions=True)
