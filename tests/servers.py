"""Which server a test runs on: the flavor the run asked for, and the one a server says it is.

``FENCEKIT_TEST_SERVER=valkey`` (or ``redis``) asks for one flavor; every server
a test starts must then be built with the session's ``server_binary`` fixture
(TLS tests apart: only Debian's redis-server is built with TLS). The session's
fixtures check the servers they start with :func:`check_flavor`;
``tests/unit/test_server_binaries.py`` checks that every server built in the
suite's source takes ``binary=server_binary``.

``FENCEKIT_TEST_TOPOLOGY=cluster`` gives the tests that take ``redis_url`` a
``redis+cluster://`` URL of a session-wide 3-master Redis Cluster instead of
one server; a test module that looks at Redis directly does it through
:func:`direct`, which is a ``redis.RedisCluster`` there.
"""

from __future__ import annotations

import os
from typing import Any, cast

import pytest
import redis

from fencekit._redis.clients import sync_client
from fencekit._redis.url import parse_url
from fencekit.testing import RedisServer

FLAVOR = os.environ.get("FENCEKIT_TEST_SERVER") or None
TOPOLOGY = os.environ.get("FENCEKIT_TEST_TOPOLOGY") or "single"
if TOPOLOGY not in ("single", "cluster"):
    raise RuntimeError(f"FENCEKIT_TEST_TOPOLOGY must be single or cluster, got {TOPOLOGY!r}")


def direct(url: str, **kwargs: Any) -> redis.Redis:
    """A plain redis-py client of ``url`` to look at Redis directly (a RedisCluster for a cluster URL)."""
    if parse_url(url).is_cluster:
        return sync_client(url, **kwargs)
    return redis.Redis.from_url(url, **kwargs)


def flavor_of(server: RedisServer) -> str:
    """``"valkey"`` or ``"redis"``, as the running server says in ``INFO server``."""
    with server.client() as client:
        info = client.info("server")
    if "valkey_version" in info or info.get("server_name") == "valkey":
        return "valkey"
    assert "redis_version" in info, info
    return "redis"


def check_flavor(server: RedisServer) -> None:
    """Fail the test when the run asked for a flavor and ``server`` is another one."""
    if FLAVOR is None:
        return
    actual = flavor_of(server)
    if actual != FLAVOR:
        pytest.fail(
            f"FENCEKIT_TEST_SERVER={FLAVOR} but the server on port {server.port} is {actual} "
            f"({server.binary}): build it with the server_binary fixture",
            pytrace=False,
        )


def nodes(r: Any) -> list[redis.Redis]:
    """The plain clients of every primary behind ``r`` (``[r]`` for a single server)."""
    if isinstance(r, redis.RedisCluster):
        return [node.redis_connection for node in r.get_primaries()]
    return [r]


def node_of(r: Any, key: str) -> redis.Redis:
    """The plain client of the server holding ``key`` (``r`` itself for a single server)."""
    if isinstance(r, redis.RedisCluster):
        return r.get_node_from_key(key).redis_connection
    return cast(redis.Redis, r)


def client_lists(r: Any) -> list[dict[str, Any]]:
    """``CLIENT LIST`` of every server behind ``r``, one list."""
    return [c for node in nodes(r) for c in node.client_list()]
