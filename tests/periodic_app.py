"""Periodic task functions for the pool tests of ``tests/integration/test_periodic_pools.py``.

Module-level, so ``python -m fencekit.pool tests.periodic_app:app`` imports them.
Every run appends its jid to ``runs-<pid>.log`` in ``TEST_RUNS_DIR``: the record
of runs kept outside Redis (it survives a Redis restart).
"""

from __future__ import annotations

import os

from fencekit import App, current_job

app = App()


def _record() -> None:
    path = os.path.join(os.environ["TEST_RUNS_DIR"], f"runs-{os.getpid()}.log")
    with open(path, "a") as out:
        out.write(current_job().jid + "\n")


@app.task(queue="cron", every=1)
async def tick() -> None:
    """Every second; after downtime, one run for the missed ticks."""
    _record()


@app.task(queue="cron", every=1, cron_catch_up=True)
async def tick_all() -> None:
    """Every second; after downtime, every missed tick (up to the bound)."""
    _record()
