"""The results page's examples (docs/guides/results.md) run as written."""

from __future__ import annotations

import pytest
from tests.docs_blocks import README, block_with, with_url


def test_the_flask_example_is_the_one_the_sync_client_tests_serve():
    """The README's Flask view is docs/examples/flask_enqueue.py, which test_sync_client_waits serves."""
    example = (README.parent / "docs" / "examples" / "flask_enqueue.py").read_text()
    assert block_with("from flask import Flask") == example


def test_the_sync_client_script_runs(redis_url: str, capsys: pytest.CaptureFixture[str]):
    exec(with_url(block_with("with SyncClient("), redis_url.rsplit("/", 1)[0]), {"__name__": "readme_sync"})
    assert capsys.readouterr().out.splitlines()[-1] == "scheduled True"
