"""The run's servers are the flavor it asked for (``FENCEKIT_TEST_SERVER``).

``.ci/run`` runs the integration tests again with ``FENCEKIT_TEST_SERVER=valkey``;
these ask the servers themselves (``INFO server``) which they are, so that pass
fails rather than silently testing redis-server again.
"""

from __future__ import annotations

from pathlib import Path

from tests.servers import FLAVOR, flavor_of

from fencekit.testing import RedisServer
from fencekit.testing.sentinel import LocalSentinel


def expected(binary: str) -> str:
    if FLAVOR is not None:
        return FLAVOR
    return "valkey" if "valkey" in Path(binary).name else "redis"


def test_the_session_server_is_the_flavor_the_run_asked_for(
    redis_server: RedisServer, server_binary: str
) -> None:
    assert redis_server.binary == server_binary
    assert flavor_of(redis_server) == expected(server_binary)


def test_a_private_server_is_the_flavor_the_run_asked_for(
    private_redis: RedisServer, server_binary: str
) -> None:
    assert flavor_of(private_redis) == expected(server_binary)


def test_a_server_a_test_builds_with_the_session_binary_is_that_flavor(
    tmp_path: Path, server_binary: str
) -> None:
    with RedisServer(tmp_path / "own", binary=server_binary, config={"requirepass": "pw"}) as server:
        assert flavor_of(server) == expected(server_binary)


def test_a_sentinel_deployment_runs_the_session_binary_on_every_node(
    tmp_path: Path, server_binary: str
) -> None:
    with LocalSentinel(tmp_path / "sentinel", binary=server_binary, sentinels=1) as deployment:
        for node in (*deployment.nodes, *deployment.sentinels):
            assert node.binary == server_binary
            assert flavor_of(node) == expected(server_binary)
