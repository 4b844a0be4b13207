"""Closing that a cancellation cannot cut short.

A stopping part is cancelled while it closes its connections, and a task
scope cancels again a task still running :data:`~fencekit._aio.scope.RECANCEL`
seconds later. A close interrupted there leaves its socket open: redis-py's
``RedisCluster.aclose()`` marks the client closed before it disconnects its
nodes (so a second call does nothing), and ``asyncio.gather`` cancels the
disconnects it had not started yet. The transport was then found by the
garbage collector, as an unclosed-resource warning, in whichever test ran
next.

:func:`finish` runs a close in its own task and waits for it through every
cancellation of the caller, then raises the first cancellation.
:func:`aclose_all` closes several resources that way, one after the other,
and ignores their errors (a connection that failed is closed all the same).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["aclose_all", "finish"]

log = logging.getLogger("fencekit.closing")

T = TypeVar("T")


async def finish(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` to its end even if the caller is cancelled meanwhile.

    The work runs in a task of its own that the caller's cancellation does not
    reach; once it ended, the caller's first cancellation (if any) is raised,
    else the work's result or error.
    """
    task = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: its error is moot once the caller is cancelled
        raise cancelled
    return task.result()


async def aclose_all(*resources: Any) -> None:
    """``await resource.aclose()`` for each of ``resources`` (None skipped), through cancellations.

    An error of a close is logged at DEBUG and ignored: the resource is
    dropped either way. A cancellation met meanwhile is raised once every
    resource is closed.
    """
    cancelled: asyncio.CancelledError | None = None
    for resource in resources:
        if resource is None:
            continue
        try:
            await finish(resource.aclose())
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
        except Exception as exc:
            log.debug("closing %r failed: %r", resource, exc)
    if cancelled is not None:
        raise cancelled
