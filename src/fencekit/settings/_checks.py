"""The checks of the settings' values (:mod:`fencekit.settings`): each returns the value, maybe
normalised, or raises ``ValueError`` saying what the value must be (``resolve`` names the setting)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from fencekit._redis.keys import validate_prefix
from fencekit._redis.url import parse_url

_OFF = frozenset(("", "none", "off", "null"))


def at_least(low: float) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value < low:
            raise ValueError(f"be >= {low:g}, got {value!r}")
        return value

    return check


def positive(value: Any) -> Any:
    if not value > 0:
        raise ValueError(f"be positive, got {value!r}")
    return value


def _port(value: int | None) -> int | None:
    if value is not None and not 0 <= value < 65536:
        raise ValueError(f"be a port from 0 to 65535 (0: any free port; off: no web server), got {value!r}")
    return value


def _url(value: str) -> str:
    parse_url(value)  # ConfigError with the redacted URL
    return value


def _prefix(value: str) -> str:
    return validate_prefix(value)


def _link(value: str) -> str:
    if value not in ("lean", "redis-py"):
        raise ValueError(f"be 'lean' or 'redis-py', got {value!r}")
    return value


def _log_format(value: str) -> str:
    if value.lower() not in ("text", "json"):
        raise ValueError(f"be text or json, got {value!r}")
    return value.lower()


def _log_level(value: str) -> str:
    level = value.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError(f"be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got {value!r}")
    return level


def _not_empty(value: str | None) -> str | None:
    if value is not None and not value:
        raise ValueError("not be an empty string")
    return value


def _port_text(text: str) -> int | None:
    return None if text.strip().lower() in (*_OFF, "-1") else int(text)


def _cpu_count() -> int:
    return os.cpu_count() or 1


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def sql_identifier(value: str) -> str:
    """A plain SQL identifier (the outbox table's name goes into statements unquoted)."""
    if not isinstance(value, str) or not _IDENTIFIER.match(value):
        raise ValueError(f"be a plain SQL identifier (letters, digits and _, at most 63), got {value!r}")
    return value


def sql_url(value: str | None) -> str | None:
    """A SQLAlchemy URL, checked for its form only (the driver is loaded when it connects)."""
    if value is None:
        return None
    try:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError
    except ImportError:
        raise ValueError("need SQLAlchemy: pip install 'fencekit-jobs[sql]'") from None

    try:
        make_url(value)
    except ArgumentError:
        raise ValueError("be a SQLAlchemy URL such as postgresql+psycopg://user@host/db") from None
    return value
