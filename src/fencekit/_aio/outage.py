"""One process's view of a Redis outage: a line when it starts, one a minute, one when it ends.

Every periodic loop of a process (the claim loop, the waker, the cancel
listener, the heartbeat, the reaper, the scheduler, ...) meets the same outage
when Redis goes away; each logging its own failures, growths and recoveries
made a ten-second outage forty lines. Their :class:`~fencekit._aio.loops.Backoff`
reports a failure to reach Redis here instead: the first one while nothing
else is failing opens the outage (one WARNING naming that loop and the
error, at ERROR), a failure a minute or more after the last line says it still lasts,
and when the last failing loop reaches Redis again one WARNING says so, with
the outage's length. The loops' own lines (the seed's back-off schedule) go to
DEBUG meanwhile.

A loop that reaches Redis again wakes the others (:meth:`Outage.listen`,
:meth:`~fencekit._aio.loops.Backoff.pause`): they retry at once instead of at
the end of their back-off, so the heartbeat lands, the lease holds again and
claims resume within about a second of Redis answering.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Protocol

__all__ = ["OUTAGE", "REPEAT_EVERY", "Outage"]

REPEAT_EVERY = 60.0
"""At most one "still not answering" line per this many seconds, per process."""


class Member(Protocol):
    """A loop that may fail to reach Redis: named in the outage's first line, logging to its logger."""

    what: str
    logger: logging.Logger


class Outage:
    """The outage of this process (:data:`OUTAGE`); thread-safe: loops on any event loop report."""

    def __init__(self, repeat_every: float = REPEAT_EVERY) -> None:
        self.repeat_every = repeat_every
        self._reset()

    def _reset(self) -> None:
        self.open = False
        """True from a failure while nothing failed until a success leaves no loop failing."""
        self.started = 0.0
        self.ended = 0
        """Outages this process has seen end."""
        self._failing: weakref.WeakSet[Member] = weakref.WeakSet()
        self._last_line = 0.0
        self._lock = threading.Lock()
        self._listeners: dict[int, tuple[asyncio.AbstractEventLoop, Callable[[], None]]] = {}
        self._next_key = 0

    def failed(self, member: Member, exc: BaseException) -> None:
        """``member`` could not reach Redis: open the outage, or say once a minute that it lasts."""
        now = time.monotonic()
        with self._lock:
            self._failing.add(member)
            if not self.open:
                self.open = True
                self.started = self._last_line = now
                member.logger.error(
                    "Redis is not answering (%s: %s); retrying quietly, a line a minute until it answers",
                    member.what,
                    exc,
                )
            elif now - self._last_line >= self.repeat_every:
                self._last_line = now
                member.logger.error(
                    "Redis still not answering after %.0fs (%d loop(s) waiting): %s",
                    now - self.started,
                    len(self._failing),
                    exc,
                )

    def answered(self, member: Member) -> None:
        """``member`` reached Redis: it leaves the outage; the last to leave ends it."""
        with self._lock:
            was_failing = member in self._failing
            self._failing.discard(member)
            if self.open and not self._failing:
                self.open = False
                self.ended += 1
                member.logger.warning(
                    "Redis answers again (%s), after an outage of %.1fs",
                    member.what,
                    time.monotonic() - self.started,
                )
            listeners = list(self._listeners.values()) if was_failing else []
        for loop, callback in listeners:
            try:
                loop.call_soon_threadsafe(callback)
            except RuntimeError:  # that loop is closed; its owner stops listening on its way out
                pass

    def forget(self, member: Member) -> None:
        """``member`` stopped trying (it stopped, or waits for work): it no longer holds the outage open.

        When no loop is left trying, the outage is over without a line: nobody knows how long it lasted.
        """
        with self._lock:
            self._failing.discard(member)
            if not self._failing:
                self.open = False

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` on the running event loop each time a failing loop reaches Redis again.

        Returns the call that stops it.
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            key = self._next_key
            self._next_key += 1
            self._listeners[key] = (loop, callback)

        def stop() -> None:
            with self._lock:
                self._listeners.pop(key, None)

        return stop


OUTAGE = Outage()
"""This process's outage; a forked child starts with its own, empty."""

os.register_at_fork(after_in_child=OUTAGE._reset)
