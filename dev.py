#!/usr/bin/env python3
"""The project's commands on a fresh machine: each sets up what it needs, then runs.

    python3 dev.py demo     the pool on the demo app, on the embedded Redis (admin page on :3030)
    python3 dev.py test     the test suite (python -m pytest -n 4; extra arguments go to pytest)

Nothing but Python 3.10+ (with its venv module) and a C compiler is assumed: the first run
makes a virtualenv in ``.venv`` and installs this checkout into it (the compiled core is
required, so a missing compiler is an error, not a slow fallback), with the extras the
command needs; later runs reuse it, and install again only when ``pyproject.toml``,
``setup.py`` or the Cython sources changed or a command needs more extras. Standard library
only: it runs before anything is installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP = VENV / "fencekit-dev.json"
PYTHON = VENV / "bin" / "python"

EXTRAS = {
    "demo": ("embedded",),
    "test": ("dev", "sql", "django", "celery", "otel", "docs"),
}
EXTRAS["install"] = EXTRAS["test"]
EXTRAS["docs"] = ("docs",)
EXTRAS["lint"] = ("dev",)
EXTRAS["run"] = EXTRAS["test"]

USAGE = """\
usage: python3 dev.py VERB [ARGS...]

  demo [POOL ARGS]      run the pool on the demo app (fencekit.demo:app --procs 2) on the embedded
                        Redis; admin page on http://127.0.0.1:3030/admin; Ctrl-C stops it
  test [--coverage] [PYTEST ARGS]
                        run the test suite: python -m pytest -n 4 [ARGS]; --coverage runs it under
                        coverage.py (every process the suite starts) and prints the report
                        (--coverage=first, then --coverage=last: a suite in two passes, one report)
  install               set up .venv with everything the tests need, and nothing else
  docs [serve|build]    the docs site: mkdocs build --strict (default) or mkdocs serve
  lint                  ruff check, ruff format --check, mypy --strict
  run ARGS...           python ARGS inside .venv (e.g. python3 dev.py run -m bench --quick)

Each verb first makes .venv (once) and installs this checkout with the extras it needs.
"""


def fingerprint() -> str:
    """What an install depends on: a change to any of these installs again."""
    digest = hashlib.sha256()
    sources = [ROOT / "pyproject.toml", ROOT / "setup.py", *sorted((ROOT / "src").rglob("*.pyx"))]
    for path in sources:
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def installed() -> tuple[str, set[str]]:
    try:
        stamp = json.loads(STAMP.read_text())
        return str(stamp["fingerprint"]), set(stamp["extras"])
    except (OSError, ValueError, KeyError, TypeError):
        return "", set()


def say(message: str) -> None:
    print(f"dev.py: {message}", file=sys.stderr, flush=True)


def ensure(extras: tuple[str, ...]) -> None:
    """``.venv`` with this checkout installed with at least ``extras``, made or updated as needed."""
    if sys.version_info < (3, 10):  # noqa: UP036 - this file runs on whatever python3 is
        sys.exit(f"dev.py: fencekit needs Python 3.10 or newer; this is {sys.version.split()[0]}")
    if not PYTHON.exists():
        say(f"making a virtualenv in {VENV}")
        try:
            venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
        except (OSError, subprocess.CalledProcessError) as exc:
            sys.exit(f"dev.py: could not make a virtualenv ({exc}); on Debian/Ubuntu install python3-venv")
    done_fingerprint, done_extras = installed()
    wanted = set(extras)
    if done_fingerprint == fingerprint() and wanted <= done_extras:
        return
    if done_fingerprint == fingerprint():
        wanted |= done_extras
    spec = f".[{','.join(sorted(wanted))}]"
    say(f"installing {spec} into {VENV} (the compiled core is built; this takes a minute or two)")
    pip = [str(PYTHON), "-m", "pip", "--disable-pip-version-check", "install", "-q"]
    env = {**os.environ, "FENCEKIT_REQUIRE_EXT": "1"}
    env.pop("FENCEKIT_NO_EXT", None)
    steps = [[*pip, "-U", "pip"], [*pip, "-e", spec]]
    for step in steps:
        if subprocess.run(step, cwd=ROOT, env=env).returncode != 0:
            STAMP.unlink(missing_ok=True)
            sys.exit(
                f"dev.py: {' '.join(step[3:])} failed (above). The compiled core needs a C compiler "
                "and Python's headers (Debian: build-essential python3-dev)."
            )
    STAMP.write_text(json.dumps({"fingerprint": fingerprint(), "extras": sorted(wanted)}))
    subprocess.run([str(PYTHON), "-c", "import fencekit.compiled as c; print('fencekit', c.describe())"])


def venv_env() -> dict[str, str]:
    env = {**os.environ, "VIRTUAL_ENV": str(VENV), "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONHOME", None)
    return env


def run_in_venv(args: list[str]) -> int:
    """Run ``python ARGS`` of the venv, as if the venv were active, and return its exit code."""
    try:
        return subprocess.run([str(PYTHON), *args], cwd=ROOT, env=venv_env()).returncode
    except KeyboardInterrupt:
        return 130


def become(args: list[str]) -> int:
    """Replace this process by ``python ARGS`` of the venv: signals (Ctrl-C, SIGTERM) reach it directly."""
    os.chdir(ROOT)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(str(PYTHON), [str(PYTHON), *args], venv_env())
    return 1  # not reached


COVERAGE_MODES = ("--coverage", "--coverage=first", "--coverage=last")


def test(args: list[str]) -> int:
    """The suite; under coverage.py with ``--coverage`` (one run: erase, run, report).

    A suite run in two passes (CI: the main pass, then the fault campaigns alone) measures both:
    ``--coverage=first`` erases and keeps its data unreported, ``--coverage=last`` adds its own
    and reports the whole against the floor.
    """
    modes = [a for a in args if a.startswith("--coverage")]
    if not modes:
        return become(["-m", "pytest", "-n", "4", "--dist", "loadgroup", *args])
    if len(modes) > 1 or modes[0] not in COVERAGE_MODES:
        print(f"dev.py test: one of {', '.join(COVERAGE_MODES)}, got {' '.join(modes)}", file=sys.stderr)
        return 2
    mode = modes[0]
    args = [a for a in args if a != mode]
    if mode != "--coverage=last":
        run_in_venv(["-m", "coverage", "erase"])
    code = run_in_venv(["-m", "coverage", "run", "-m", "pytest", "-n", "4", "--dist", "loadgroup", *args])
    run_in_venv(["-m", "coverage", "combine", "-q", "--append"])
    if mode == "--coverage=first":
        return code
    report = run_in_venv(["-m", "coverage", "report", "--sort=cover", "--fail-under=92"])
    return code or report


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    if argv[0] not in EXTRAS:
        print(f"dev.py: unknown verb {argv[0]!r}\n\n{USAGE}", end="", file=sys.stderr)
        return 2
    verb, args = argv[0], argv[1:]
    ensure(EXTRAS[verb])
    if verb == "demo":
        return become(["-m", "fencekit.pool", "fencekit.demo:app", "--procs", "2", *args])
    if verb == "test":
        return test(args)
    if verb == "docs":
        action = args[0] if args else "build"
        extra = ["--strict"] if action == "build" else []
        return become(["-m", "mkdocs", action, *extra, *args[1:]])
    if verb == "lint":
        checks = [
            ["-m", "ruff", "check", "src", "tests", "bench", "dev.py"],
            ["-m", "ruff", "format", "--check", "src", "tests", "bench", "dev.py"],
            ["-m", "mypy", "src"],
        ]
        return max(run_in_venv(check) for check in checks)
    if verb == "run":
        return become(args)
    return 0  # install: done above


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
