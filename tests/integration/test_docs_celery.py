"""The Celery app of docs/guides/celery.md ("Before: a Celery app") runs as written, on a real worker.

The block is written into the test's folder as ``shop_celery.py`` (the module a Celery user
would have), ``celery -A shop_celery worker`` serves it on the test's Redis (broker and result
backend), and the block's own ``__main__`` part -- enqueue, wait for each result, assert it --
runs as a script beside it and must exit 0. The adapter's block on the same page is
``test_celery.py::test_the_docs_example_runs``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.docs_blocks import ROOT, block_with, with_url

pytestmark = pytest.mark.timeout(120)


def test_the_celery_before_example_runs_on_a_real_worker(redis_url: str, tmp_path: Path) -> None:
    (tmp_path / "shop_celery.py").write_text(with_url(block_with("app.conf.beat_schedule"), redis_url))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")])}
    log = tmp_path / "worker.log"
    argv = [
        sys.executable, "-m", "celery", "-A", "shop_celery", "worker", "--pool", "solo",
        "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        done = subprocess.run(
            [sys.executable, "shop_celery.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        worker_log = log.read_text(errors="replace")[-4000:]
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n--- worker log (end)\n{worker_log}"
        assert "Retry in" in worker_log  # the first run of each charge failed and Celery retried it
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
