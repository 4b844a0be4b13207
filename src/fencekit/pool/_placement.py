"""What the pool's supervisor tells the shared services (:class:`fencekit.runtime.services.Placement`).

The services (heartbeat, reaper, history, web) are the same for a ``Server``
and a pool; the placement is what differs. In a pool it is the supervisor:
it beats for its children's consumers (those whose state still beats), tells
the reaper which of them it knows alive, passes each beat's time and Redis's
data resets to the children through the shared board, and reads their
running counts and job durations from the board (the durations of exited
children kept), and shows each child (:func:`fencekit.pool._children.child_view`).

:class:`PoolPlacement` is a base class of :class:`~fencekit.pool._supervisor.Supervisor`,
which owns the state named below.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from fencekit.jobs._registry import ConsumerRecord
from fencekit.jobs.histogram import DurationHistogram, QueueDurations
from fencekit.pool._board import Board
from fencekit.pool._children import Child, child_view
from fencekit.pool._watch import HangWatch
from fencekit.settings import PoolSettings

if TYPE_CHECKING:
    from fencekit.web._views import ChildView


class PoolPlacement:
    """The supervisor as the services' placement (its state, declared for mypy)."""

    settings: PoolSettings
    queues: list[str]
    children: list[Child]
    board: Board | None
    hangs: HangWatch | None
    _retired: QueueDurations

    def beat_entries(self) -> Mapping[str, ConsumerRecord]:
        return {
            c.consumer_id: ConsumerRecord.new(
                c.consumer_id,
                self.queues,
                self.settings["concurrency"],
                "pool-child",
                slot=c.slot,
                pid=c.pid if c.alive else None,
                supervisor=os.getpid(),
            )
            for c in self.children
            if c.state.beating
        }

    def alive_consumers(self) -> Collection[str]:
        """Consumers this supervisor knows are alive: its reaper leaves them alone."""
        return {c.consumer_id for c in self.children if c.state.trusted}

    def on_beat(self, when: float) -> None:
        if self.board is not None:
            self.board.set_beat_ok(when)

    def running(self) -> int:
        if self.board is None:
            return 0
        return sum(self.board.read_running(c.slot) for c in self.children if c.alive)

    def on_reset(self, resets: int) -> None:
        if self.board is not None:
            self.board.set_resets(resets)

    def durations(self) -> DurationHistogram:
        """Job durations of every child, past and present, summed bucket by bucket."""
        return self.queue_durations().total()

    def queue_durations(self) -> QueueDurations:
        """Job durations per queue of every child, past and present."""
        total = self._retired
        if self.board is not None:
            for child in self.children:
                if child.alive:
                    total = total + self.board.read_durations(child.slot)
        return total

    def children_view(self) -> tuple[ChildView, ...]:
        """Each child as /admin, /metrics and ``Pool.children`` show it (:func:`child_view`)."""
        hangs = self.hangs
        return tuple(
            child_view(c, self.board, hangs.stalled_for(c) if hangs is not None else None)
            for c in self.children
            if c.wanted or c.alive  # a slot autoscaling left empty is not shown
        )
