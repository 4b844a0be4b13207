"""Fenced writes: refuse a token older than the newest one a resource has seen.

A :class:`~fencekit.FenceToken` from :class:`~fencekit.DistributedLock`
proves *when* a lease was granted, not that it is still held (see the
hazard time-line in :mod:`fencekit.primitives.lock`). :class:`FenceGate` turns it into
safety for Redis writes: per resource, Redis keeps the largest token accepted
(``P:fence:{R}``), and

- :meth:`FenceGate.set_if_fresh` checks the token, advances the fence and
  SETs the target key in one Lua call (``fence_set.lua``) — no
  check-then-act gap;
- :meth:`FenceGate.check_and_advance` records a token before a write made
  elsewhere (``fence_advance.lua``);
- :meth:`FenceGate.check` only looks (``fence_check.lua``): a write after it
  races, so it is for diagnostics.

Equal tokens pass (one grant may write many times); an older token raises
:class:`~fencekit.FencedOutError` and changes nothing. The fence key never
expires unless ``fence_ttl`` is given; an expired fence forgets the newest
token, so choose a ``fence_ttl`` far longer than any pause you defend against.

:class:`AsyncFenceGate` is the asyncio twin. Each rule (the checks, the
script call, reading its reply, telling the hooks) is written once, as steps
(:mod:`fencekit._redis.steps`) of :class:`FenceRules`; :class:`FenceGate`
runs them with ``drive``, :class:`AsyncFenceGate` with ``adrive``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fencekit._redis import scripts
from fencekit._redis.keys import DEFAULT_PREFIX, KeySpace, validate_name
from fencekit._redis.run import as_text
from fencekit._redis.scripts import Call
from fencekit._redis.steps import Steps, adrive, cmd, drive
from fencekit.errors import ConfigError, FencedOutError, FenceKitError
from fencekit.hooks import FenceKitHooks, check_hooks
from fencekit.primitives._common import (
    AsyncClient,
    Primitive,
    SyncClient,
    reply_of,
    require_async_client,
    require_sync_client,
    ttl_ms,
)
from fencekit.primitives.tokens import FenceToken

__all__ = ["AsyncFenceGate", "FenceGate"]

FenceValue = str | bytes | int | float


def _token(token: object) -> FenceToken:
    if not isinstance(token, FenceToken):
        raise TypeError(f"expected a FenceToken (e.g. handle.token), got {type(token).__name__} {token!r}")
    return token


def _as_int(reply: object) -> int:
    """A fence value (script reply or GET) as an int; 0 when absent."""
    if reply is None:
        return 0
    if isinstance(reply, int) and not isinstance(reply, bool):
        return reply
    value = as_text(reply) if isinstance(reply, (bytes, str)) else None
    if value is None or not value.isdigit():
        raise FenceKitError(f"unexpected fence value in Redis: {reply!r}")
    return int(value)


class FenceRules:
    """The gates' rules for one prefix, as steps: no I/O (run by both gates; jobs check writes here)."""

    __slots__ = ("fence_ttl_ms", "hooks", "keys")

    def __init__(self, prefix: str, fence_ttl: timedelta | None, hooks: FenceKitHooks | None = None) -> None:
        self.keys = KeySpace(prefix)
        self.fence_ttl_ms = 0 if fence_ttl is None else ttl_ms(fence_ttl, "fence_ttl")
        self.hooks = check_hooks(hooks)

    def write(self, token: object, key: object, value: object) -> tuple[FenceToken, str, str, FenceValue]:
        """A fenced write's ``(token, fence key, target key, value)``, checked."""
        token = _token(token)
        return (token, *self.target(token.resource, key, value))

    def target(self, resource: str, key: object, value: object) -> tuple[str, str, FenceValue]:
        """The ``(fence key, target key, value)`` of a write through ``resource``'s fence, checked:
        the rule of :meth:`write`, for a job's writes too (which need no token object)."""
        target = validate_name(key, "key")
        if isinstance(value, bool) or not isinstance(value, (str, bytes, int, float)):
            raise TypeError(f"value must be str, bytes, int or float, got {type(value).__name__}")
        fence = self.keys.fence(resource)
        if target == fence:
            raise ConfigError(f"the target key must not be the fence key itself: {key!r}")
        return fence, target, value

    def set_if_fresh(self, token: object, key: object, value: object) -> Steps[None]:
        """SET ``key`` if ``token`` is not older than the fence, advancing it (``fence_set.lua``)."""
        token, fence, target, value = self.write(token, key, value)
        call = scripts.fence_set(
            fence=fence, target=target, token=token.value, value=value, fence_ttl_ms=self.fence_ttl_ms
        )
        yield from self._fenced(token, call)

    def check(self, token: object) -> Steps[int]:
        """The fence's value if ``token`` would pass (``fence_check.lua``); the fence stays."""
        token = _token(token)
        call = scripts.fence_check(fence=self.keys.fence(token.resource), token=token.value)
        return _as_int((yield from self._fenced(token, call, advances=False)))

    def check_and_advance(self, token: object) -> Steps[None]:
        """Accept ``token`` and record it as the newest (``fence_advance.lua``)."""
        token = _token(token)
        call = scripts.fence_advance(
            fence=self.keys.fence(token.resource), token=token.value, fence_ttl_ms=self.fence_ttl_ms
        )
        yield from self._fenced(token, call)

    def current_max(self, resource: str) -> Steps[int]:
        """The largest token accepted for ``resource`` (a GET), 0 when none."""
        return _as_int((yield from reply_of(cmd("get", self.keys.fence(resource)))))

    def _fenced(self, token: FenceToken, call: Call, advances: bool = True) -> Steps[Any]:
        """``call``'s reply; the hooks told that ``token`` was refused, or accepted when it ``advances``."""
        try:
            reply = yield from reply_of(call)
        except FencedOutError:
            if self.hooks is not None:
                self.hooks.fence_rejected(token.resource, token.value)
            raise
        if self.hooks is not None and advances:
            self.hooks.fence_advanced(token.resource, token.value)
        return reply


class _Gate(Primitive[FenceRules]):
    """What both gates share besides the steps: the client, the rules, the key names."""

    __slots__ = ()

    def fence_key(self, resource: str) -> str:
        """The key holding ``resource``'s largest accepted token (``P:fence:{resource}``)."""
        return self._rules.keys.fence(resource)


class FenceGate(_Gate):
    """Token-checked writes on ``redis.Redis`` or ``redis.RedisCluster``.

    On Cluster the target key of :meth:`set_if_fresh` must share the
    resource's hash tag (e.g. resource ``"batch-42"``, target
    ``"{batch-42}:status"``).
    """

    __slots__ = ()
    _NAME = "FenceGate"

    def __init__(
        self,
        redis: SyncClient,
        *,
        prefix: str = DEFAULT_PREFIX,
        fence_ttl: timedelta | None = None,
        hooks: FenceKitHooks | None = None,
    ) -> None:
        """``hooks``: callbacks told of each token accepted or refused (:mod:`fencekit.hooks`)."""
        self._redis = require_sync_client(redis, "FenceGate")
        self._rules = FenceRules(prefix, fence_ttl, hooks)

    def set_if_fresh(self, token: FenceToken, key: str, value: FenceValue) -> None:
        """SET ``key`` to ``value`` if ``token`` is not older than the fence, atomically.

        Advances the fence to ``token``. Raises :class:`FencedOutError` (and
        writes nothing) when a newer token was accepted for the resource.
        """
        drive(self._redis, self._rules.set_if_fresh(token, key, value))

    def check(self, token: FenceToken) -> int:
        """Diagnostic: the fence's current value if ``token`` would pass, else FencedOutError.

        Does not advance the fence; a write after a check races with newer
        holders, so write with :meth:`set_if_fresh` or :meth:`check_and_advance`.
        """
        return drive(self._redis, self._rules.check(token))

    def check_and_advance(self, token: FenceToken) -> None:
        """Accept ``token`` and record it as the newest; FencedOutError if it is older."""
        drive(self._redis, self._rules.check_and_advance(token))

    def current_max(self, resource: str) -> int:
        """The largest token accepted for ``resource``, 0 when none."""
        return drive(self._redis, self._rules.current_max(resource))


class AsyncFenceGate(_Gate):
    """The asyncio twin of :class:`FenceGate` (``redis.asyncio`` clients)."""

    __slots__ = ()
    _NAME = "AsyncFenceGate"

    def __init__(
        self,
        redis: AsyncClient,
        *,
        prefix: str = DEFAULT_PREFIX,
        fence_ttl: timedelta | None = None,
        hooks: FenceKitHooks | None = None,
    ) -> None:
        """``hooks``: callbacks told of each token accepted or refused (:mod:`fencekit.hooks`)."""
        self._redis = require_async_client(redis, "AsyncFenceGate")
        self._rules = FenceRules(prefix, fence_ttl, hooks)

    async def set_if_fresh(self, token: FenceToken, key: str, value: FenceValue) -> None:
        """See :meth:`FenceGate.set_if_fresh`."""
        await adrive(self._redis, self._rules.set_if_fresh(token, key, value))

    async def check(self, token: FenceToken) -> int:
        """See :meth:`FenceGate.check`."""
        return await adrive(self._redis, self._rules.check(token))

    async def check_and_advance(self, token: FenceToken) -> None:
        """See :meth:`FenceGate.check_and_advance`."""
        await adrive(self._redis, self._rules.check_and_advance(token))

    async def current_max(self, resource: str) -> int:
        """See :meth:`FenceGate.current_max`."""
        return await adrive(self._redis, self._rules.current_max(resource))
