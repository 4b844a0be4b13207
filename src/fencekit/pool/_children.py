"""A pool child as the supervisor sees it, and the mechanics of starting one and reading its end.

A slot's process moves through :class:`ChildState`; the supervisor decides
the moves (:mod:`fencekit.pool._supervisor`), this module only knows how to
start a process -- by ``fork`` with signals blocked around it, or by exec of
``python -m fencekit.pool._exec_child`` with its config on stdin -- and how
to collect and describe its exit status. :func:`child_view` is how a child
is shown (/admin, /metrics, ``Pool.children``): its state, or *stalled*
while its loop is silent (an observation of the hang watch, not a move).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fencekit.pool._board import Board
from fencekit.pool._child import ChildConfig, fork_hygiene, run_and_exit
from fencekit.runtime.app import App

if TYPE_CHECKING:
    from fencekit.web._views import ChildView

__all__ = [
    "Child",
    "ChildState",
    "child_view",
    "collect",
    "describe_exit",
    "exec_child",
    "fork_child",
    "restart_delay",
]

QUICK_DEATH = 5.0  # a child dying sooner than this after its start counts toward back-off
MAX_BACKOFF = 30.0

_BLOCKED_AROUND_FORK = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGQUIT}
_NOT_FOR_CHILDREN = ("NOTIFY_SOCKET", "WATCHDOG_USEC")


class ChildState(enum.Enum):
    """Where a slot's current process is in its life."""

    REGISTERING = "registering"
    """A new incarnation: its consumer id is registered, its process not started yet."""
    STARTING = "starting"
    """Running, not serving yet."""
    SERVING = "serving"
    """Connected and consuming (it said so on the board)."""
    REPLACING = "replacing"
    """Told to stop by a rolling restart: a clean exit is expected, not a crash."""
    HUNG = "hung"
    """Killed because its event loop stopped ticking."""
    EXITED = "exited"
    """No process (before the first start, or after its exit)."""

    @property
    def alive(self) -> bool:
        """A process exists."""
        return self in (ChildState.STARTING, ChildState.SERVING, ChildState.REPLACING, ChildState.HUNG)

    @property
    def beating(self) -> bool:
        """The supervisor beats for it (a hung child's beats stop, so peers may reap it)."""
        return self in (ChildState.REGISTERING, ChildState.STARTING, ChildState.SERVING, ChildState.REPLACING)

    @property
    def trusted(self) -> bool:
        """Alive and not hung: the supervisor's own reaper leaves its tasks alone."""
        return self in (ChildState.STARTING, ChildState.SERVING, ChildState.REPLACING)


@dataclass(slots=True)
class Child:
    """One slot and its current process."""

    slot: int
    consumer_id: str = ""
    state: ChildState = ChildState.EXITED
    pid: int = 0
    pidfd: int = -1
    popen: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0
    quick_deaths: int = 0
    exited: asyncio.Future[int] | None = None
    recycles: dict[str, int] = field(default_factory=dict)
    """Replacements of this slot's processes by reason (``max_jobs``, ``max_memory``)."""
    recycling: str = ""
    """Why the current process was told to leave (a replacement the supervisor asked for)."""
    wanted: bool = True
    """The slot is to be served (False: beyond what autoscaling wants now; not restarted)."""

    @property
    def alive(self) -> bool:
        return self.state.alive

    @property
    def ready(self) -> bool:
        return self.state is ChildState.SERVING

    def start(self, config: ChildConfig, spawn: str, app: App, board: Board, logger: logging.Logger) -> None:
        """Start the slot's next process (``spawn`` is ``"fork"`` or ``"exec"``) and open its pidfd."""
        board.reset_slot(self.slot, time.monotonic())
        if spawn == "fork":
            _warn_threads(logger)
            self.pid = fork_child(config, app, board, logger)
            self.popen = None
        else:
            self.popen = exec_child(config)
            self.pid = self.popen.pid
        self.started = time.monotonic()
        self.state = ChildState.STARTING
        self.pidfd = os.pidfd_open(self.pid)

    def signal(self, sig: int) -> None:
        """Send ``sig`` through the pidfd (never to a recycled pid); a process already gone is fine."""
        try:
            signal.pidfd_send_signal(self.pidfd, sig)
        except (ProcessLookupError, OSError):
            pass

    def reap(self) -> tuple[int, str]:
        """Collect the exited process and close its pidfd: ``(code, how)`` as :func:`describe_exit` says."""
        status = collect(self)
        os.close(self.pidfd)
        self.pidfd = -1
        return describe_exit(status)


_warned_threads = False


def _warn_threads(logger: logging.Logger) -> None:
    global _warned_threads
    if threading.active_count() > 1 and not _warned_threads:
        _warned_threads = True
        logger.warning(
            "forking with %d threads alive: a lock one of them holds stays locked in the child; "
            "embed the pool with fencekit.pool.Pool (exec'd children) in a threaded host",
            threading.active_count(),
        )


def fork_child(config: ChildConfig, app: App, board: Board, logger: logging.Logger) -> int:
    """Fork a child running ``config``; returns its pid (the child never returns).

    Signals are blocked around the fork so none reaches the child before it
    has undone the supervisor's handlers (:func:`~fencekit.pool._child.fork_hygiene`).
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED_AROUND_FORK)
    try:
        pid = os.fork()
        if pid == 0:
            fork_hygiene()
            run_and_exit(config, app, board, logger)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return pid


def exec_child(config: ChildConfig) -> subprocess.Popen[bytes]:
    """Start ``python -m fencekit.pool._exec_child``, ``config`` on its stdin (board and stack fds passed)."""
    popen = subprocess.Popen(
        [sys.executable, "-m", "fencekit.pool._exec_child"],
        stdin=subprocess.PIPE,
        pass_fds=(config.board_fd,) + ((config.stack_fd,) if config.stack_fd >= 0 else ()),
        env={k: v for k, v in os.environ.items() if k not in _NOT_FOR_CHILDREN},
    )
    assert popen.stdin is not None
    popen.stdin.write(config.to_json())
    popen.stdin.close()
    return popen


def collect(child: Child) -> int:
    """Reap the exited process of ``child``; its ``waitpid`` status."""
    if child.popen is not None:
        child.popen.wait()
        code = child.popen.returncode
        # Popen reports a death by signal N as -N; re-encode it the way waitpid does.
        return (code << 8) if code >= 0 else -code
    _, status = os.waitpid(child.pid, 0)
    return status


def describe_exit(status: int) -> tuple[int, str]:
    """``(code, how)`` of a ``waitpid`` status: the exit code (``-N`` for signal N) and words for the log."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return -sig, f"killed by {signal.Signals(sig).name}"
    code = os.WEXITSTATUS(status)
    return code, f"exited with code {code}"


def restart_delay(child: Child, lived: float, expected: bool) -> float:
    """Seconds before restarting ``child``'s slot, which exited after ``lived`` seconds.

    A slot that keeps dying soon after it starts (:data:`QUICK_DEATH`) waits
    0.1 s, then twice as long each time, up to :data:`MAX_BACKOFF`; one that
    lived longer, or whose exit was asked for (``expected``), restarts at once.
    Updates ``child.quick_deaths``.
    """
    if expected or lived >= QUICK_DEATH:
        child.quick_deaths = 0
        return 0.0
    child.quick_deaths += 1
    return float(min(MAX_BACKOFF, 0.1 * 2.0 ** (child.quick_deaths - 1)))


def child_view(child: Child, board: Board | None, stalled: float | None) -> ChildView:
    """``child`` as /admin, /metrics and ``Pool.children`` show it: the one place its shown state is derived.

    The state is its :class:`ChildState`, except that a serving child whose
    loop has been silent past the stall threshold for ``stalled`` seconds
    (:meth:`~fencekit.pool._watch.HangWatch.stalled_for`) shows ``"stalled"``,
    not ready: it is alive, but serves nothing until its loop runs again or
    the hang watch kills it.
    """
    from fencekit.web._views import ChildView  # the web package is loaded lazily (docs/design.md)

    return ChildView(
        pid=child.pid,
        slot=child.slot,
        restarts=child.restarts,
        uptime=round(time.monotonic() - child.started, 1) if child.alive else 0.0,
        alive=child.alive,
        processed=board.read_slot(child.slot)[3] if board is not None else 0,
        state="stalled" if stalled is not None else child.state.value,
        consumer_id=child.consumer_id,
        ready=child.ready and stalled is None,
        stalled_for=round(stalled, 1) if stalled is not None else None,
        recycles=tuple(sorted(child.recycles.items())),
        loop_lag=round(board.read_lag(child.slot), 3) if board is not None and child.alive else 0.0,
    )
