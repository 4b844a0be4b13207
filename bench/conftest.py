"""Shared fixtures, and ``bench_*.py`` collected as tests (``pytest bench/ --benchmark-only``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencekit.testing import RedisServer, ServerBinaryMissing, find_server_binary


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if parent.session.isinitpath(file_path):
        return None  # named on the command line: pytest's own collector takes it
    if file_path.suffix == ".py" and file_path.name.startswith("bench_"):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


@pytest.fixture(scope="session")
def server_binary() -> str:
    """The server binary, as in ``tests/conftest.py``: ``FENCEKIT_TEST_SERVER=valkey`` picks Valkey."""
    try:
        return find_server_binary(os.environ.get("FENCEKIT_TEST_SERVER") or None)
    except ServerBinaryMissing as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def server(server_binary: str) -> Iterator[RedisServer]:
    """A private Redis for one benchmark module."""
    with RedisServer(binary=server_binary) as srv:
        yield srv


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One uvloop loop per module (asyncio's when uvloop is missing)."""
    try:
        import uvloop

        event_loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()
