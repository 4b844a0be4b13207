"""Replacing a child before it becomes a problem: ``max_jobs`` and ``max_memory``.

Long-running Python processes grow (leaks in user code and C extensions), so
a child can be replaced on purpose, the way Celery's ``max_tasks_per_child``
and gunicorn's ``max_requests`` do it -- but without failing a task:

- ``max_jobs``: the child itself stops claiming once it has claimed its
  budget (``max_jobs`` plus a random ``0..max_jobs_jitter`` drawn per
  process, so that children are not all replaced at once), finishes what it
  runs within the grace (a checkpointing job is interrupted at its next
  checkpoint, the rest returned) and exits
  :attr:`~fencekit.runtime.exits.ExitCode.RECYCLED`. The budget is counted
  where claims are made (``Consumer.claim_budget``): one comparison per
  claim, none per task.
- ``max_memory``: the supervisor reads each serving child's resident memory
  (``/proc/<pid>/statm``) every :data:`MEMORY_CHECK` seconds and tells one
  above the limit to leave as a rolling restart does (SIGTERM: the same drain).

Either way the exit is expected: the child's tasks go back to their queues
as they were (no attempt spent), the slot restarts at once, and the
replacement is counted by reason on the admin page and ``/metrics``.
"""

from __future__ import annotations

import logging
import os
import random
import signal
from collections.abc import Sequence

from fencekit.pool._children import Child, ChildState

__all__ = ["MEMORY_CHECK", "MemoryWatch", "job_budget", "rss_mb"]

MEMORY_CHECK = 2.0
"""Seconds between two reads of the children's resident memory."""

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def job_budget(max_jobs: int | None, jitter: int, rng: random.Random | None = None) -> int | None:
    """The claims one child process may make: ``max_jobs`` plus a random ``0..jitter`` (None: no limit)."""
    if max_jobs is None:
        return None
    return max_jobs + ((rng or random).randint(0, jitter) if jitter else 0)


def rss_mb(pid: int) -> float | None:
    """Resident memory of ``pid`` in MB (2**20 bytes), or None when it cannot be read (gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            resident = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident * _PAGE / 2**20


class MemoryWatch:
    """Tells a serving child above ``limit`` MB to leave (see the module docstring)."""

    def __init__(self, children: Sequence[Child], limit: float, logger: logging.Logger) -> None:
        self.children = children
        self.limit = limit
        self.logger = logger

    async def check(self) -> None:
        for child in self.children:
            if child.state is not ChildState.SERVING:
                continue  # starting, already leaving, or gone
            used = rss_mb(child.pid)
            if used is None or used <= self.limit:
                continue
            self.logger.info(
                "child %d (pid %d) uses %.0f MB, above max_memory %g MB: replacing it "
                "(it finishes its tasks first)",
                child.slot,
                child.pid,
                used,
                self.limit,
            )
            child.recycling = "max_memory"
            child.state = ChildState.REPLACING
            child.signal(signal.SIGTERM)
