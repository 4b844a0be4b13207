"""Fixtures of the integration tests: the primitives' adapters (``tests/primitives_api.py``) and
plain redis-py clients to look at Redis directly."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio
from tests.primitives_api import Api
from tests.servers import direct


@pytest.fixture(
    params=[("sync", False), ("sync", True), ("async", False), ("async", True)],
    ids=["sync-bytes", "sync-decoded", "async-bytes", "async-decoded"],
)
async def api(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[Api]:
    adapter = Api(request.param[0], request.param[1], redis_url)
    yield adapter
    await adapter.close()


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    """A plain bytes client of the session server (a file may define its own ``r``)."""
    client = direct(redis_url)
    yield client
    client.close()


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client to look at Redis directly."""
    client = direct(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture(scope="session")
def chromium() -> str:
    """The Chromium binary; its absence fails the test (CI installs the ``chromium`` package)."""
    explicit = os.environ.get("FENCEKIT_CHROMIUM")
    found = explicit or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail(
            "headless Chromium not found: install it with `apt-get install -y chromium` "
            "(or set FENCEKIT_CHROMIUM to a Chromium/Chrome binary)",
            pytrace=False,
        )
    return found
