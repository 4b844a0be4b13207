"""The exit codes of ``fencekit pool`` and of its children, in one table.

A child that fails while booting exits :attr:`ExitCode.BOOT`, and the
supervisor then stops the whole pool with the same code instead of
restarting it in a loop (gunicorn's ``WORKER_BOOT_ERROR``).
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ExitCode"]


class ExitCode(IntEnum):
    """Why a fencekit process ended."""

    OK = 0
    """Stopped as asked (SIGTERM, SIGINT, ``stop()``)."""
    ERROR = 1
    """An unexpected error (its traceback is in the log)."""
    USAGE = 2
    """Bad usage or configuration: a flag, a setting, the APP, a busy web port."""
    BOOT = 3
    """A child could not boot (its APP failed to load or its settings were refused)."""
    REDIS = 4
    """Redis was unreachable at start (or refused the credentials)."""
    LEFT = 5
    """Burst mode: ``burst_timeout`` passed with tasks left (the log line says which)."""
    RECYCLED = 6
    """A pool child that claimed its ``max_jobs`` tasks, finished them and left its slot to a
    new child (never the pool's own exit code)."""
