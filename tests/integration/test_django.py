"""fencekit.integrations.django on the machine's real PostgreSQL and MariaDB, through Django's ORM.

Django can be configured once per process, so each database's cases run in a
process of their own (``django_cases.py``) against a database this test
creates and drops; a server that does not answer fails, never skips.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.sql_helpers import own_database

CASES = Path(__file__).with_name("django_cases.py")


@pytest.mark.parametrize("vendor", ["postgresql", "mariadb"])
def test_fenced_update_and_upsert_through_the_django_orm(vendor: str, tmp_path: Path) -> None:
    with own_database(vendor, "django") as db:
        env = {**os.environ, "FK_DJANGO_APP_DIR": str(tmp_path)}
        result = subprocess.run(
            [sys.executable, str(CASES), vendor, db.name],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "ok 12"


def test_the_module_imports_without_django() -> None:
    code = (
        "import sys; sys.modules['django'] = None\n"
        "import fencekit, fencekit.integrations.django\n"
        "assert fencekit.fenced_update is fencekit.integrations.django.fenced_update\n"
        "from fencekit.integrations.django import SupportsFencedUpdate, fenced_update  # 0.6.1's path\n"
        "assert fenced_update is fencekit.fenced_update\n"
        "print('imported')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "imported", result.stderr
