"""Save coverage.py's data before ``os._exit``, when coverage.py measures this process.

A pool child leaves with ``os._exit`` (``docs/design/measurements.md``, fork hygiene), so the
atexit hook with which coverage.py saves a measured process's data never runs
there. The test suite's CI run measures every process it starts
(``[tool.coverage.run]`` in ``pyproject.toml``); :func:`save` is called just
before ``os._exit`` so the children's lines count too. It does nothing unless
coverage.py is imported and measuring, never imports it, and never raises.
"""

from __future__ import annotations

import sys

__all__ = ["save"]


def save() -> None:
    """Write the data of the running coverage.py measurement, if there is one."""
    coverage = sys.modules.get("coverage")
    if coverage is None:
        return
    try:
        current = coverage.Coverage.current()
        if current is not None:
            current.save()
    except Exception:  # measurement must never change how a process ends
        pass
