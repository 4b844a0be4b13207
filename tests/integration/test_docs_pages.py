"""The Python blocks of each docs page run as written, in order, on a private Redis.

Conventions: tests/docs_blocks.py. Each page gets a folder of its own: a block titled
``tasks.py`` is written there; every other unmarked block runs there as a script
(``python block.py``, the folder on ``PYTHONPATH``, ``FENCEKIT_REDIS_URL`` the test's Redis) and
must exit 0; a block marked ``<!-- serve: tasks:app -->`` runs while
``python -m fencekit.pool tasks:app --procs 1`` serves the page's app. The checks are the
blocks' own ``assert`` lines, written for the reader too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.docs_blocks import DOCS, Block, blocks, pages, with_url

RUN_TIMEOUT = 90.0


def run_here(block: Block) -> bool:
    return block.lang == "python" and block.mark in (None, "serve")


PAGES = [p for p in pages() if any(run_here(b) for b in blocks(p))]


def page_id(page: Path) -> str:
    return str(page.relative_to(DOCS)) if page.is_relative_to(DOCS) else page.name


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_the_page_s_blocks_run_in_order(page: Path, redis_url: str, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEKIT_") or k == "FENCEKIT_DATA_DIR"}
    env.update(PYTHONPATH=str(tmp_path), FENCEKIT_REDIS_URL=redis_url, PYTHONUNBUFFERED="1")
    ran = 0
    for number, block in enumerate(b for b in blocks(page) if run_here(b)):
        code = with_url(block.code, redis_url)
        if block.title:
            target = tmp_path / block.title
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(code)
            continue
        script = tmp_path / f"block_{number}.py"
        script.write_text(code)
        pool = serve(block.argument, redis_url, tmp_path, env) if block.mark == "serve" else None
        try:
            done = subprocess.run(
                [sys.executable, script.name],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT,
            )
        finally:
            log = stop(pool) if pool is not None else ""
        assert done.returncode == 0, f"{block.where} failed:\n{done.stdout}\n{done.stderr}\n{log}"
        ran += 1
    assert ran or any(b.title for b in blocks(page)), f"{page}: nothing ran"


def serve(target: str | None, redis_url: str, folder: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    assert target is not None
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fencekit.pool",
            target,
            "--procs",
            "1",
            "--web-port",
            "off",
            "--redis-url",
            redis_url,
        ],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(pool: subprocess.Popen[str]) -> str:
    pool.send_signal(signal.SIGTERM)
    try:
        _, log = pool.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        pool.kill()
        _, log = pool.communicate()
        raise AssertionError(f"the pool serving the page did not stop on SIGTERM:\n{log}") from None
    assert pool.returncode == 0, f"the pool serving the page exited {pool.returncode}:\n{log}"
    return log
