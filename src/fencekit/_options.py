"""How a setting declared in :mod:`fencekit.settings` becomes arguments, variables and flags.

:class:`Option` is what a declaration carries; :func:`table` reads the
declarations of a TypedDict into :class:`Setting` rows; :func:`resolve`
applies the precedence (argument, ``FENCEKIT_<NAME>`` or ``FENCEKIT_<NAME>_FILE``
for a secret, default) and each setting's check, once. Nothing here names a
setting: the table is :mod:`fencekit.settings`.
"""

from __future__ import annotations

import difflib
import os
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from fencekit.errors import ConfigError

__all__ = ["ENV_PREFIX", "Option", "Setting", "defaults", "describe", "given", "resolve", "table", "with_url"]

ENV_PREFIX = "FENCEKIT_"
_OFF = frozenset(("", "none", "off", "null"))
_TRUE = frozenset(("1", "true", "yes", "on"))
MAX_FLOAT = 1e10
"""A float setting is above -1e10 and below 1e10 (every one is seconds or a rate): NaN, the
infinities and 1e308 are refused here, not met later as an OverflowError in a loop."""
MAX_INT = 2**53
"""An int setting is an exact double (the scripts read numbers as Lua doubles)."""
_FALSE = frozenset(("0", "false", "no", "off", ""))


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
    def is_switch(self) -> bool:
        """A ``bool`` setting: a flag without a value (``--burst``), ``FENCEKIT_BURST=1``."""
        return self.base is bool

    @property
    def base(self) -> type:
        """The type without ``None``: bool, int, float or str."""
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
            elif self.is_switch:
                value = _switch(text)
            elif self.optional and text.strip().lower() in _OFF:
                value = None
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
        if base is bool:
            if not isinstance(value, bool):
                raise ValueError(f"be True or False, got {value!r}")
            return value
        if base is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"be a number, got {value!r}")
            if not -MAX_FLOAT < value < MAX_FLOAT:  # NaN too
                raise ValueError(f"be a number between -1e10 and 1e10, got {value!r}")
            return float(value)
        if base is int:
            if type(value) is not int:
                raise ValueError(f"be an int, got {value!r}")
            if not -MAX_INT < value < MAX_INT:
                raise ValueError(f"be an int between -2**53 and 2**53, got {value!r}")
            return value
        if get_origin(base) is dict:  # a table such as queue_weights: its check validates the items
            if not isinstance(value, dict):
                raise ValueError(f"be a dict, got {type(value).__name__}")
            return dict(value)
        if isinstance(value, Path):
            value = str(value)
        if not isinstance(value, str):
            raise ValueError(f"be a str, got {type(value).__name__}")
        return value

    def _error(self, source: str, exc: ValueError, value: object) -> ConfigError:
        message = str(exc)
        if not message.startswith(("be ", "not be ")):
            message = f"be a valid {self.base.__name__}, got {'***' if self.option.secret else repr(value)}"
        if self.option.secret:
            message = message.split(", got ")[0]
        return ConfigError(f"{self.name} must {message} ({source})")


def _switch(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"be one of 1, true, yes, on or 0, false, no, off, got {text!r}")


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
