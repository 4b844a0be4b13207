"""The supervisor's side of its children's liveness: ready, hung (explained, killed), systemd's watchdog.

A child is ready once its board slot says so (``_read_board``). A child whose
loop stopped ticking for the hang timeout (``hang_timeout``, else the
heartbeat TTL; measured by :class:`fencekit.pool._watch.HangWatch`) is
explained in one ERROR record -- the tasks it ran and its threads' stacks,
:func:`fencekit.pool._stall.diagnose`, bounded to about half a second -- and
killed; its exit is then handled as any death. systemd's watchdog is fed only
while the heartbeat reaches Redis and every loop of the services runs.

:class:`Liveness` is a base class of :class:`~fencekit.pool._supervisor.Supervisor`,
which owns the state named below.
"""

from __future__ import annotations

import logging
import signal

from fencekit._aio.scope import TaskScope
from fencekit._redis.keys import KeySpace
from fencekit.pool import _sdnotify as sdnotify
from fencekit.pool._board import READY, Board
from fencekit.pool._children import Child, ChildState
from fencekit.pool._stall import StackFile, diagnose
from fencekit.runtime.services import Services
from fencekit.settings import PoolSettings


class Liveness:
    """Readiness, the hung child's kill, the watchdog (the supervisor's state, declared for mypy)."""

    settings: PoolSettings
    services: Services
    keys: KeySpace
    queues: list[str]
    children: list[Child]
    board: Board | None
    stacks: dict[int, StackFile]
    logger: logging.Logger
    diagnosing: TaskScope

    def _read_board(self) -> None:
        if self.board is None:
            return
        for child in self.children:
            if child.state is ChildState.STARTING:
                _, state, pid, _ = self.board.read_slot(child.slot)
                if state == READY and pid == child.pid:
                    child.state = ChildState.SERVING

    def _hang_timeout(self) -> float:
        return self.settings["hang_timeout"] or self.settings["heartbeat_ttl"]

    async def _kill_hung(self, child: Child, silent: float) -> None:
        """Say which tasks ``child`` ran and where its loop is stuck (one record), then kill it."""
        pid = child.pid

        def ask(sig: int) -> None:  # never a later incarnation of the slot: it may not handle sig yet
            if child.pid == pid and child.state is ChildState.SERVING:
                child.signal(sig)

        try:
            report = await diagnose(
                self.services.redis,
                self.keys,
                self.queues,
                child.consumer_id,
                self.stacks.get(child.slot),
                ask,
                self.diagnosing,
            )
        except Exception as exc:  # a bug in the explanation must not spare the child
            report = f"(could not explain the stall: {type(exc).__name__}: {exc})"
        finally:
            if child.pid == pid and child.state is ChildState.SERVING:
                child.state = ChildState.HUNG
                child.signal(signal.SIGKILL)
        self.logger.error(
            "child %d (pid %d) is hung: its event loop has not ticked for %.1fs; killing it\n%s",
            child.slot,
            pid,
            silent,
            report,
        )

    async def _watchdog(self) -> None:
        """Feed systemd's watchdog while the heartbeat reaches Redis and every loop runs."""
        if self.services.heartbeat.healthy() and self.services.loops_alive():
            sdnotify.notify("WATCHDOG=1")
