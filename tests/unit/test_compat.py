"""Old import paths: each resolves to its new home, as the same module object, with a warning.

Run in a fresh interpreter per case, so an import made by another test cannot hide
the warning or the aliasing.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from fencekit._compat import MOVED, SILENT


def run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return (done.stdout + done.stderr).strip()


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_its_new_module_with_a_deprecation_warning(old: str) -> None:
    new = MOVED[old]
    code = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({new!r})\n"
        "print(old is new, new.__spec__.name, new.__name__)\n"
        "print([str(w.message) for w in caught if w.category is DeprecationWarning])\n"
    )
    same, warnings = run(code).splitlines()
    assert same == f"True {new} {new}"
    said = ast.literal_eval(warnings)  # the list of str the child printed
    if old in SILENT:
        assert said == []
    else:  # the old parent package may warn too (fencekit.sql for fencekit.sql.columns)
        assert f"{old} has moved to {new}; the old path works until fencekit 0.3" in said
        assert all(" has moved to " in message for message in said), said


def test_names_from_an_old_path_are_the_new_objects() -> None:
    code = (
        "import warnings\n"
        "warnings.simplefilter('ignore')\n"
        "from fencekit.queue.codec import decode\n"
        "from fencekit.sql import fenced_update as sql_update\n"
        "from fencekit.storage import fenced_update\n"
        "import fencekit.jobs.codec, fencekit.integrations.sql, fencekit.integrations.django\n"
        "print(decode is fencekit.jobs.codec.decode,\n"
        "      sql_update is fencekit.integrations.sql.fenced_update,\n"
        "      fenced_update is fencekit.integrations.django.fenced_update)\n"
    )
    assert run(code) == "True True True"


def test_an_old_path_warns_where_the_warnings_filter_says_error() -> None:
    """Under ``-W error`` (as in this suite's own settings) an old path fails loudly, naming the new one."""
    out = run("import fencekit.codec")
    assert "DeprecationWarning: fencekit.codec has moved to fencekit.jobs.codec" in out


def test_the_new_paths_import_without_any_warning() -> None:
    code = "import importlib\n" + "".join(
        f"importlib.import_module({new!r})\n" for new in sorted(set(MOVED.values()))
    )
    assert run(code + "print('ok')") == "ok"


def test_an_unknown_module_is_still_an_import_error() -> None:
    out = run("import fencekit.queue.nothing_here")
    assert "ModuleNotFoundError" in out
