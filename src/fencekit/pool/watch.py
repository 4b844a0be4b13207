"""Hang detection: a child whose event loop stops ticking its board slot is killed.

A child's loop writes a timestamp into its slot of the shared
:class:`~fencekit.pool.board.Board` every :data:`~fencekit.pool.board.TICK`;
a side thread could tick for a process whose loop is stuck, so the loop
itself does it (gunicorn's heartbeat file, without the file system). The
supervisor checks every :data:`HANG_CHECK` seconds; when the check itself
ran late (the whole pool was stopped, SIGSTOP or a suspended VM), its
children were stopped too, so silence is counted from that moment on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from fencekit.pool.board import Board
from fencekit.pool.children import Child, ChildState

__all__ = ["HANG_CHECK", "HangWatch"]

HANG_CHECK = 0.5


class HangWatch:
    """Finds serving children silent for longer than ``timeout`` and hands them to ``kill``."""

    def __init__(
        self,
        children: Sequence[Child],
        board: Board,
        timeout: float,
        read_board: Callable[[], None],
        kill: Callable[[Child], None],
        logger: logging.Logger,
    ) -> None:
        self.children = children
        self.board = board
        self.timeout = timeout
        self.read_board = read_board
        self.kill = kill
        self.logger = logger
        self._last = self._resumed = time.monotonic()

    async def check(self) -> None:
        """One round: kill every serving child whose loop has not ticked for ``timeout``."""
        now = time.monotonic()
        if now - self._last > 4 * HANG_CHECK:
            self._resumed = now  # the supervisor itself was stopped: so were its children, don't blame them
        self._last = now
        self.read_board()
        for child in self.children:
            if child.state is not ChildState.SERVING:
                continue
            tick, _, _, _ = self.board.read_slot(child.slot)
            silent = now - max(tick, self._resumed)
            if silent > self.timeout:
                self.logger.error(
                    "child %d (pid %d) is hung: its event loop has not ticked for %.1fs; killing it",
                    child.slot,
                    child.pid,
                    silent,
                )
                self.kill(child)
