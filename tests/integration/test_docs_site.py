"""The docs site builds with ``mkdocs build --strict``: every page in the nav, every link and anchor found.

Also the README's length: a few screens (the rest lives on the site).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.docs_blocks import README, ROOT


def test_the_site_builds_strict_with_every_link_and_anchor_found(tmp_path: Path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    warnings = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0, "\n".join(warnings) or done.stderr[-3000:]
    assert not warnings, warnings
    reference = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "IdempotencyGuard" in reference  # generated from the docstrings
    assert "enqueue" in reference


def test_the_readme_fits_on_a_few_screens():
    assert len(README.read_text().splitlines()) <= 300
