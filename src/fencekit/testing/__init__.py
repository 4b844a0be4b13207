"""Test helpers for fencekit users and for fencekit's own suite.

:class:`RedisServer` runs a private ``redis-server`` (or ``valkey-server``) as a
child process on a free loopback port, so tests never depend on a Redis that
happens to be running. Faults are real: :meth:`RedisServer.kill` sends
SIGKILL, :meth:`RedisServer.pause` SIGSTOP, :meth:`RedisServer.restart` brings
the same port back (with its AOF when ``appendonly=True``). No server binary
is an error, never a skip.

:func:`drain` (and :func:`drain_sync`) runs an app's tasks in the test's
process until its queues are empty and returns what ran (:class:`Drained`;
:mod:`fencekit.testing.drain`). The pytest plugin
``fencekit.testing.pytest`` (opt-in: ``pytest_plugins =
["fencekit.testing.pytest"]``) provides a private Redis, a clean one per
test and a ``Client`` on it. See ``docs/guides/testing.md``.
"""

from __future__ import annotations

from fencekit._redis.process import (
    RedisServer,
    ServerBinaryMissing,
    find_server_binary,
    free_port,
    redis_server,
    valkey_binary,
    wait_until,
)
from fencekit.testing.drain import Drained, Failed, Succeeded, drain, drain_sync

__all__ = [
    "Drained",
    "Failed",
    "RedisServer",
    "ServerBinaryMissing",
    "Succeeded",
    "drain",
    "drain_sync",
    "find_server_binary",
    "free_port",
    "redis_server",
    "valkey_binary",
    "wait_until",
]
