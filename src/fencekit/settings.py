"""Every setting of ``Client``, ``Server`` and the pool, declared once.

A setting is one entry of the TypedDicts below: its name, its type and an
:class:`Option` (default, check, help). Everything else is derived from those
entries, so a new setting is one line here plus its use:

- the typed keyword arguments of ``Client(...)``, ``Server(...)`` and
  ``Pool(...)`` (PEP 692 ``**options: Unpack[...]``: mypy checks them);
- the environment variable ``FENCEKIT_<NAME>`` of each, read when the
  argument is not given (``FENCEKIT_<NAME>_FILE`` for a secret: the value is
  the file's content, as Docker secrets and systemd credentials provide it);
- the ``--name`` flag of ``fencekit pool`` and its ``--help`` line (see
  :mod:`fencekit.pool.cli`);
- the settings handed to a pool child (a resolved mapping is JSON; the
  child checks it again with :func:`resolve`).

Precedence: an explicit argument or flag, then the environment, then the
default. Every value is checked once, in :func:`resolve`, and a bad one is a
:class:`~fencekit.errors.ConfigError` naming the setting and where it came
from. Resolved settings are the same TypedDicts with every key present.
"""

from __future__ import annotations

import difflib
import math
import os
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

from typing_extensions import TypedDict

from fencekit._redis.keys import DEFAULT_PREFIX, validate_prefix
from fencekit._redis.url import DEFAULT_URL, parse_url
from fencekit.errors import ConfigError
from fencekit.queue.codec import DEFAULT_MAX_PAYLOAD

ENV_PREFIX = "FENCEKIT_"
_OFF = frozenset(("", "none", "off", "null"))
_TRUE = frozenset(("1", "true", "yes", "on"))
_FALSE = frozenset(("0", "false", "no", "off"))


@dataclass(frozen=True)
class Option:
    """How one setting behaves: default, check, help text and how it reads from text.

    ``default`` may be a zero-argument callable (computed when resolved, e.g.
    the CPU count). ``check(value)`` returns the value to use or raises
    ``ValueError`` with a message that completes "<name> must ..." (the name
    and source are added). ``parse(text)`` reads it from the environment or a
    flag (derived from the type when left out). A ``secret`` never shows its
    value in help or errors and may come from ``FENCEKIT_<NAME>_FILE``.
    ``flag`` False keeps it out of ``--help`` (it still works).
    """

    default: Any
    help: str
    check: Callable[[Any], Any] | None = None
    parse: Callable[[str], Any] | None = None
    secret: bool = False
    flag: bool = True
    choices: tuple[str, ...] | None = None
    metavar: str | None = None

    def default_value(self) -> Any:
        return self.default() if callable(self.default) else self.default


# checks ----------------------------------------------------------------------------


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


# the settings ------------------------------------------------------------------------


class UrlOption(TypedDict, total=False):
    """Where Redis is: a positional argument of ``Client``/``Server``, so kept apart."""

    redis_url: Annotated[
        str,
        Option(
            DEFAULT_URL,
            "Redis URL: redis://, rediss://, unix:// or redis+sentinel:// (a password is better "
            "kept in the environment than on a command line)",
            check=_url,
            secret=True,
            metavar="URL",
        ),
    ]


class ClientOptions(TypedDict, total=False):
    """The settings of a producer (``Client``); ``Server`` and the pool have them too."""

    prefix: Annotated[
        str, Option(DEFAULT_PREFIX, "key prefix: every key starts with '<prefix>:'", check=_prefix)
    ]
    max_payload: Annotated[
        int, Option(DEFAULT_MAX_PAYLOAD, "largest encoded task in bytes", check=at_least(64), metavar="BYTES")
    ]
    durable_replicas: Annotated[
        int,
        Option(
            0, "enqueues and acks wait (WAIT) for this many replicas; 0: off", check=at_least(0), metavar="N"
        ),
    ]
    durable_timeout: Annotated[
        float,
        Option(1.0, "seconds WAIT may take before DurabilityError", check=positive, metavar="S"),
    ]


class ServerOptions(ClientOptions, total=False):
    """The settings of the consumers and the shared services (``Server`` and the pool)."""

    concurrency: Annotated[int, Option(1, "tasks one consumer runs at once", check=at_least(1), metavar="N")]
    heartbeat_ttl: Annotated[
        float,
        Option(
            30.0, "seconds a consumer stays registered without a heartbeat", check=at_least(0.5), metavar="S"
        ),
    ]
    grace: Annotated[
        float,
        Option(10.0, "seconds running tasks get to finish at a stop", check=at_least(0.0), metavar="S"),
    ]
    web_port: Annotated[
        int | None,
        Option(3030, "port of /live /ready /admin /metrics (0: any free port; off: none)", check=_port,
               parse=_port_text, metavar="PORT"),
    ]  # fmt: skip
    web_host: Annotated[str, Option("127.0.0.1", "address the web server binds", metavar="HOST")]
    admin_username: Annotated[
        str | None, Option(None, "user name of HTTP Basic Auth on /admin and /metrics", check=_not_empty)
    ]
    admin_password: Annotated[
        str | None,
        Option(
            None,
            "password of HTTP Basic Auth on /admin and /metrics (keep it in the environment)",
            check=_not_empty,
            secret=True,
        ),
    ]
    fence_ttl: Annotated[
        float,
        Option(
            7 * 24 * 3600.0,
            "seconds a job's fence key outlives its last raise (7 days)",
            check=positive,
            metavar="S",
        ),
    ]
    keep_dead: Annotated[
        int, Option(10_000, "dead letters kept per queue (oldest dropped)", check=at_least(0), metavar="N")
    ]
    link: Annotated[
        str, Option("lean", "hot-path connection: lean or redis-py (benchmarks)", check=_link, flag=False)
    ]


class PoolOptions(ServerOptions, total=False):
    """Settings only the pool has."""

    procs: Annotated[
        int, Option(_cpu_count, "child processes (default: CPU count)", check=at_least(1), metavar="N")
    ]
    hang_timeout: Annotated[
        float | None,
        Option(None, "kill a child whose loop is silent this long (default: heartbeat TTL)", check=positive,
               metavar="S"),
    ]  # fmt: skip
    log_level: Annotated[
        str,
        Option("INFO", "logging level of the pool", check=_log_level,
               choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")),
    ]  # fmt: skip
    data_dir: Annotated[
        str | None,
        Option(
            None, "data directory of the embedded Redis (default: ~/.local/share/fencekit)", metavar="DIR"
        ),
    ]


class ClientSettings(UrlOption, ClientOptions):
    """Resolved settings of a ``Client``: every key present."""


class ServerSettings(UrlOption, ServerOptions):
    """Resolved settings of a ``Server``: every key present."""


class PoolSettings(UrlOption, PoolOptions):
    """Resolved settings of the pool (supervisor and children): every key present."""


# the table -------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One row of the table: a setting's name, type and :class:`Option`."""

    name: str
    type: Any
    option: Option

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def optional(self) -> bool:
        return type(None) in _union_args(self.type)

    @property
    def base(self) -> type:
        """The type without ``None``: int, float, str or bool."""
        (base,) = [t for t in _union_args(self.type) if t is not type(None)]
        return base

    def help_text(self) -> str:
        """The ``--help`` line: the help, the default (unless the help says it) and the variable."""
        option = self.option
        parts = []
        if "default:" not in option.help:
            value = option.default
            shown = "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
            parts.append(f"default: {shown}")
        parts.append(f"env {self.env}" + (f" or {self.env}_FILE" if option.secret else ""))
        return f"{option.help} ({'; '.join(parts)})"

    def from_text(self, text: str, source: str) -> Any:
        """The value of ``text`` (an environment variable or a flag), checked."""
        try:
            if self.option.parse is not None:
                value = self.option.parse(text)
            elif self.optional and text.strip().lower() in _OFF:
                value = None
            elif self.base is bool:
                lowered = text.strip().lower()
                if lowered not in _TRUE | _FALSE:
                    raise ValueError(f"be true or false, got {text!r}")
                value = lowered in _TRUE
            else:
                value = self.base(text.strip()) if self.base is not str else text
        except ValueError as exc:
            raise self._error(source, exc, text) from None
        return self.checked(value, source)

    def checked(self, value: Any, source: str) -> Any:
        """``value`` of the right type and passing the option's check, or ConfigError."""
        try:
            value = self._typed(value)
            if value is not None and self.option.check is not None:
                value = self.option.check(value)
        except ConfigError as exc:
            raise ConfigError(f"{self.name} ({source}): {exc}") from None
        except ValueError as exc:
            raise self._error(source, exc, value) from None
        return value

    def _typed(self, value: Any) -> Any:
        if value is None:
            if self.optional:
                return None
            raise ValueError("be set, got None")
        base = self.base
        if base is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"be a number, got {value!r}")
            return float(value)
        if base is int:
            if type(value) is not int:
                raise ValueError(f"be an int, got {value!r}")
            return value
        if base is bool:
            if type(value) is not bool:
                raise ValueError(f"be a bool, got {value!r}")
            return value
        if isinstance(value, Path):
            value = str(value)
        if not isinstance(value, str):
            raise ValueError(f"be a str, got {type(value).__name__}")
        return value

    def _error(self, source: str, exc: ValueError, value: object) -> ConfigError:
        message = str(exc)
        if not message.startswith("be "):
            message = f"be a valid {self.base.__name__}, got {'***' if self.option.secret else repr(value)}"
        if self.option.secret:
            message = message.split(", got ")[0]
        return ConfigError(f"{self.name} must {message} ({source})")


def _union_args(tp: Any) -> tuple[Any, ...]:
    if get_origin(tp) in (Union, types.UnionType):
        return get_args(tp)
    return (tp,)


def table(kind: type) -> dict[str, Setting]:
    """The settings of ``kind`` (one of the TypedDicts above), in declaration order."""
    cached = _TABLES.get(kind)
    if cached is None:
        hints = get_type_hints(kind, include_extras=True)
        cached = {}
        for name, hint in hints.items():
            tp, option = get_args(hint)
            cached[name] = Setting(name, tp, option)
        _TABLES[kind] = cached
    return cached


_TABLES: dict[type, dict[str, Setting]] = {}


def _env_value(setting: Setting, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """``(text, source)`` of the setting in ``environ``, or None when absent."""
    if setting.env in environ:
        return environ[setting.env], f"from {setting.env}"
    file_var = setting.env + "_FILE"
    if setting.option.secret and file_var in environ:
        path = environ[file_var]
        try:
            return Path(path).read_text().rstrip("\r\n"), f"from {file_var}"
        except OSError as exc:
            raise ConfigError(f"{file_var}={path!r}: cannot read it: {exc.strerror}") from None
    return None


def resolve(
    kind: type,
    explicit: Mapping[str, Any],
    *,
    environ: Mapping[str, str] | None = None,
    owner: str = "",
) -> Any:
    """Every setting of ``kind``: ``explicit`` values, else the environment, else the default.

    The result is a ``dict`` with every key of ``kind`` (typed as ``kind`` by
    the caller: TypedDict classes cannot be type parameters).

    ``environ`` defaults to ``os.environ``; pass ``{}`` to ignore it (a child
    re-checking what its supervisor resolved). Unknown names in ``explicit``
    are refused with the closest known one suggested.
    """
    settings = table(kind)
    unknown = [name for name in explicit if name not in settings]
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, settings, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{owner or kind.__name__}() got an unknown setting {name!r}{hint}")
    env = os.environ if environ is None else environ
    resolved: dict[str, Any] = {}
    for name, setting in settings.items():
        if name in explicit:
            resolved[name] = setting.checked(explicit[name], "argument")
            continue
        found = _env_value(setting, env)
        if found is not None:
            resolved[name] = setting.from_text(*found)
        else:
            resolved[name] = setting.checked(setting.option.default_value(), "default")
    return resolved


def given(
    kind: type, name: str, explicit: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> bool:
    """True when setting ``name`` of ``kind`` is in ``explicit`` or in the environment (not defaulted)."""
    if name in explicit:
        return True
    return _env_value(table(kind)[name], os.environ if environ is None else environ) is not None


def with_url(redis_url: str | None, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` plus ``redis_url`` when one was given (``None``: not given, so the environment decides)."""
    return {**options, "redis_url": redis_url} if redis_url is not None else dict(options)


def defaults(kind: type) -> Any:
    """Every setting of ``kind`` at its default (the environment ignored)."""
    return resolve(kind, {}, environ={})


def describe(kind: type) -> Iterator[tuple[str, str, str, str]]:
    """``(name, flag, environment variable, help)`` of each setting, for docs and tests."""
    for setting in table(kind).values():
        yield setting.name, setting.flag, setting.env, setting.help_text()
