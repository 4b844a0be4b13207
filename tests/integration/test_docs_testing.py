"""The testing page's example (docs/guides/testing.md) passes as a user's test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.docs_blocks import block_with


def test_the_testing_example_runs_as_a_user_s_test(tmp_path: Path):
    """The page's first test, in a project of its own that opts in to the plugin, passes under pytest."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["fencekit.testing.pytest"]\n')
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    (tmp_path / "test_orders.py").write_text(block_with("async def test_charging_marks_the_order_paid"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEKIT_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout, done.stdout
