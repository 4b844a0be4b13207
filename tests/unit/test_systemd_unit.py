"""The shipped systemd unit: the settings the pool relies on, and systemd-analyze's verdict."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "contrib" / "systemd" / "fencekit.service"


def settings() -> dict[str, str]:
    pairs = re.findall(r"^(\w+)=(.*)$", UNIT.read_text(), flags=re.M)
    return dict(pairs)


def test_the_unit_has_what_the_supervisor_relies_on():
    unit = settings()
    assert unit["Type"] == "notify"
    assert unit["KillMode"] == "mixed"
    assert unit["Restart"] == "on-failure"
    assert unit["OOMPolicy"] == "continue"
    assert int(unit["WatchdogSec"]) > 0
    grace = int(re.search(r"--grace (\d+)", unit["ExecStart"]).group(1))  # type: ignore[union-attr]
    assert int(unit["TimeoutStopSec"]) > grace
    assert unit["NoNewPrivileges"] == "yes"
    assert unit["ProtectSystem"] == "strict"


def test_systemd_analyze_finds_nothing_wrong(tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed on this machine")
    unit = tmp_path / "fencekit.service"
    unit.write_text(UNIT.read_text().replace("/opt/fencekit/venv/bin/python", sys.executable))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "fencekit.service" not in result.stderr, result.stderr
