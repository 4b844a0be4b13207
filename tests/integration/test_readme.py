"""The README's quick start runs as written (only the Redis URL is the test's)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.docs_blocks import README, block_with, with_url


def test_the_quick_start_runs_on_a_pool_as_written(redis_url: str, tmp_path: Path):
    """tasks.py served by ``python -m fencekit.pool tasks:app --procs 2``; main.py prints both results."""
    url = redis_url.rsplit("/", 1)[0]
    (tmp_path / "tasks.py").write_text(with_url(block_with("# tasks.py"), url))
    (tmp_path / "main.py").write_text(with_url(block_with("# main.py"), url))
    serve = re.search(r"Serve it: `(python -m fencekit\.pool [^`]+)`", README.read_text())
    assert serve is not None
    argv = with_url(serve.group(1), url).split()[1:]  # the README's command, only the URL is the test's
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("FENCEKIT_REDIS_URL", None)  # the app's URL, written once in tasks.py, is the one served
    pool = subprocess.Popen(
        [sys.executable, *argv, "--web-port", "off"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        done = subprocess.run(
            [sys.executable, "main.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        printed = [line for line in done.stdout.splitlines() if " fencekit.client: " not in line]
        assert printed == ["sent 'hi' to ada@example.com", "report 42 rendered"], done.stdout
    finally:
        pool.send_signal(signal.SIGTERM)
        _, log = pool.communicate(timeout=60)
    assert pool.returncode == 0, log
