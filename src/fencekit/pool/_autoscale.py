"""Autoscaling: the pool grows toward ``max_procs`` children while work waits, and shrinks back.

Every :data:`CHECK` seconds the supervisor reads the backlog of the queues
it serves (:func:`fencekit.services.backlog.read_backlog`: pending plus due
scheduled tasks, one round trip) and derives the children it wants::

    desired = clamp(ceil(backlog / scale_backlog), procs, max_procs)

and, while any task waits and every child serves with its event loop late by
``scale_lag`` or more (loops busy with CPU work: more backlog per child is
not needed to show they cannot keep up), at least one child more than run
now -- one at a time: the next only once the new child serves and its own
loop lags too. Lagging loops with work waiting also keep the pool from
shrinking.

- more than run now: it starts the missing children at once (each in a free
  slot, registered before it claims, as at the start);
- fewer: once that has held for ``scale_cooldown`` seconds, it tells the
  extra children -- the highest slots -- to leave as a recycled child does
  (SIGTERM: stop claiming, finish or interrupt what runs within the grace,
  return the rest as it was), and does not restart their slots.

Each change is logged once, with its numbers. ``desired`` is also what
``/metrics`` shows as ``fencekit_desired_workers``, a signal for an
autoscaler outside the pool (KEDA, docs/guides/operations.md).
"""

from __future__ import annotations

import logging
import math
import signal
import time
from typing import TYPE_CHECKING

from fencekit._redis.keys import KeySpace
from fencekit.errors import ConfigError
from fencekit.pool._board import Board
from fencekit.pool._children import Child, ChildState
from fencekit.services.backlog import read_backlog
from fencekit.settings import PoolSettings

if TYPE_CHECKING:
    from fencekit.runtime.services import Services

__all__ = ["CHECK", "Scaling", "slots"]

CHECK = 1.0
"""Seconds between two reads of the backlog."""


def slots(settings: PoolSettings) -> list[Child]:
    """A :class:`Child` per slot the pool may use (``max_procs``, else ``procs``); ``procs`` wanted."""
    procs, most = settings["procs"], settings["max_procs"] or settings["procs"]
    if most < procs:
        raise ConfigError(f"max_procs ({most}) must be at least procs ({procs})")
    return [Child(slot, wanted=slot < procs) for slot in range(most)]


class Scaling:
    """The supervisor's autoscaling (a base class of it; its state declared for mypy)."""

    settings: PoolSettings
    children: list[Child]
    queues: list[str]
    keys: KeySpace
    logger: logging.Logger
    stopping: bool
    board: Board | None
    _low_since: float | None = None
    _desired: int = 0

    if TYPE_CHECKING:
        services: Services

        def _start_slot(self, child: Child) -> None: ...

    def desired_workers(self) -> int:
        """The children this supervisor wants now: ``procs``, or the autoscaler's last decision."""
        return self._desired or self.settings["procs"]

    def wanted(self) -> list[Child]:
        return [c for c in self.children if c.wanted]

    def loop_lag(self) -> float | None:
        """The least loop lag among the wanted children, or None unless all of them serve."""
        wanted, board = self.wanted(), self.board
        if board is None or not wanted or not all(c.alive and c.ready for c in wanted):
            return None
        return min(board.read_lag(c.slot) for c in wanted)

    async def scale(self) -> None:
        """One check: read the backlog, grow at once or shrink after the cool-down (module docstring)."""
        if self.stopping:
            return
        floor, ceiling = self.settings["procs"], self.settings["max_procs"] or self.settings["procs"]
        read = await read_backlog(self.services.redis, self.keys, self.queues)
        backlog = sum(b.total for b in read.values())
        per = self.settings["scale_backlog"]
        by_backlog = desired = max(floor, min(ceiling, math.ceil(backlog / per)))
        now = len(self.wanted())
        lag = self.loop_lag() if backlog else None
        if lag is not None and 0 < self.settings["scale_lag"] <= lag:
            desired = max(desired, min(ceiling, now + 1))
        self._desired = desired
        if desired > now:
            self._low_since = None
            if by_backlog <= now:
                self.logger.info(
                    "autoscaling: %d tasks waiting and every child's loop %.2fs late (scale_lag %g), "
                    "%d children: growing to %d",
                    backlog, lag, self.settings["scale_lag"], now, desired,
                )  # fmt: skip
            else:
                self.logger.info(
                    "autoscaling: %d tasks waiting, %d children (%d per child above scale_backlog %d): "
                    "growing to %d",
                    backlog, now, backlog // now, per, desired,
                )  # fmt: skip
            free = [
                c for c in self.children
                if not c.wanted and not c.alive and (c.exited is None or c.exited.done())
            ]  # fmt: skip
            for child in free[: desired - now]:
                child.wanted = True
                self._start_slot(child)
            return
        if desired == now:
            self._low_since = None
            return
        started = self._low_since = self._low_since or time.monotonic()
        if time.monotonic() - started < self.settings["scale_cooldown"]:
            return
        self._low_since = None
        self.logger.info(
            "autoscaling: %d tasks waiting for %.0fs (scale_cooldown), %d children: shrinking to %d",
            backlog, self.settings["scale_cooldown"], now, desired,
        )  # fmt: skip
        for child in sorted(self.wanted(), key=lambda c: c.slot, reverse=True)[: now - desired]:
            child.wanted = False
            if child.alive:
                child.state = ChildState.REPLACING  # a drain, as a recycled child's
                child.signal(signal.SIGTERM)
