"""Where the pool's embedded Redis listens: a record in its data directory.

The embedded server (:mod:`fencekit._redis.embedded`) listens on a unix socket
in its data directory, ``<dir>/redis.sock``, and while it runs its directory
keeps ``<dir>/redis.json`` -- ``{"url", "server", "owner"}``: the socket URL,
the server's pid and the pid of the process that stops it. So the address is
the same on every start, and :func:`default_url` -- the default the settings
show for ``redis_url`` -- is that URL while the recorded server lives. A part
that connects with no URL given starts the server when none runs
(:func:`fencekit._redis.embedded.default_url`); the CLI asks for a URL.

Reading the record costs a stat, a small read and ``kill(pid, 0)``: no
network. The data directory is ``$FENCEKIT_DATA_DIR``, else
``$XDG_DATA_HOME/fencekit``, else ``~/.local/share/fencekit``.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from fencekit._redis.url import DEFAULT_URL

__all__ = ["DEFAULT_URL", "Record", "data_home", "default_url", "forget", "read", "socket_path", "write"]

RECORD = "redis.json"
SOCKET = "redis.sock"
_MAX_SOCKET_PATH = 100  # AF_UNIX paths end at 107 bytes


def data_home() -> Path:
    """The data directory the embedded Redis uses when none is given."""
    explicit = os.environ.get("FENCEKIT_DATA_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "fencekit"


def socket_path(directory: Path) -> Path | None:
    """``<directory>/redis.sock``, or None when that path is too long for a unix socket."""
    path = directory.resolve() / SOCKET
    return path if len(os.fsencode(path)) <= _MAX_SOCKET_PATH else None


@dataclass(frozen=True, slots=True)
class Record:
    """A running embedded server: its URL, its pid, and the pid of the pool that stops it."""

    url: str
    server: int
    owner: int

    @property
    def owner_alive(self) -> bool:
        return _alive(self.owner)


def read(directory: Path) -> Record | None:
    """The record of ``directory`` when its server process still runs, else None."""
    try:
        data = json.loads((directory / RECORD).read_text())
        record = Record(str(data["url"]), int(data["server"]), int(data["owner"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if _alive(record.server) else None


def write(directory: Path, record: Record) -> None:
    """Record a running server (atomically: a reader sees the old record or the new one)."""
    tmp = directory / f".{RECORD}.{os.getpid()}"
    tmp.write_text(json.dumps({"url": record.url, "server": record.server, "owner": record.owner}))
    tmp.replace(directory / RECORD)


def forget(directory: Path) -> None:
    """Remove the record (the server stopped)."""
    with contextlib.suppress(FileNotFoundError):
        (directory / RECORD).unlink()


def default_url() -> str:
    """The embedded server's URL while it runs, else :data:`DEFAULT_URL`."""
    record = read(data_home())
    return record.url if record is not None else DEFAULT_URL


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, as another user
    return True
