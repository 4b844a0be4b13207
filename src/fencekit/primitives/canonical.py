"""Canonical JSON of a job payload, and the idempotency key derived from it.

Two deliveries of "the same work" must produce the same key, whatever order
their dictionaries were built in, so the key is a hash of a *canonical* form:

- mappings (with ``str`` keys only) are written with their keys sorted, at
  every depth;
- sequences (``list``, ``tuple`` and other non-text sequences) keep their order;
- ``int`` and ``float`` keep their distinct JSON spellings (``1`` is not
  ``1.0``): a payload that changes type is different work;
- ``True``/``False``/``None`` are ``true``/``false``/``null``;
- output is compact (``","`` and ``":"``) and ASCII-only (``ensure_ascii``).

Anything JSON cannot spell exactly is refused with :class:`CanonicalizeError`
instead of being coerced: NaN and Infinity, ``bytes``, sets, datetimes,
non-``str`` mapping keys and arbitrary objects. Coercion (``str(datetime)``,
``sorted(set)``) would make two callers that coerce differently disagree on
the key.

:func:`idempotency_key` returns ``"{namespace}:{sha256 hex}"`` of the UTF-8
canonical JSON; the same payload gives the same key as the published fencekit
releases, byte for byte.

:func:`dumps_json` and :func:`loads_json` use the same strict rule for the
result memos of :class:`~fencekit.IdempotencyGuard` (any JSON value at the top
level, not only a mapping).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from fencekit.errors import CanonicalizeError

__all__ = ["JSONValue", "canonicalize", "dumps_json", "idempotency_key", "loads_json"]

JSONValue: TypeAlias = "bool | int | float | str | list[JSONValue] | dict[str, JSONValue] | None"

_TEXT_LIKE = (str, bytes, bytearray, memoryview)


def _normalize(value: object, path: str) -> JSONValue:
    """``value`` rebuilt from plain JSON types, or :class:`CanonicalizeError`.

    Subclasses (``IntEnum``, ``str`` subclasses) are reduced to their base
    value, so the output does not depend on a subclass's ``__repr__``.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CanonicalizeError(
                f"{path}: non-finite float {value!r} has no JSON form (NaN/Infinity are refused)"
            )
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, Mapping):
        out: dict[str, JSONValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalizeError(f"{path}: mapping keys must be str, got {type(key).__name__} {key!r}")
            out[str.__str__(key)] = _normalize(item, f"{path}[{key!r}]")
        return out
    if isinstance(value, Sequence) and not isinstance(value, _TEXT_LIKE):
        return [_normalize(item, f"{path}[{i}]") for i, item in enumerate(value)]
    hint = ""
    if isinstance(value, (bytes, bytearray, memoryview)):
        hint = " (decode bytes to str first)"
    elif isinstance(value, (set, frozenset)):
        hint = " (sets have no order: pass a sorted list)"
    elif hasattr(value, "isoformat"):
        hint = " (pass dates and times as ISO-8601 strings)"
    raise CanonicalizeError(
        f"{path}: unsupported type {type(value).__name__} for canonical JSON{hint}; "
        "use dict, list, tuple, str, int, float, bool or None"
    )


def _encode(value: JSONValue) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def canonicalize(payload: Mapping[str, Any]) -> str:
    """The canonical JSON text of ``payload`` (a mapping with ``str`` keys).

    Raises :class:`CanonicalizeError` when the top level is not a mapping or
    anything inside has no exact JSON form (see the module docstring).
    """
    if not isinstance(payload, Mapping):
        raise CanonicalizeError(f"payload must be a mapping with str keys, got {type(payload).__name__}")
    try:
        return _encode(_normalize(payload, "payload"))
    except RecursionError:
        raise CanonicalizeError("payload is nested too deeply (or contains itself)") from None


def validate_namespace(namespace: object) -> str:
    """A key namespace: a non-empty ``str`` without ``:`` or whitespace."""
    if not isinstance(namespace, str) or not namespace:
        raise CanonicalizeError(f"namespace must be a non-empty str, got {namespace!r}")
    if ":" in namespace or any(ch.isspace() for ch in namespace):
        raise CanonicalizeError(f"namespace must not contain ':' or whitespace: {namespace!r}")
    return namespace


def idempotency_key(payload: Mapping[str, Any], *, namespace: str) -> str:
    """``"{namespace}:{sha256 hex of the canonical JSON}"`` for ``payload``.

    The key names one unit of work: equal payloads (in any key order) give
    equal keys, and the namespace keeps different kinds of work apart.
    """
    namespace = validate_namespace(namespace)
    digest = hashlib.sha256(canonicalize(payload).encode("utf-8")).hexdigest()
    return f"{namespace}:{digest}"


def dumps_json(value: object) -> str:
    """Strict compact JSON of any JSON value (a result memo), by the canonical rule."""
    try:
        return _encode(_normalize(value, "value"))
    except RecursionError:
        raise CanonicalizeError("value is nested too deeply (or contains itself)") from None


def loads_json(text: str | bytes) -> Any:
    """Parse JSON written by :func:`dumps_json` (``str`` or UTF-8 ``bytes``)."""
    return json.loads(text)
