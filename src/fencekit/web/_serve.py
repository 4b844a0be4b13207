"""Hosting the app in-process: :class:`WebServer` runs uvicorn inside the caller's event loop.

``Server`` and the pool supervisor own their process (signals, logging,
shutdown order), so uvicorn here installs no signal handler, does not touch
logging, and is started and stopped like any other task of the host: a
task of the web server's :class:`~fencekit._aio.scope.TaskScope`, which logs
at once a uvicorn that dies while serving; :meth:`WebServer.stop` ends it
gracefully, then closes the scope.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import socket
import time
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp

from fencekit._aio.scope import TaskScope
from fencekit.errors import ConfigError, FenceKitError

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "WebServer"]

DEFAULT_PORT = 3030
DEFAULT_HOST = "127.0.0.1"


class _HostedServer(uvicorn.Server):
    """uvicorn's server without its signal handling: the host process owns signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29 called this from serve()
        return


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class WebServer:
    """Serves an ASGI app with uvicorn inside the running event loop.

    ``start()`` binds the socket itself (so a busy port raises ``OSError``
    from ``start()`` instead of uvicorn's ``sys.exit``, and ``port=0`` picks
    a free port, readable as :attr:`port` afterwards), then returns once
    uvicorn is serving. ``stop()`` closes the listener, lets requests in
    progress finish within ``graceful_timeout`` seconds, and returns. No
    signal handler is installed and logging is not reconfigured.
    """

    def __init__(
        self,
        app: ASGIApp,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        logger: logging.Logger | None = None,
        access_log: bool = False,
        graceful_timeout: float = 2.0,
    ) -> None:
        if type(port) is not int or not 0 <= port < 65536:
            raise ConfigError(f"port must be an int from 0 to 65535, got {port!r}")
        self.app = app
        self.host = host
        self.port = port
        self.logger = logger or logging.getLogger("fencekit.web")
        self.access_log = access_log
        self.graceful_timeout = graceful_timeout
        self._server: _HostedServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None
        self._scope = TaskScope("web", logger=self.logger)

    @property
    def url(self) -> str:
        """``http://host:port`` of the listener (after :meth:`start`)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Bind, start serving, and return once requests are accepted."""
        if self.running:
            return
        sock = self._sock = _bind(self.host, self.port)
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self.app,
            log_config=None,
            access_log=self.access_log,
            lifespan="off",
            server_header=False,
            timeout_graceful_shutdown=max(1, math.ceil(self.graceful_timeout)),
        )
        server = _HostedServer(config)
        self._server = server
        self._task = self._scope.start(server.serve(sockets=[sock]), name="fencekit-web")
        started = time.monotonic()
        while not server.started:
            if self._task.done():
                sock.close()
                self._task.result()  # raises what stopped uvicorn
                raise FenceKitError("web server stopped while starting")
            if time.monotonic() - started > 10:
                await self.stop()
                raise FenceKitError("web server did not start within 10 s")
            await asyncio.sleep(0.005)
        self.logger.info("web: serving /live /ready /admin /metrics on %s", self.url)
        state = getattr(self.app, "state", None)
        if getattr(state, "admin_open", False) and not _is_loopback(self.host):
            self.logger.warning(
                "web: /admin is open without credentials on %s (not a loopback address); "
                "set admin_username and admin_password to require HTTP Basic Auth",
                self.host,
            )

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        server, task = self._server, self._task
        if server is None or task is None:
            return
        server.should_exit = True
        try:
            await task
        except (Exception, SystemExit) as exc:
            self.logger.warning("web: server stopped with %r", exc)
        finally:
            self._server = self._task = None
            await self._scope.aclose()
            if self._sock is not None:  # uvicorn closes it, unless stopped before it took it over
                self._sock.close()
                self._sock = None
        self.logger.info("web: stopped")


def _bind(host: str, port: int) -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port`` (IPv4 or IPv6)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
