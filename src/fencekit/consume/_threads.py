"""Synchronous task code: run in a thread pool of its consumer, never on the event loop.

A worker whose ``perform`` (or a task function) is a plain ``def`` runs in
:class:`SyncRunner`'s threads, at most ``sync_concurrency`` at once (more
wait for a free thread while holding their consumer slot). The pool is made
at the first sync run, in the process that runs jobs (so never before a
``fork``), and shut down without waiting when the consumer stops.

Each run gets a copy of the job's context, so ``current_job()`` works in the
thread, and the loop it came from, so :meth:`~fencekit.consume.job.Job.set_if_fresh_sync`
and :meth:`~fencekit.consume.job.Job.progress_sync` can hop back to it.

A thread cannot be killed: a run past its ``timeout`` is settled by the
performer's watchdog at once and its coroutine cancelled, but the thread
runs on to its end, holding one of the ``sync_concurrency`` threads. Its
fenced writes are refused from the moment of the timeout (``Job.time_out``
fences the delivery in-process; Redis refuses them too once the settle
lands), and what it returns is ignored. At a stop the same holds: the
threads of cancelled runs are abandoned (their tasks go back to their
queues, fenced). Note that a ``Server`` process exits only once such
threads end (Python joins its pool threads at exit); a pool child leaves
with ``os._exit`` and does not wait.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fencekit.consume.job import bind_loop
from fencekit.settings import DEFAULT_SYNC_CONCURRENCY

__all__ = ["DEFAULT_SYNC_CONCURRENCY", "SyncRunner"]


class SyncRunner:
    """The thread pool of one consumer's sync runs (see the module docstring)."""

    __slots__ = ("_executor", "size")

    def __init__(self, size: int = DEFAULT_SYNC_CONCURRENCY) -> None:
        self.size = size
        self._executor: ThreadPoolExecutor | None = None

    async def run(self, function: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> Any:
        """``function(*args, **kwargs)`` in a thread, in a copy of the caller's context."""
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.size, thread_name_prefix="fencekit-sync")
        context = contextvars.copy_context()
        context.run(bind_loop, loop)
        call = functools.partial(context.run, function, *args, **kwargs)
        result = await loop.run_in_executor(self._executor, call)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError(
                f"{getattr(function, '__qualname__', function)!r} returned an awaitable from a plain "
                "def: declare it 'async def' so it runs on the event loop"
            )
        return result

    def close(self) -> None:
        """Stop the pool without waiting: queued runs are dropped, running threads abandoned."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
