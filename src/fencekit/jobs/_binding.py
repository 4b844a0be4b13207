"""A task function's arguments as params, and back: bound to its signature at both ends.

A task function's call -- positional and keyword arguments alike -- is bound
to the function's signature at enqueue (:meth:`Binder.encode`) and stored
as JSON params named by parameter, so the admin page shows
``{"to": "a@b.c", "subject": "hi"}`` and a task enqueued by hand with those
names (``fencekit enqueue emails send_email --params '{"to": ...}'``) runs
the same. ``*args`` is one param (a list) under its own name; the items of
``**kwargs`` are params of their own. :meth:`Binder.decode` rebuilds the
call on the worker.

Every refusal is a :class:`~fencekit.errors.PayloadError` naming the
parameter: at enqueue, the producer's bad call; on the worker,
:class:`Unbound` -- params that do not fit the signature, which the
performer turns into a dead letter with that reason (invariant I7), never a
retry.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from fencekit.errors import PayloadError
from fencekit.jobs import codec
from fencekit.jobs._types import checks_of

__all__ = ["Binder", "Unbound"]

_P = inspect.Parameter


class Unbound(PayloadError):
    """A task's params do not bind to its function's signature (bad input: dead-lettered)."""


class Binder:
    """The signature of one task function, and the two directions of its params."""

    __slots__ = (
        "_by_name",
        "_checks",
        "_kw_check",
        "_kwargs_name",
        "_name",
        "_named",
        "_params",
        "_required",
        "_signature",
        "_star_name",
    )

    def __init__(self, function: Callable[..., Any]) -> None:
        self._name = getattr(function, "__qualname__", repr(function))
        self._signature = inspect.signature(function)
        self._params = list(self._signature.parameters.values())
        self._named = {p.name for p in self._params if p.kind not in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD)}
        self._star_name = next((p.name for p in self._params if p.kind is _P.VAR_POSITIONAL), None)
        self._kwargs_name = next((p.name for p in self._params if p.kind is _P.VAR_KEYWORD), None)
        self._required = frozenset(
            p.name for p in self._params if p.default is _P.empty and p.name in self._named
        )
        checks = checks_of(function)
        if self._star_name in checks:  # *rest: int annotates each item of the list stored
            item, written = checks[self._star_name]
            checks[self._star_name] = (
                lambda v: type(v) is list and all(item(x) for x in v),
                f"a list of {written}",
            )
        self._kw_check = checks.pop(self._kwargs_name) if self._kwargs_name in checks else None
        """**more: str annotates each param that is no parameter's (stored under its own name)."""
        self._checks = checks
        """The params with a plain annotation: checked at both ends (:mod:`fencekit.jobs._types`)."""
        # Every parameter can be passed by keyword (the common case): params are the kwargs as they are.
        self._by_name = self._star_name is None and all(
            p.kind is not _P.POSITIONAL_ONLY for p in self._params
        )

    def encode(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The params of the call ``function(*args, **kwargs)``; PayloadError naming what is wrong.

        Only the arguments given are stored: defaults are the worker's at run time.
        """
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise PayloadError(f"{self._name}(): {exc}") from None
        params: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = self._signature.parameters[name].kind
            if kind is _P.VAR_KEYWORD:
                for key, item in value.items():
                    if key == self._star_name:
                        raise PayloadError(
                            f"{self._name}(): keyword argument {key!r} of **{name} has the name of *{key}"
                        )
                    codec.check_params(item, f"{self._name}(): argument {key!r}")
                    params[key] = item
            else:
                if kind is _P.VAR_POSITIONAL:
                    value = list(value)
                codec.check_params(value, f"{self._name}(): argument {name!r}")
                params[name] = value
        if self._checks or self._kw_check is not None:
            problem = self._mistyped(params)
            if problem is not None:
                raise PayloadError(f"{self._name}(): argument {problem}")
        return params

    def _mistyped(self, params: dict[str, Any]) -> str | None:
        """``'name' must be T, got V`` for the first param that does not fit its annotation."""
        for name, (check, described) in self._checks.items():
            if name in params and not check(params[name]):
                value = params[name]
                return f"{name!r} must be {described}, got {type(value).__name__} {value!r:.60}"
        if self._kw_check is not None:
            check, described = self._kw_check
            for name, value in params.items():
                if name not in self._named and name != self._star_name and not check(value):
                    return f"{name!r} must be {described}, got {type(value).__name__} {value!r:.60}"
        return None

    def decode(self, params: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """``(args, kwargs)`` to call the function with; :class:`Unbound` names the parameter."""
        if self._checks or self._kw_check is not None:
            problem = self._mistyped(params)
            if problem is not None:
                raise Unbound(f"{self._name}(): param {problem}")
        if self._by_name:
            keys = params.keys()
            if self._required <= keys and (self._kwargs_name is not None or keys <= self._named):
                return [], params
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        positional = True  # positional parameters go by position until one is left to its default
        for p in self._params:
            kind = p.kind
            if kind is _P.VAR_POSITIONAL:
                if p.name in params:
                    extra = params[p.name]
                    if not isinstance(extra, list):
                        raise Unbound(
                            f"{self._name}(): param {p.name!r} (*{p.name}) must be a list, "
                            f"got {type(extra).__name__}"
                        )
                    if extra and not positional:
                        raise Unbound(f"{self._name}(): *{p.name} given while a parameter before it is not")
                    args.extend(extra)
                continue
            if kind is _P.VAR_KEYWORD:
                continue
            if p.name in params:
                if kind is _P.KEYWORD_ONLY or (kind is _P.POSITIONAL_OR_KEYWORD and not positional):
                    kwargs[p.name] = params[p.name]
                elif positional:
                    args.append(params[p.name])
                else:
                    raise Unbound(f"{self._name}(): positional-only param {p.name!r} follows a missing one")
            elif p.default is _P.empty:
                raise Unbound(f"{self._name}(): missing param {p.name!r} (a required argument)")
            elif kind is not _P.KEYWORD_ONLY:
                positional = False
        for key in params:
            if key not in self._named and key != self._star_name:
                if self._kwargs_name is None:
                    raise Unbound(f"{self._name}(): unknown param {key!r} (no parameter of that name)")
                kwargs[key] = params[key]
        return args, kwargs
