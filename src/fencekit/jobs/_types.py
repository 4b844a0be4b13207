"""A task function's plain annotations as JSON-level checks of its params (no I/O).

``def nap(seconds: float)`` enqueued as ``nap.enqueue_sync("abc")`` used to be
accepted and to fail in the worker with a ``TypeError`` that was retried. The
binder (:mod:`fencekit.jobs._binding`) now checks each argument against its
parameter's annotation where the annotation is plain -- ``int``, ``float``,
``str``, ``bool``, ``None``, ``list[...]``, ``dict[str, ...]``, ``Optional``
and unions of those, ``TypedDict`` -- at enqueue (a ``PayloadError`` naming the
parameter) and on the worker (a dead letter naming it, never a retry).
Anything else (``Any``, a class, ``datetime``, no annotation, an annotation
that does not resolve) is not checked: the function's own code decides.

JSON has one number type for floats: a ``float`` parameter takes an ``int``
too, as Python's numeric tower does; ``bool`` is not an ``int`` here.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any, Union, get_args, get_origin

from typing_extensions import is_typeddict

__all__ = ["Check", "checks_of"]

Check = Callable[[Any], bool]
"""True when the value fits the annotation."""

_PLAIN: dict[Any, Check] = {
    int: lambda v: type(v) is int,
    float: lambda v: type(v) in (int, float),
    str: lambda v: type(v) is str,
    bool: lambda v: type(v) is bool,
    type(None): lambda v: v is None,
    None: lambda v: v is None,
}


def checks_of(function: Callable[..., Any]) -> dict[str, tuple[Check, str]]:
    """Parameter name -> (check, the annotation as written) for the parameters with a plain one."""
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # a forward reference that does not resolve: nothing is checked
        return {}
    out = {}
    for name, hint in hints.items():
        if name == "return":
            continue
        check = _check_of(hint, depth=0)
        if check is not None:
            out[name] = (check, _describe(hint))
    return out


def _check_of(hint: Any, depth: int) -> Check | None:
    if depth > 8:  # a recursive alias: leave it to the function
        return None
    if hint in _PLAIN:
        return _PLAIN[hint]
    origin = get_origin(hint)
    args = get_args(hint)
    if origin is Union or origin is types.UnionType:
        members = [_check_of(a, depth + 1) for a in args]
        if any(m is None for m in members):
            return None
        checks = [m for m in members if m is not None]
        return lambda v: any(c(v) for c in checks)
    if origin is list and len(args) == 1:
        item = _check_of(args[0], depth + 1)
        if item is None:
            return lambda v: type(v) is list
        return lambda v: type(v) is list and all(item(x) for x in v)
    if hint is list:
        return lambda v: type(v) is list
    if origin is dict and len(args) == 2 and args[0] is str:
        value = _check_of(args[1], depth + 1)
        if value is None:
            return lambda v: type(v) is dict and all(type(k) is str for k in v)
        return lambda v: type(v) is dict and all(type(k) is str and value(x) for k, x in v.items())
    if hint is dict:
        return lambda v: type(v) is dict
    if is_typeddict(hint):
        return _typeddict(hint, depth)
    return None


def _typeddict(hint: Any, depth: int) -> Check | None:
    try:
        fields = typing.get_type_hints(hint)
    except Exception:
        return None
    required = frozenset(getattr(hint, "__required_keys__", fields))
    checks = {k: _check_of(t, depth + 1) for k, t in fields.items()}

    def check(v: Any) -> bool:
        if type(v) is not dict or not required <= v.keys() or not v.keys() <= checks.keys():
            return False
        return all(checks[k] is None or checks[k](x) for k, x in v.items())  # type: ignore[misc]

    return check


def _describe(hint: Any) -> str:
    if hint is type(None) or hint is None:
        return "None"
    if isinstance(hint, type) and not get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "")
