"""Concurrent requests of one kind share a round trip: the rule behind batched enqueues and writes.

A web process's request handlers call ``await client.enqueue(...)`` at the
same time; the 128 running jobs of a consumer call ``set_if_fresh`` at the
same time. Each such call goes through a :class:`Coalescer`:

- a call made while none of its kind is in flight is sent at once, alone,
  by its caller (an idle producer or job pays nothing for the batching);
- a call made while one is in flight joins the next *batch*; when the send
  in flight ends, one task sends the whole batch with one ``send`` (one
  script call where the kind allows it, one round trip), while the calls
  made meanwhile gather in the batch after it.

Each caller gets its own result or error: ``send`` returns one outcome per
item, an exception in an item's place fails that caller only; an exception
raised by ``send`` itself (the connection failed) fails every caller of the
batch, as it would have failed each of them alone. Items are sent in the
order they were submitted. A cancelled caller's item is still sent (it may
already be on the wire), as a cancelled single request would have been.

Each batch's send is a task of the coalescer's :class:`~fencekit._aio.scope.TaskScope`
(one per batch: fire-and-forget for the caller that started it, never
unowned): :meth:`Coalescer.aclose` waits for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from fencekit._aio.scope import TaskScope

__all__ = ["Coalescer"]

I = TypeVar("I")  # noqa: E741
R = TypeVar("R")


class Coalescer(Generic[I, R]):
    """Sends at once when idle, else batches (see the module docstring)."""

    def __init__(self, send: Callable[[list[I]], Awaitable[list[R | BaseException]]], name: str) -> None:
        self._send = send
        self._name = name
        self._items: list[I] = []
        self._futures: list[asyncio.Future[R]] = []
        self._busy = False  # a send is in flight (a caller's own, or a batch's)
        self._senders = TaskScope(name)  # the batches' sends

    async def submit(self, item: I) -> R:
        """Send ``item`` (now, or with the next batch) and return its outcome."""
        if self._busy or self._items:
            fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
            self._items.append(item)
            self._futures.append(fut)
            self._kick()
            return await fut
        self._busy = True
        try:
            (outcome,) = await self._send([item])
        finally:
            self._busy = False
            self._kick()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _kick(self) -> None:
        """Start sending the waiting batch unless a send is in flight."""
        if self._items and not self._busy:
            self._busy = True
            self._senders.start(self._run(), name=self._name)

    async def _run(self) -> None:
        items, futures = self._items, self._futures
        self._items, self._futures = [], []
        try:
            outcomes = await self._send(items)
        except BaseException as exc:
            for fut in futures:
                if not fut.done():
                    fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self._busy = False
            self._kick()
        if len(outcomes) != len(futures):  # a bug in ``send``: fail the callers, never leave them waiting
            error = RuntimeError(f"{self._name}: {len(outcomes)} outcomes for {len(futures)} calls")
            outcomes = [error] * len(futures)
        for fut, outcome in zip(futures, outcomes, strict=True):
            if fut.done():
                continue  # its caller was cancelled
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)

    async def aclose(self) -> None:
        """Wait for the batch being sent (a closing client lets its accepted calls finish)."""
        await self._senders.wait()
