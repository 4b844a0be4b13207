"""A pytest plugin for testing code that uses fencekit: a private Redis, clean per test, and a ``Client``.

Opt-in, never auto-registered (its fixtures must not meet a project's own):
``pytest_plugins = ["fencekit.testing.pytest"]`` in the top ``conftest.py``, or
``pytest -p fencekit.testing.pytest``. Every fixture name starts with
``fencekit_``:

``fencekit_redis_server`` (session)
    a private ``redis-server`` (or ``valkey-server``) on a free loopback
    port, started once (:class:`fencekit.testing.RedisServer`); no server
    binary fails the test with what to install, it never skips.
``fencekit_redis_url``
    that server's URL, **flushed** (FLUSHALL and SCRIPT FLUSH) for this
    test, and set as ``FENCEKIT_REDIS_URL`` for the test's duration, so a
    ``Client()`` or ``Server()`` built without a URL -- in the code under
    test too -- and :func:`fencekit.testing.drain` use it. Flushing rather
    than a fresh key prefix: the code under test keeps the prefix it would
    use in production.
``fencekit_client``
    a :class:`fencekit.Client` on it, closed after the test. It is an async
    fixture: declared with ``pytest_asyncio.fixture`` when pytest-asyncio is
    installed (strict or auto mode), else a plain async fixture, which
    anyio's plugin runs for ``@pytest.mark.anyio`` tests.

Run the app's tasks with ``await fencekit.testing.drain(app)`` (async
tests) or ``drain_sync(app)`` (sync tests, e.g. Django's): both need only
``fencekit_redis_url``. See ``docs/guides/testing.md``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from fencekit.produce.client import Client
from fencekit.testing import RedisServer, ServerBinaryMissing, find_server_binary

__all__ = ["fencekit_client", "fencekit_redis_server", "fencekit_redis_url"]


def _async_fixture() -> Callable[[Any], Any]:
    """``pytest_asyncio.fixture`` when pytest-asyncio is installed, else ``pytest.fixture``."""
    try:
        import pytest_asyncio
    except ImportError:
        return pytest.fixture
    return pytest_asyncio.fixture


@pytest.fixture(scope="session")
def fencekit_redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private Redis for the session (see the module docstring)."""
    try:
        binary = find_server_binary()
    except ServerBinaryMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    server = RedisServer(tmp_path_factory.mktemp("fencekit-redis"), binary=binary)
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def fencekit_redis_url(fencekit_redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """The private Redis's URL, flushed for this test and set as ``FENCEKIT_REDIS_URL``."""
    if not fencekit_redis_server.is_running:
        fencekit_redis_server.start()
    with fencekit_redis_server.client() as client:
        client.flushall()
        client.script_flush()
    url = fencekit_redis_server.url(0)
    monkeypatch.setenv("FENCEKIT_REDIS_URL", url)
    return url


@_async_fixture()
async def fencekit_client(fencekit_redis_url: str) -> AsyncIterator[Client]:
    """A ``Client`` on the test's clean Redis (settings otherwise from ``FENCEKIT_*`` or defaults)."""
    client = Client(fencekit_redis_url)
    try:
        yield client
    finally:
        await client.close()
