"""Collect ``bench_*.py`` as test modules, so ``pytest bench/ --benchmark-only`` runs them all."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if parent.session.isinitpath(file_path):
        return None  # named on the command line: pytest's own collector takes it
    if file_path.suffix == ".py" and file_path.name.startswith("bench_"):
        return pytest.Module.from_parent(parent, path=file_path)
    return None
