"""At-most-once start of a unit of work, named by an idempotency key.

:class:`IdempotencyGuard` (``redis.Redis`` / ``redis.RedisCluster``) and
:class:`AsyncIdempotencyGuard` (``redis.asyncio``) keep one Redis key per
unit of work, ``P:idem:{key}``, whose value walks::

    (absent) ──try_begin──► "pending:<owner>" ──mark_done(owner)──► "done"
                                   │                                   │
                                   └──── TTL expires ──► (absent) ◄────┘

- :meth:`~IdempotencyGuard.try_begin` is ``SET NX EX``: within the TTL only
  one caller ever gets ``True``, whatever the number of deliveries.
- :meth:`~IdempotencyGuard.mark_done` succeeds only for the owner that began
  (``idem_done.lua``); a worker whose key expired or was reclaimed gets
  :class:`~fencekit.IdempotencyNotOwned` and changes nothing. It can store a
  JSON memo (``result=``) that :meth:`~IdempotencyGuard.get_result` returns
  to later deliveries.
- :meth:`~IdempotencyGuard.try_begin_or_reclaim` also takes over a
  ``pending`` key whose worker died: the whole decision (absent → begin;
  done → done; pending and the paired lock free → reclaim; else in progress)
  is one script call (``idem_reclaim.lua``). The caller that begins or
  reclaims also reserves the paired lock for ``reserve`` (30 s by default),
  so concurrent callers see ``IN_PROGRESS``: at most one takes over. It must
  then acquire that lock with ``owner_id=guard.owner_id`` (the reservation
  is honoured for that owner only) and hold it while it works.
  On Cluster the lock resource must share the key's hash tag (use the key
  itself as ``lock_resource``).

Keys with ``decode_responses`` True or False behave the same. Both classes
use :class:`_IdemRules` for every decision and differ only in how a call is
executed (``runner.run`` or ``await runner.arun``).
"""

from __future__ import annotations

import enum
from datetime import timedelta
from typing import Any, Literal

from fencekit._redis import run as runner
from fencekit._redis import scripts
from fencekit._redis.keys import DEFAULT_PREFIX, KeySpace
from fencekit._redis.run import as_text
from fencekit._redis.scripts import Call
from fencekit.errors import FenceKitError, IdempotencyResultMissing
from fencekit.hooks import FenceKitHooks, check_hooks
from fencekit.primitives._common import (
    AsyncClient,
    SyncClient,
    require_async_client,
    require_sync_client,
    resolve_owner,
    ttl_ms,
    ttl_seconds,
)
from fencekit.primitives.canonical import dumps_json, loads_json
from fencekit.primitives.lock import AsyncDistributedLock, DistributedLock
from fencekit.primitives.tokens import BeginOutcome

#: How long begin/reclaim reserves the paired lock for the winner to acquire it.
DEFAULT_RESERVE = timedelta(seconds=30)

__all__ = ["AsyncIdempotencyGuard", "IdempotencyGuard", "Status"]

Status = Literal["pending", "done"]


class _Missing(enum.Enum):
    MISSING = "MISSING"


MISSING = _Missing.MISSING
"""``mark_done``'s default for ``result``: no memo (``result=None`` stores JSON null)."""

_OUTCOMES = {
    "begun": BeginOutcome.BEGUN,
    "reclaimed": BeginOutcome.RECLAIMED,
    "done": BeginOutcome.ALREADY_DONE,
    "in_progress": BeginOutcome.IN_PROGRESS,
}


class _IdemRules:
    """Keys, checks, script calls and reply reading for one prefix and owner; no I/O."""

    __slots__ = ("hooks", "keys", "owner_id")

    def __init__(self, prefix: str, owner_id: object, hooks: FenceKitHooks | None) -> None:
        self.keys = KeySpace(prefix)
        self.owner_id: str = resolve_owner(owner_id)
        self.hooks = check_hooks(hooks)

    def begin_call(self, key: str, ttl: object) -> Call:
        return scripts.idem_begin(
            key=self.keys.idempotency(key),
            result=self.keys.idempotency_result(key),
            owner=self.owner_id,
            ttl_s=ttl_seconds(ttl),
        )

    def begun(self, key: str, reply: object) -> bool:
        if reply not in (0, 1):
            raise FenceKitError(f"unexpected reply from idem_begin.lua: {reply!r}")
        if self.hooks is not None:
            self.hooks.idempotency_begin(key, reply == 1)
        return reply == 1

    def done(self, key: str, result: object) -> None:
        """``mark_done`` landed (hooks are told whether a memo was stored)."""
        if self.hooks is not None:
            self.hooks.idempotency_done(key, result is not MISSING)

    def done_call(self, key: str, ttl: object, result: object) -> Call:
        ttl_s = 0 if ttl is None else ttl_seconds(ttl)
        store_memo = result is not MISSING
        return scripts.idem_done(
            key=self.keys.idempotency(key),
            result=self.keys.idempotency_result(key),
            owner=self.owner_id,
            ttl_s=ttl_s,
            store=store_memo,
            memo=dumps_json(result) if store_memo else "",
        )

    def reclaim_call(self, key: str, lock_key: str, ttl: object, reserve: object) -> Call:
        return scripts.idem_reclaim(
            key=self.keys.idempotency(key),
            result=self.keys.idempotency_result(key),
            lock=lock_key,
            owner=self.owner_id,
            ttl_s=ttl_seconds(ttl),
            reserve_ms=ttl_ms(reserve, "reserve"),
        )

    def outcome(self, key: str, reply: bytes | str | None) -> BeginOutcome:
        outcome = _OUTCOMES.get(as_text(reply) or "")
        if outcome is None:
            raise FenceKitError(f"unexpected reply from idem_reclaim.lua: {reply!r}")
        if self.hooks is not None:
            self.hooks.idempotency_outcome(key, outcome)
        return outcome

    @staticmethod
    def status(value: bytes | str | None) -> Status | None:
        """``"done"``, ``"pending"`` (any other value: someone holds the key) or None."""
        decoded = as_text(value)
        if decoded is None:
            return None
        return "done" if decoded == "done" else "pending"

    @staticmethod
    def result(key: str, memo: bytes | str | None) -> Any:
        if memo is None:
            raise IdempotencyResultMissing(
                f"no result stored for {key!r} (absent, pending, done without result, or expired)"
            )
        return loads_json(memo)


class IdempotencyGuard:
    """At-most-once start per key on ``redis.Redis`` or ``redis.RedisCluster``.

    ``owner_id`` names this guard in Redis (a fresh uuid4 hex by default);
    only the owner that began a key can mark it done.
    """

    __slots__ = ("_redis", "_rules")

    def __init__(
        self,
        redis: SyncClient,
        *,
        prefix: str = DEFAULT_PREFIX,
        owner_id: str | None = None,
        hooks: FenceKitHooks | None = None,
    ) -> None:
        """``hooks``: callbacks told of each begin, outcome and done (:mod:`fencekit.hooks`)."""
        self._redis = require_sync_client(redis, "IdempotencyGuard")
        self._rules = _IdemRules(prefix, owner_id, hooks)

    @property
    def owner_id(self) -> str:
        return self._rules.owner_id

    @property
    def prefix(self) -> str:
        return self._rules.keys.prefix

    def try_begin(self, key: str, *, ttl: timedelta) -> bool:
        """True when this caller begins ``key``; False when it is pending or done.

        ``ttl`` (at least 1 s) bounds both how long a pending key blocks
        others and how long a done key is remembered.
        """
        return self._rules.begun(key, runner.run(self._redis, self._rules.begin_call(key, ttl)))

    def mark_done(self, key: str, *, ttl: timedelta | None = None, result: Any = MISSING) -> None:
        """Mark ``key`` done; only the owner that began it may.

        ``ttl`` restarts the expiry (default: keep the remaining TTL).
        ``result`` (any JSON value, ``None`` included) is stored as a memo for
        :meth:`get_result`; omitting it clears any memo. Raises
        :class:`IdempotencyNotOwned` when ``key`` is not pending for this owner.
        """
        runner.run(self._redis, self._rules.done_call(key, ttl, result))
        self._rules.done(key, result)

    def status(self, key: str) -> Status | None:
        """``"pending"``, ``"done"`` or ``None`` (absent or expired)."""
        with runner.translated():
            return self._rules.status(self._redis.get(self._rules.keys.idempotency(key)))

    def clear(self, key: str) -> None:
        """Forget ``key`` and its memo, so the work may begin again."""
        keys = (self._rules.keys.idempotency(key), self._rules.keys.idempotency_result(key))
        with runner.translated():
            self._redis.delete(*keys)

    def try_begin_or_reclaim(
        self,
        key: str,
        *,
        lock: DistributedLock,
        lock_resource: str,
        ttl: timedelta,
        reserve: timedelta = DEFAULT_RESERVE,
    ) -> BeginOutcome:
        """Begin ``key``, or take it over when its worker died, in one atomic step.

        A ``pending`` key is reclaimed only when ``lock_resource`` is not
        locked (in ``lock``'s prefix): a live worker holds that lock while it
        works. On ``BEGUN``/``RECLAIMED`` the lock is reserved for this guard's
        owner for ``reserve``: acquire it next with ``owner_id=self.owner_id``.
        See :class:`~fencekit.BeginOutcome` for the four outcomes.
        """
        if not isinstance(lock, DistributedLock):
            raise TypeError(f"lock must be a DistributedLock, got {type(lock).__name__}")
        call = self._rules.reclaim_call(key, lock.lock_key(lock_resource), ttl, reserve)
        return self._rules.outcome(key, runner.run(self._redis, call))

    def get_result(self, key: str) -> Any:
        """The memo stored by ``mark_done(key, result=...)``.

        Raises :class:`IdempotencyResultMissing` when there is none.
        """
        with runner.translated():
            memo = self._redis.get(self._rules.keys.idempotency_result(key))
        return self._rules.result(key, memo)

    def __repr__(self) -> str:
        return f"IdempotencyGuard(prefix={self.prefix!r}, owner_id={self.owner_id!r})"


class AsyncIdempotencyGuard:
    """The asyncio twin of :class:`IdempotencyGuard` (``redis.asyncio`` clients)."""

    __slots__ = ("_redis", "_rules")

    def __init__(
        self,
        redis: AsyncClient,
        *,
        prefix: str = DEFAULT_PREFIX,
        owner_id: str | None = None,
        hooks: FenceKitHooks | None = None,
    ) -> None:
        """``hooks``: callbacks told of each begin, outcome and done (:mod:`fencekit.hooks`)."""
        self._redis = require_async_client(redis, "AsyncIdempotencyGuard")
        self._rules = _IdemRules(prefix, owner_id, hooks)

    @property
    def owner_id(self) -> str:
        return self._rules.owner_id

    @property
    def prefix(self) -> str:
        return self._rules.keys.prefix

    async def try_begin(self, key: str, *, ttl: timedelta) -> bool:
        """See :meth:`IdempotencyGuard.try_begin`."""
        return self._rules.begun(key, await runner.arun(self._redis, self._rules.begin_call(key, ttl)))

    async def mark_done(self, key: str, *, ttl: timedelta | None = None, result: Any = MISSING) -> None:
        """See :meth:`IdempotencyGuard.mark_done`."""
        await runner.arun(self._redis, self._rules.done_call(key, ttl, result))
        self._rules.done(key, result)

    async def status(self, key: str) -> Status | None:
        """See :meth:`IdempotencyGuard.status`."""
        with runner.translated():
            return self._rules.status(await self._redis.get(self._rules.keys.idempotency(key)))

    async def clear(self, key: str) -> None:
        """See :meth:`IdempotencyGuard.clear`."""
        keys = (self._rules.keys.idempotency(key), self._rules.keys.idempotency_result(key))
        with runner.translated():
            await self._redis.delete(*keys)

    async def try_begin_or_reclaim(
        self,
        key: str,
        *,
        lock: AsyncDistributedLock,
        lock_resource: str,
        ttl: timedelta,
        reserve: timedelta = DEFAULT_RESERVE,
    ) -> BeginOutcome:
        """See :meth:`IdempotencyGuard.try_begin_or_reclaim` (needs an AsyncDistributedLock)."""
        if not isinstance(lock, AsyncDistributedLock):
            raise TypeError(f"lock must be an AsyncDistributedLock, got {type(lock).__name__}")
        call = self._rules.reclaim_call(key, lock.lock_key(lock_resource), ttl, reserve)
        return self._rules.outcome(key, await runner.arun(self._redis, call))

    async def get_result(self, key: str) -> Any:
        """See :meth:`IdempotencyGuard.get_result`."""
        with runner.translated():
            memo = await self._redis.get(self._rules.keys.idempotency_result(key))
        return self._rules.result(key, memo)

    def __repr__(self) -> str:
        return f"AsyncIdempotencyGuard(prefix={self.prefix!r}, owner_id={self.owner_id!r})"
