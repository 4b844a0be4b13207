"""The README's first command, as written, on a fresh clone with an empty HOME.

The README promises that on a machine with only Python and a C compiler its first command
sets up what it needs and runs the pool on the demo app with the embedded Redis, admin page on
port 3030. This clones the checkout, runs that line (read from the README's "The two commands"
block) with HOME an empty folder and no virtualenv active, and waits until the admin page
answers and /metrics counts demo jobs processed; then SIGTERM, which must stop it with exit 0.
The second command (the tests) is what CI's main pass runs, the same way.
Bounded: 600 s for the install, 120 s for jobs to flow, 60 s to stop.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## The two commands\n.*?```sh\n(.*?)```", readme, re.S)
    assert block, "README: no sh block under 'The two commands'"
    lines = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert len(lines) == 2, lines
    return lines


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except OSError:
        return 0, ""


def main() -> int:
    demo, test = readme_commands()
    assert demo.startswith("python3 dev.py "), demo
    assert test.startswith("python3 dev.py "), test
    work = Path(tempfile.mkdtemp(prefix="two-commands-"))
    clone, home = work / "clone", work / "home"
    home.mkdir()
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if "/.venv" not in p)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEKIT_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(HOME=str(home), PATH=path)
    started = time.monotonic()
    print(f"$ {demo}   (in a fresh clone, HOME={home})", flush=True)
    log = (work / "demo.log").open("w")
    pool = subprocess.Popen(shlex.split(demo), cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        processed = 0
        deadline = started + 720
        while time.monotonic() < deadline and pool.poll() is None:
            status, _ = get("http://127.0.0.1:3030/admin")
            _, metrics = get("http://127.0.0.1:3030/metrics")
            found = re.search(r'^fencekit_processed(?:_total)?\{queue="demo"\} ([0-9.e+]+)$', metrics, re.M)
            processed = int(float(found.group(1))) if found else 0
            if status == 200 and processed > 0:
                break
            time.sleep(1)
        assert pool.poll() is None, f"the demo exited {pool.returncode}"
        assert processed > 0, "no demo job processed in time"
        print(f"admin page answers, {processed} demo jobs processed, after {time.monotonic() - started:.0f}s")
        data = home / ".local" / "share" / "fencekit"
        assert data.is_dir(), f"no embedded Redis data under {data}"
    finally:
        if pool.poll() is None:
            pool.send_signal(signal.SIGTERM)
            try:
                pool.wait(60)
            except subprocess.TimeoutExpired:
                pool.kill()
                pool.wait()
        log.close()
        print((work / "demo.log").read_text()[-3000:])
    assert pool.returncode == 0, f"the demo pool exited {pool.returncode} on SIGTERM"
    print(f"the demo stopped cleanly on SIGTERM; {time.monotonic() - started:.0f}s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
