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

:class:`AsyncFenceGate` is the asyncio twin; both use :class:`FenceRules`
for every decision and differ only in how a call is executed.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fencekit._redis import run as runner
from fencekit._redis import scripts
from fencekit._redis.keys import DEFAULT_PREFIX, KeySpace, validate_name
from fencekit._redis.run import as_text
from fencekit._redis.scripts import Call
from fencekit.errors import ConfigError, FencedOutError, FenceKitError
from fencekit.hooks import FenceKitHooks, check_hooks
from fencekit.primitives._common import (
    AsyncClient,
    SyncClient,
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


class FenceRules:
    """Keys, checks and script calls of one prefix; no I/O (shared by both gates and jobs)."""

    __slots__ = ("fence_ttl_ms", "hooks", "keys")

    def __init__(self, prefix: str, fence_ttl: timedelta | None, hooks: FenceKitHooks | None = None) -> None:
        self.keys = KeySpace(prefix)
        self.fence_ttl_ms = 0 if fence_ttl is None else ttl_ms(fence_ttl, "fence_ttl")
        self.hooks = check_hooks(hooks)

    def told(self, token: object, error: BaseException | None, advanced: bool = True) -> None:
        """Tell the hooks what became of ``token``: refused (``error`` is FencedOutError) or accepted."""
        if self.hooks is None or not isinstance(token, FenceToken):
            return
        if isinstance(error, FencedOutError):
            self.hooks.fence_rejected(token.resource, token.value)
        elif error is None and advanced:
            self.hooks.fence_advanced(token.resource, token.value)

    def write(self, token: object, key: object, value: object) -> tuple[FenceToken, str, str, FenceValue]:
        """A fenced write's ``(token, fence key, target key, value)``, checked (also for job writes)."""
        token = _token(token)
        target = validate_name(key, "key")
        if isinstance(value, bool) or not isinstance(value, (str, bytes, int, float)):
            raise TypeError(f"value must be str, bytes, int or float, got {type(value).__name__}")
        fence = self.keys.fence(token.resource)
        if target == fence:
            raise ConfigError(f"the target key must not be the fence key itself: {key!r}")
        return token, fence, target, value

    def set_call(self, token: object, key: object, value: object) -> Call:
        token, fence, target, value = self.write(token, key, value)
        return scripts.fence_set(
            fence=fence,
            target=target,
            token=token.value,
            value=value,
            fence_ttl_ms=self.fence_ttl_ms,
        )

    def check_call(self, token: object) -> Call:
        token = _token(token)
        return scripts.fence_check(fence=self.keys.fence(token.resource), token=token.value)

    def advance_call(self, token: object) -> Call:
        token = _token(token)
        return scripts.fence_advance(
            fence=self.keys.fence(token.resource), token=token.value, fence_ttl_ms=self.fence_ttl_ms
        )

    @staticmethod
    def as_int(reply: object) -> int:
        """A fence value (script reply or GET) as an int; 0 when absent."""
        if reply is None:
            return 0
        if isinstance(reply, int) and not isinstance(reply, bool):
            return reply
        value = as_text(reply) if isinstance(reply, (bytes, str)) else None
        if value is None or not value.isdigit():
            raise FenceKitError(f"unexpected fence value in Redis: {reply!r}")
        return int(value)


class FenceGate:
    """Token-checked writes on ``redis.Redis`` or ``redis.RedisCluster``.

    On Cluster the target key of :meth:`set_if_fresh` must share the
    resource's hash tag (e.g. resource ``"batch-42"``, target
    ``"{batch-42}:status"``).
    """

    __slots__ = ("_redis", "_rules")

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

    @property
    def prefix(self) -> str:
        return self._rules.keys.prefix

    def fence_key(self, resource: str) -> str:
        """The key holding ``resource``'s largest accepted token (``P:fence:{resource}``)."""
        return self._rules.keys.fence(resource)

    def set_if_fresh(self, token: FenceToken, key: str, value: FenceValue) -> None:
        """SET ``key`` to ``value`` if ``token`` is not older than the fence, atomically.

        Advances the fence to ``token``. Raises :class:`FencedOutError` (and
        writes nothing) when a newer token was accepted for the resource.
        """
        self._send(token, self._rules.set_call(token, key, value))

    def check(self, token: FenceToken) -> int:
        """Diagnostic: the fence's current value if ``token`` would pass, else FencedOutError.

        Does not advance the fence; a write after a check races with newer
        holders, so write with :meth:`set_if_fresh` or :meth:`check_and_advance`.
        """
        return self._rules.as_int(self._send(token, self._rules.check_call(token), advances=False))

    def check_and_advance(self, token: FenceToken) -> None:
        """Accept ``token`` and record it as the newest; FencedOutError if it is older."""
        self._send(token, self._rules.advance_call(token))

    def current_max(self, resource: str) -> int:
        """The largest token accepted for ``resource``, 0 when none."""
        key = self._rules.keys.fence(resource)
        with runner.translated():
            return self._rules.as_int(self._redis.get(key))

    def _send(self, token: object, call: Call, advances: bool = True) -> Any:
        try:
            reply = runner.run(self._redis, call)
        except FencedOutError as exc:
            self._rules.told(token, exc)
            raise
        self._rules.told(token, None, advances)
        return reply

    def __repr__(self) -> str:
        return f"FenceGate(prefix={self.prefix!r})"


class AsyncFenceGate:
    """The asyncio twin of :class:`FenceGate` (``redis.asyncio`` clients)."""

    __slots__ = ("_redis", "_rules")

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

    @property
    def prefix(self) -> str:
        return self._rules.keys.prefix

    def fence_key(self, resource: str) -> str:
        """See :meth:`FenceGate.fence_key`."""
        return self._rules.keys.fence(resource)

    async def set_if_fresh(self, token: FenceToken, key: str, value: FenceValue) -> None:
        """See :meth:`FenceGate.set_if_fresh`."""
        await self._send(token, self._rules.set_call(token, key, value))

    async def check(self, token: FenceToken) -> int:
        """See :meth:`FenceGate.check`."""
        return self._rules.as_int(await self._send(token, self._rules.check_call(token), advances=False))

    async def check_and_advance(self, token: FenceToken) -> None:
        """See :meth:`FenceGate.check_and_advance`."""
        await self._send(token, self._rules.advance_call(token))

    async def current_max(self, resource: str) -> int:
        """See :meth:`FenceGate.current_max`."""
        key = self._rules.keys.fence(resource)
        with runner.translated():
            return self._rules.as_int(await self._redis.get(key))

    async def _send(self, token: object, call: Call, advances: bool = True) -> Any:
        try:
            reply = await runner.arun(self._redis, call)
        except FencedOutError as exc:
            self._rules.told(token, exc)
            raise
        self._rules.told(token, None, advances)
        return reply

    def __repr__(self) -> str:
        return f"AsyncFenceGate(prefix={self.prefix!r})"
