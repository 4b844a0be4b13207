"""A minimal systemd notify client (``sd_notify``), without a dependency.

Sends datagrams such as ``READY=1``, ``WATCHDOG=1``, ``STOPPING=1`` to
``$NOTIFY_SOCKET`` when it is set (a path, or ``@name`` for an abstract
socket); does nothing otherwise. The socket is opened per message with
``SOCK_CLOEXEC``, so it never leaks into forked children (children also drop
``NOTIFY_SOCKET`` from their environment).
"""

from __future__ import annotations

import os
import socket


def watchdog_interval() -> float | None:
    """Half of systemd's ``WatchdogSec`` for this process, or None when off."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2_000_000
    except ValueError:
        return None


def notify(*states: str) -> bool:
    """Send ``states`` (joined by newlines); True when a socket was there to send to."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto("\n".join(states).encode(), address)
        except OSError:
            return False
    return True
