"""The script loader: ``lua/*.lua`` read as package data, ``--!include`` expanded, SHA1 computed.

Each ``.lua`` file is one atomic state transition and opens with a header that
lists its KEYS, ARGV and replies. A line ``--!include other.lua`` is replaced by
that file's text (shared helpers such as token issuance live once). The files
stay in ``fencekit/_redis/lua/`` (package data of ``fencekit._redis``), found
with :mod:`importlib.resources`, so a wheel and an editable install read the same.

A builder (one per script, in the sibling modules) returns a :class:`Call`;
runners (:func:`fencekit._redis.run.run`, :func:`fencekit._redis.run.arun`, the
lean connection) execute it by SHA and load the script on ``NOSCRIPT``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from fencekit.errors import ConfigError

Arg = bytes | str | int | float

_INCLUDE = re.compile(r"^--!include (\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script: its name, expanded source and SHA1 (for EVALSHA)."""

    name: str
    source: str
    sha: str


@dataclass(frozen=True, slots=True)
class Call:
    """One script invocation: which script, its KEYS and its ARGV, in order."""

    script: Script
    keys: tuple[str, ...]
    args: tuple[Arg, ...]


def _read(name: str) -> str:
    return resources.files("fencekit._redis").joinpath("lua").joinpath(name).read_text("utf-8")


def _expand(source: str, seen: frozenset[str] = frozenset()) -> str:
    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in seen:
            raise ConfigError(f"recursive --!include of {name}")
        return _expand(_read(name), seen | {name})

    return _INCLUDE.sub(include, source)


def load(name: str) -> Script:
    """Load ``lua/<name>.lua`` with its includes expanded."""
    source = _expand(_read(f"{name}.lua"))
    return Script(name, source, hashlib.sha1(source.encode("utf-8")).hexdigest())


def script_names() -> list[str]:
    """Every script file (not include-only helpers, whose names start with ``_``)."""
    lua_dir = resources.files("fencekit._redis").joinpath("lua")
    return sorted(
        entry.name[:-4]
        for entry in lua_dir.iterdir()
        if entry.name.endswith(".lua") and not entry.name.startswith("_")
    )


class _Scripts:
    """Lazily loaded scripts, one attribute per ``lua/<name>.lua``."""

    def __getattr__(self, name: str) -> Script:
        script = load(name)
        setattr(self, name, script)
        return script


SCRIPTS = _Scripts()


def call(name: str, keys: Sequence[str], args: Sequence[Arg]) -> Call:
    """Build a :class:`Call` of script ``name`` (used by the typed builders)."""
    return Call(getattr(SCRIPTS, name), tuple(keys), tuple(args))
