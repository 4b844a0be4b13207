"""The suite's ``xdist_group`` marks hold: under ``--dist loadgroup`` (the README's test command
and ``.ci/run``) the tests of one group run on one worker, one after another. The fault campaigns
rely on it (``xdist_group("faults")``: each times failovers and restarts under its own load), and so
do the modules that build something once per worker (the docs site, the 0.6.1 virtualenv). With
pytest 9.2 and pytest-xdist 3.8 the marks were silently ignored (pytest-xdist#1386); this runs a
real pytest-xdist session of two workers on a generated module and reads where each test ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

MODULE = textwrap.dedent(
    """
    import json, os
    import pytest

    @pytest.mark.xdist_group("together")
    @pytest.mark.parametrize("i", range(6))
    def test_grouped(i):
        out = os.path.join(os.environ["GROUPING_OUT"], f"grouped-{i}.json")
        with open(out, "w") as f:
            f.write(json.dumps(os.environ["PYTEST_XDIST_WORKER"]))

    @pytest.mark.parametrize("i", range(6))
    def test_free(i):
        pass
    """
)


def test_the_tests_of_one_xdist_group_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_generated.py").write_text(MODULE)
    (tmp_path / "out").mkdir()
    out = str(tmp_path / "out")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
         "--rootdir", str(tmp_path), "test_generated.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "GROUPING_OUT": out},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "12 passed" in done.stdout, done.stdout[-3000:]
    workers = {json.loads((tmp_path / "out" / f"grouped-{i}.json").read_text()) for i in range(6)}
    assert len(workers) == 1, f"the group ran on {sorted(workers)}"
