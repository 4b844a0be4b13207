"""RESP request encoder, pure Python: the specification of ``fencekit._redis._resp``.

Redis reads requests as RESP arrays of bulk strings::

    *<number of arguments>\\r\\n
    $<length of argument 1>\\r\\n<argument 1>\\r\\n
    ...

The compiled module ``ext/_resp.pyx`` must produce exactly the bytes this
module produces for every input, and raise :class:`~fencekit.errors.EncodeError`
for exactly the inputs this module rejects (the tests compare both on
generated inputs). Argument framing:

=========================  ==================================================
``bytes``, ``bytearray``   as is
``memoryview``             its bytes (``tobytes()``, so any shape works)
``str``                    UTF-8; a lone surrogate is an ``EncodeError``
``int``                    decimal digits, any size (``int.__repr__``)
``float``                  ``float.__repr__`` as redis-py does; NaN and
                           infinities are an ``EncodeError``
``bool``, anything else    ``EncodeError`` naming the type and position
=========================  ==================================================

Subclasses of the accepted types are framed by their base type's rules, so an
``IntEnum`` member is sent as its number and a ``str`` subclass as its text,
never through an overridden ``__repr__``/``__bytes__``. An empty command is an
``EncodeError`` too: Redis silently skips ``*0``, which would shift every later
reply onto the wrong caller.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import cast

from fencekit.errors import EncodeError

#: One argument the encoder can frame.
RespArg = bytes | bytearray | memoryview | str | int | float

_ACCEPTED = "bytes, bytearray, memoryview, str, int or float"
_PREFIX_CACHE_LIMIT = 1024
_prefix_cache: dict[str | bytes, bytes] = {}


def _type_error(where: str, arg: object) -> EncodeError:
    if isinstance(arg, bool):
        return EncodeError(f"{where}: cannot encode a bool (pass an int or bytes explicitly)")
    return EncodeError(f"{where}: cannot encode a {type(arg).__name__} (expected {_ACCEPTED})")


def _where(label: str, index: int) -> str:
    return label if index < 0 else f"{label}[{index}]"


def _bulk(parts: list[bytes | bytearray], arg: object, label: str, index: int) -> None:
    """Append the bulk-string frame of ``arg`` to ``parts``.

    ``label[index]`` (just ``label`` when ``index`` is negative) names the
    argument in error messages; it is formatted only when there is an error.
    """
    data: bytes | bytearray
    if isinstance(arg, (bytes, bytearray)):
        data = arg
    elif isinstance(arg, str):
        try:
            data = str.encode(arg, "utf-8")
        except UnicodeEncodeError as exc:
            raise EncodeError(
                f"{_where(label, index)}: str is not encodable as UTF-8 ({exc.reason} at index {exc.start})"
            ) from None
    elif isinstance(arg, bool):
        raise _type_error(_where(label, index), arg)
    elif isinstance(arg, int):
        data = int.__repr__(arg).encode("ascii")
    elif isinstance(arg, float):
        if not math.isfinite(arg):
            raise EncodeError(
                f"{_where(label, index)}: cannot encode the non-finite float {float.__repr__(arg)}"
            )
        data = float.__repr__(arg).encode("ascii")
    elif isinstance(arg, memoryview):
        try:
            data = arg.tobytes()
        except ValueError as exc:  # released view
            raise EncodeError(f"{_where(label, index)}: cannot encode a memoryview ({exc})") from None
    else:
        raise _type_error(_where(label, index), arg)
    parts.append(b"$%d\r\n" % len(data))
    parts.append(data)
    parts.append(b"\r\n")


def _as_list(what: str, items: object) -> list[object]:
    """``items`` as a list of arguments; a lone str/bytes is refused, not split."""
    if isinstance(items, (str, bytes, bytearray, memoryview)):
        raise EncodeError(f"{what} must be a sequence of arguments, not {type(items).__name__}")
    try:
        return list(cast("Iterable[object]", items))
    except TypeError:
        raise EncodeError(f"{what} must be a sequence of arguments, not {type(items).__name__}") from None


def _command(parts: list[bytes | bytearray], args: Sequence[object], label: str) -> None:
    if not args:
        raise EncodeError(f"{label}: cannot encode an empty command")
    parts.append(b"*%d\r\n" % len(args))
    for i, arg in enumerate(args):
        _bulk(parts, arg, label, i)


def pack_command(*args: RespArg) -> bytes:
    """One command as a RESP array of bulk strings."""
    parts: list[bytes | bytearray] = []
    _command(parts, args, "args")
    return b"".join(parts)


def pack_commands(commands: Iterable[Sequence[RespArg]]) -> bytes:
    """Several commands framed back to back (one pipeline write)."""
    parts: list[bytes | bytearray] = []
    for n, command in enumerate(_as_list("commands", commands)):
        _command(parts, _as_list(f"commands[{n}]", command), f"commands[{n}]")
    return b"".join(parts)


def _sha_prefix(sha: object) -> bytes:
    """``$7 EVALSHA $<n> <sha>`` framed; cached per SHA (a handful per process)."""
    if not isinstance(sha, (str, bytes)):
        raise EncodeError(f"sha: cannot encode a {type(sha).__name__} (expected str or bytes)")
    prefix = _prefix_cache.get(sha)
    if prefix is None:
        parts: list[bytes | bytearray] = [b"$7\r\nEVALSHA\r\n"]
        _bulk(parts, sha, "sha", -1)
        prefix = b"".join(parts)
        if len(_prefix_cache) >= _PREFIX_CACHE_LIMIT:
            _prefix_cache.clear()
        _prefix_cache[sha] = prefix
    return prefix


def pack_evalsha(sha: str | bytes, keys: Sequence[RespArg], args: Sequence[RespArg]) -> bytes:
    """``EVALSHA <sha> <numkeys> keys... args...`` as one RESP command."""
    prefix = _sha_prefix(sha)
    key_list = _as_list("keys", keys)
    arg_list = _as_list("args", args)
    numkeys = b"%d" % len(key_list)
    parts: list[bytes | bytearray] = [
        b"*%d\r\n" % (3 + len(key_list) + len(arg_list)),
        prefix,
        b"$%d\r\n%s\r\n" % (len(numkeys), numkeys),
    ]
    for i, key in enumerate(key_list):
        _bulk(parts, key, "keys", i)
    for i, arg in enumerate(arg_list):
        _bulk(parts, arg, "args", i)
    return b"".join(parts)
