"""The docs site builds with ``mkdocs build --strict`` (every page in the nav, every link and
anchor found) and renders in a real headless Chromium; the README fits on a few screens."""

from __future__ import annotations

import functools
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.docs_blocks import README, ROOT
from tests.integration.test_admin_browser import DomText, run_chromium

# one worker runs them all: the module's site (a 25 s mkdocs build) is built once, not once per worker
pytestmark = pytest.mark.xdist_group("docs_site")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    warnings = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0, "\n".join(warnings) or done.stderr[-3000:]
    assert not warnings, warnings
    return out


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def test_the_site_builds_strict_with_every_link_and_anchor_found(site: Path):
    reference = (site / "reference" / "api" / "index.html").read_text()
    assert "IdempotencyGuard" in reference  # generated from the docstrings
    assert "Wait until task" in reference  # Client.result's docstring
    index = json.loads((site / "search" / "search_index.json").read_text())
    titles = {doc["title"] for doc in index["docs"]}
    assert {
        "Getting started",
        "Retries, timeouts and failures",
        "Comparison with Celery, arq, RQ, Dramatiq, SAQ, taskiq and BullMQ",
    } <= titles


@pytest.mark.parametrize(
    ("path", "heading"),
    [
        ("/", "fencekit"),
        ("/getting-started/", "Getting started"),
        ("/guides/failures/", "Retries, timeouts and failures"),
    ],
)
async def test_a_page_renders_in_headless_chromium_with_its_navigation(
    served: str, chromium: str, path: str, heading: str
):
    dom = (await run_chromium(chromium, "--dump-dom", served + path)).decode()
    text = DomText()
    text.feed(dom)
    words = " ".join(text.chunks)
    assert heading in words
    for entry in ("Getting started", "Writing tasks", "Guarantees and failure behaviour", "API"):
        assert entry in words  # the navigation, rendered
    assert "md-search" in dom  # Material's search box


def test_the_readme_fits_on_a_few_screens():
    assert len(README.read_text().splitlines()) <= 300
