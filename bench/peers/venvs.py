"""Private virtualenvs for the peer queues (``bench/.venvs/<peer>``), made by the benchmark.

Peers pin redis-py versions that clash with each other and with fencekit, so
each gets its own environment, created with ``python -m venv`` and filled by
pip from PyPI. A peer that cannot be installed is reported with pip's last
lines, never dropped silently.

    python -m bench.peers.venvs            # create / refresh every peer venv
    python -m bench.peers.venvs arq huey   # just these
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENVS = Path(os.environ.get("FENCEKIT_BENCH_VENVS", HERE.parent / ".venvs"))

#: peer -> pip requirement specs (redis-py added so the harness can read markers)
PEERS: dict[str, list[str]] = {
    "arq": ["arq", "redis[hiredis]"],
    "saq": ["saq[hiredis]", "typing_extensions", "redis[hiredis]"],
    "dramatiq": ["dramatiq[redis]", "redis[hiredis]"],
    "streaq": ["streaq", "redis[hiredis]"],
    "taskiq": ["taskiq", "taskiq-redis", "redis[hiredis]"],
    "celery": ["celery[redis]", "redis[hiredis]"],
    "rq": ["rq", "redis[hiredis]"],
    "huey": ["huey", "redis[hiredis]"],
}


def python_of(peer: str) -> Path:
    return VENVS / peer / "bin" / "python"


def ensure(peer: str, timeout: float = 600.0) -> tuple[bool, str]:
    """Create the peer's venv if needed; return (ok, versions-or-reason)."""
    env_dir = VENVS / peer
    stamp = env_dir / ".fencekit-bench.json"
    specs = PEERS[peer]
    if stamp.exists():
        data = json.loads(stamp.read_text())
        if data.get("specs") == specs and data.get("ok"):
            return True, data["versions"]
    VENVS.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        if not python_of(peer).exists():
            subprocess.run(
                [sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=120, capture_output=True
            )
        left = max(30.0, timeout - (time.monotonic() - started))
        proc = subprocess.run(
            [str(python_of(peer)), "-m", "pip", "install", "--disable-pip-version-check", "-q", *specs],
            capture_output=True,
            text=True,
            timeout=left,
        )
    except subprocess.TimeoutExpired:
        return False, f"pip install timed out after {timeout:.0f}s"
    except subprocess.CalledProcessError as exc:
        return False, f"python -m venv failed: {exc.stderr!r}"
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        return False, f"pip install {' '.join(specs)} failed: {tail}"
    names = [s.split("[")[0] for s in specs]
    show = subprocess.run(
        [str(python_of(peer)), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    installed = {p["name"].lower(): p["version"] for p in json.loads(show.stdout or "[]")}
    versions = ", ".join(f"{n} {installed.get(n.lower(), '?')}" for n in dict.fromkeys(names))
    stamp.write_text(json.dumps({"specs": specs, "ok": True, "versions": versions}))
    return True, versions


def main(argv: list[str]) -> int:
    for peer in argv or list(PEERS):
        ok, info = ensure(peer)
        print(f"{peer:10} {'ok ' if ok else 'FAILED'} {info}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
