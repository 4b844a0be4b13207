"""Hang detection: a child whose event loop stops ticking its board slot is killed.

A child's loop writes a timestamp into its slot of the shared
:class:`~fencekit.pool._board.Board` every :data:`~fencekit.pool._board.TICK`;
a side thread could tick for a process whose loop is stuck, so the loop
itself does it (gunicorn's heartbeat file, without the file system). The
supervisor checks every :data:`HANG_CHECK` seconds; when the check itself
ran late (the whole pool was stopped, SIGSTOP or a suspended VM), its
children were stopped too, so silence is counted from that moment on.

A serving child silent for longer than :func:`~fencekit.pool._stall.stall_threshold`
is *stalled* (:meth:`HangWatch.stalled_for`, shown on the admin page before
the kill); one silent for ``timeout`` is handed to ``kill``, which explains
the stall (:mod:`fencekit.pool._stall`) and kills it. The silence is measured
in this one place for both.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from fencekit.pool._board import Board
from fencekit.pool._children import Child, ChildState
from fencekit.pool._stall import stall_threshold

__all__ = ["HANG_CHECK", "HangWatch"]

HANG_CHECK = 0.5


class HangWatch:
    """Finds serving children silent for longer than ``timeout`` and hands them to ``kill``.

    ``kill(child, silent)`` is awaited (it may spend up to about a second
    explaining the stall); the children found in one round are handled at once.
    """

    def __init__(
        self,
        children: Sequence[Child],
        board: Board,
        timeout: float,
        read_board: Callable[[], None],
        kill: Callable[[Child, float], Awaitable[None]],
    ) -> None:
        self.children = children
        self.board = board
        self.timeout = timeout
        self.stall_after = stall_threshold(timeout)
        self.read_board = read_board
        self.kill = kill
        self._last = self._resumed = time.monotonic()

    def silence(self, child: Child, now: float) -> float:
        """Seconds since ``child``'s loop last ticked (not counting a pause of the whole pool)."""
        tick, _, _, _ = self.board.read_slot(child.slot)
        resumed = now if now - self._last > 4 * HANG_CHECK else self._resumed  # paused, not checked yet
        return now - max(tick, resumed)

    def stalled_for(self, child: Child) -> float | None:
        """How long a serving ``child``'s loop has been silent, when longer than :attr:`stall_after`."""
        if child.state is not ChildState.SERVING:
            return None
        silent = self.silence(child, time.monotonic())
        return silent if silent > self.stall_after else None

    async def check(self) -> None:
        """One round: kill every serving child whose loop has not ticked for ``timeout``."""
        now = time.monotonic()
        if now - self._last > 4 * HANG_CHECK:
            self._resumed = now  # the supervisor itself was stopped: so were its children, don't blame them
        self._last = now
        self.read_board()
        hung = []
        for child in self.children:
            if child.state is ChildState.SERVING:
                silent = self.silence(child, now)
                if silent > self.timeout:
                    hung.append(self.kill(child, silent))
        if hung:
            await asyncio.gather(*hung)
            self._last = time.monotonic()  # the time spent explaining is not a pause of the pool
