"""Test helpers for fencekit users and for fencekit's own suite.

:class:`RedisServer` runs a private ``redis-server`` (or ``valkey-server``) as a
child process on a free loopback port, so tests never depend on a Redis that
happens to be running. Faults are real: :meth:`RedisServer.kill` sends
SIGKILL, :meth:`RedisServer.pause` SIGSTOP, :meth:`RedisServer.restart` brings
the same port back (with its AOF when ``appendonly=True``). No server binary
is an error, never a skip.
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

__all__ = [
    "RedisServer",
    "ServerBinaryMissing",
    "find_server_binary",
    "free_port",
    "redis_server",
    "valkey_binary",
    "wait_until",
]
