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

Keys with ``decode_responses`` True or False behave the same. Each rule (the
checks, the script call or command, reading its reply, telling the hooks) is
written once, as steps (:mod:`fencekit._redis.steps`) of :class:`_IdemRules`;
:class:`IdempotencyGuard` runs them with ``drive``,
:class:`AsyncIdempotencyGuard` with ``adrive``.
"""

from __future__ import annotations

import enum
from datetime import timedelta
from typing import Any, Literal

from fencekit._redis import scripts
from fencekit._redis.keys import DEFAULT_PREFIX, KeySpace
from fencekit._redis.run import as_text
from fencekit._redis.steps import Steps, adrive, cmd, drive
from fencekit.errors import FenceKitError, IdempotencyResultMissing
from fencekit.hooks import FenceKitHooks, check_hooks
from fencekit.primitives._common import (
    AsyncClient,
    Primitive,
    SyncClient,
    reply_of,
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
    """The guard's rules for one prefix and owner, as steps: no I/O, run by both drivers."""

    __slots__ = ("hooks", "keys", "owner_id")

    def __init__(self, prefix: str, owner_id: object, hooks: FenceKitHooks | None) -> None:
        self.keys = KeySpace(prefix)
        self.owner_id: str = resolve_owner(owner_id)
        self.hooks = check_hooks(hooks)

    def try_begin(self, key: str, ttl: object) -> Steps[bool]:
        """Begin ``key`` if it is absent (``idem_begin.lua``, a ``SET NX EX``): whether this owner did."""
        call = scripts.idem_begin(
            key=self.keys.idempotency(key),
            result=self.keys.idempotency_result(key),
            owner=self.owner_id,
            ttl_s=ttl_seconds(ttl),
        )
        reply = yield from reply_of(call)
        if reply not in (0, 1):
            raise FenceKitError(f"unexpected reply from idem_begin.lua: {reply!r}")
        if self.hooks is not None:
            self.hooks.idempotency_begin(key, reply == 1)
        return bool(reply == 1)

    def mark_done(self, key: str, ttl: object, result: object) -> Steps[None]:
        """Mark ``key`` done for this owner (``idem_done.lua``); ``result`` is its memo unless MISSING."""
        ttl_s = 0 if ttl is None else ttl_seconds(ttl)
        store_memo = result is not MISSING
        call = scripts.idem_done(
            key=self.keys.idempotency(key),
            result=self.keys.idempotency_result(key),
            owner=self.owner_id,
            ttl_s=ttl_s,
            store=store_memo,
            memo=dumps_json(result) if store_memo else "",
        )
        yield from reply_of(call)
        if self.hooks is not None:
            self.hooks.idempotency_done(key, store_memo)

    def try_begin_or_reclaim(
        self,
        key: str,
        lock: object,
        lock_class: type[DistributedLock | AsyncDistributedLock],
        lock_resource: str,
        ttl: object,
        reserve: object,
    ) -> Steps[BeginOutcome]:
        """Begin, reclaim or find ``key`` busy or done in one script call (``idem_reclaim.lua``).

        ``lock`` must be a ``lock_class`` (the lock of the driver's own kind):
        its key for ``lock_resource`` is the paired lock the script reserves.
        """
        if not isinstance(lock, lock_class):
            article = "an" if lock_class.__name__[0] in "AEIOU" else "a"
            raise TypeError(f"lock must be {article} {lock_class.__name__}, got {type(lock).__name__}")
        lock_key = lock.lock_key(lock_resource)
        call = scripts.idem_reclaim(
            key=self.keys.idempotency(key),
            result=self.keys.idempotency_result(key),
            lock=lock_key,
            owner=self.owner_id,
            ttl_s=ttl_seconds(ttl),
            reserve_ms=ttl_ms(reserve, "reserve"),
        )
        reply = yield from reply_of(call)
        outcome = _OUTCOMES.get(as_text(reply) or "")
        if outcome is None:
            raise FenceKitError(f"unexpected reply from idem_reclaim.lua: {reply!r}")
        if self.hooks is not None:
            self.hooks.idempotency_outcome(key, outcome)
        return outcome

    def status(self, key: str) -> Steps[Status | None]:
        """``"done"``, ``"pending"`` (any other value: someone holds the key) or None (a GET)."""
        decoded = as_text((yield from reply_of(cmd("get", self.keys.idempotency(key)))))
        if decoded is None:
            return None
        return "done" if decoded == "done" else "pending"

    def clear(self, key: str) -> Steps[None]:
        """Delete ``key`` and its memo (one DEL: both share the key's hash tag)."""
        yield from reply_of(cmd("delete", self.keys.idempotency(key), self.keys.idempotency_result(key)))

    def get_result(self, key: str) -> Steps[Any]:
        """The memo of ``key`` (a GET), decoded; IdempotencyResultMissing when there is none."""
        memo = yield from reply_of(cmd("get", self.keys.idempotency_result(key)))
        if memo is None:
            raise IdempotencyResultMissing(
                f"no result stored for {key!r} (absent, pending, done without result, or expired)"
            )
        return loads_json(memo)


class _Guard(Primitive[_IdemRules]):
    """What both drivers share besides the steps: the client, the rules, the owner id."""

    __slots__ = ()

    @property
    def owner_id(self) -> str:
        return self._rules.owner_id

    def __repr__(self) -> str:
        return f"{self._NAME}(prefix={self.prefix!r}, owner_id={self.owner_id!r})"


class IdempotencyGuard(_Guard):
    """At-most-once start per key on ``redis.Redis`` or ``redis.RedisCluster``.

    ``owner_id`` names this guard in Redis (a fresh uuid4 hex by default);
    only the owner that began a key can mark it done.
    """

    __slots__ = ()
    _NAME = "IdempotencyGuard"

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

    def try_begin(self, key: str, *, ttl: timedelta) -> bool:
        """True when this caller begins ``key``; False when it is pending or done.

        ``ttl`` (at least 1 s) bounds both how long a pending key blocks
        others and how long a done key is remembered.
        """
        return drive(self._redis, self._rules.try_begin(key, ttl))

    def mark_done(self, key: str, *, ttl: timedelta | None = None, result: Any = MISSING) -> None:
        """Mark ``key`` done; only the owner that began it may.

        ``ttl`` restarts the expiry (default: keep the remaining TTL).
        ``result`` (any JSON value, ``None`` included) is stored as a memo for
        :meth:`get_result`; omitting it clears any memo. Raises
        :class:`IdempotencyNotOwned` when ``key`` is not pending for this owner.
        """
        drive(self._redis, self._rules.mark_done(key, ttl, result))

    def status(self, key: str) -> Status | None:
        """``"pending"``, ``"done"`` or ``None`` (absent or expired)."""
        return drive(self._redis, self._rules.status(key))

    def clear(self, key: str) -> None:
        """Forget ``key`` and its memo, so the work may begin again."""
        drive(self._redis, self._rules.clear(key))

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
        steps = self._rules.try_begin_or_reclaim(key, lock, DistributedLock, lock_resource, ttl, reserve)
        return drive(self._redis, steps)

    def get_result(self, key: str) -> Any:
        """The memo stored by ``mark_done(key, result=...)``.

        Raises :class:`IdempotencyResultMissing` when there is none.
        """
        return drive(self._redis, self._rules.get_result(key))


class AsyncIdempotencyGuard(_Guard):
    """The asyncio twin of :class:`IdempotencyGuard` (``redis.asyncio`` clients)."""

    __slots__ = ()
    _NAME = "AsyncIdempotencyGuard"

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

    async def try_begin(self, key: str, *, ttl: timedelta) -> bool:
        """See :meth:`IdempotencyGuard.try_begin`."""
        return await adrive(self._redis, self._rules.try_begin(key, ttl))

    async def mark_done(self, key: str, *, ttl: timedelta | None = None, result: Any = MISSING) -> None:
        """See :meth:`IdempotencyGuard.mark_done`."""
        await adrive(self._redis, self._rules.mark_done(key, ttl, result))

    async def status(self, key: str) -> Status | None:
        """See :meth:`IdempotencyGuard.status`."""
        return await adrive(self._redis, self._rules.status(key))

    async def clear(self, key: str) -> None:
        """See :meth:`IdempotencyGuard.clear`."""
        await adrive(self._redis, self._rules.clear(key))

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
        steps = self._rules.try_begin_or_reclaim(key, lock, AsyncDistributedLock, lock_resource, ttl, reserve)
        return await adrive(self._redis, steps)

    async def get_result(self, key: str) -> Any:
        """See :meth:`IdempotencyGuard.get_result`."""
        return await adrive(self._redis, self._rules.get_result(key))
