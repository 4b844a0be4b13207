"""Leases on a resource, each grant carrying a fencing token.

:class:`DistributedLock` (``redis.Redis`` / ``redis.RedisCluster``) and
:class:`AsyncDistributedLock` (``redis.asyncio``) grant a lease with
``lock_acquire.lua``: in one atomic step the lock key is set (``NX``, ``PX``)
and the resource's next fencing token is issued. The token grows with every
grant, never with a failed attempt.

A lease is not mutual exclusion. The hazard, drawn on a time-line::

    time ───────────────────────────────────────────────────────────────────────────►
    holder A  acquire: token 17  write(17) ✓  ┊ paused: GC, SIGSTOP ┊  write(17) ✗ FENCED
    Redis     lock "17:A" ──────────── lease expires
    holder B                                     acquire: token 18  write(18) ✓
    fence     0 ─────────► 17 ────────────────────────────────────► 18   (17 < 18: refused)

A believes it still holds the lock when it wakes up; nothing in A's process
can tell it otherwise in time. Only the destination can: it remembers the
largest token it accepted (18) and refuses A's smaller one
(:class:`~fencekit.FenceGate`, or ``UPDATE … WHERE fence_token <= %s``). A
write that does not present its token is not protected.

``release`` and ``extend`` compare the owner id *and* the token of the grant
inside Lua, so A's late ``release`` cannot delete B's lease (even when A and B
share an owner id), and A's late ``extend`` cannot prolong it: both raise
:class:`~fencekit.LockNotOwned` and change nothing. fencekit does not
implement Redlock; one Redis primary decides.

Each rule -- acquire (with its retries and blocking wait), extend, release,
and the release that ends ``hold`` -- is written once, as steps
(:mod:`fencekit._redis.steps`) of :class:`_LockRules`: argument checks, the
script call, reading its reply, the hooks. :class:`DistributedLock` runs them
with ``drive``, :class:`AsyncDistributedLock` with ``adrive``; a blocking
acquire's pause between attempts is a :class:`~fencekit._redis.steps.Sleep`
(``time.sleep`` or ``asyncio.sleep``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta

from fencekit._redis import scripts
from fencekit._redis.keys import DEFAULT_PREFIX, KeySpace
from fencekit._redis.steps import Sleep, Steps, adrive, drive
from fencekit.errors import ConfigError, FenceKitError, LockNotAcquired
from fencekit.hooks import FenceKitHooks, check_hooks
from fencekit.primitives._common import (
    AsyncClient,
    Primitive,
    SyncClient,
    reply_of,
    require_async_client,
    require_sync_client,
    resolve_owner,
    timedelta_arg,
    ttl_ms,
)
from fencekit.primitives.tokens import FenceToken, LockHandle

__all__ = ["AsyncDistributedLock", "DistributedLock"]

DEFAULT_RETRY_INTERVAL = timedelta(milliseconds=50)


def _check_handle(handle: object) -> LockHandle:
    if not isinstance(handle, LockHandle):
        raise TypeError(f"expected a LockHandle, got {type(handle).__name__}")
    return handle


def _patience(blocking: object, wait: object, retry_interval: object) -> timedelta | None:
    """How long a blocking acquire keeps trying (None: one attempt), the arguments checked."""
    if not isinstance(blocking, bool):
        raise TypeError(f"blocking must be a bool, got {blocking!r}")
    if not blocking:
        if wait is not None:
            raise ConfigError("wait only applies with blocking=True")
        return None
    if wait is None:
        raise ConfigError("blocking=True needs wait=timedelta(...): how long to keep trying")
    patience = timedelta_arg(wait, "wait")
    if patience < timedelta(0):
        raise ConfigError(f"wait must not be negative, got {patience!r}")
    ttl_ms(retry_interval, "retry_interval")
    return patience


# -- the rules, as steps -------------------------------------------------------------


class _LockRules:
    """The lock's rules for one prefix, as steps: no I/O, run by both drivers."""

    __slots__ = ("hooks", "keys")

    def __init__(self, prefix: str, hooks: FenceKitHooks | None) -> None:
        self.keys = KeySpace(prefix)
        self.hooks = check_hooks(hooks)

    def acquire(
        self,
        resource: str,
        ttl: object,
        owner_id: object,
        blocking: object,
        wait: object,
        retry_interval: object,
        clock: Callable[[], float] = time.monotonic,
    ) -> Steps[LockHandle]:
        """One ``acquire``: ``lock_acquire.lua`` until it grants, pausing between attempts.

        Without ``blocking`` one attempt; with it, attempts every
        ``retry_interval`` until ``wait`` (measured on ``clock``) has passed.
        Raises :class:`LockNotAcquired` (hooks told) when no attempt is left.
        """
        lease_ms = ttl_ms(ttl)
        lease = timedelta_arg(ttl, "ttl")
        owner = resolve_owner(owner_id)
        patience = _patience(blocking, wait, retry_interval)
        interval = timedelta_arg(retry_interval, "retry_interval").total_seconds()
        call = scripts.lock_acquire(
            lock=self.keys.lock(resource), seq=self.keys.lock_seq(resource), owner=owner, ttl_ms=lease_ms
        )
        deadline = clock() + (patience.total_seconds() if patience else 0.0)
        while True:
            reply = yield from reply_of(call)
            if reply is not None:
                if isinstance(reply, bool) or not isinstance(reply, int):
                    raise FenceKitError(f"unexpected reply from lock_acquire.lua: {reply!r}")
                if self.hooks is not None:
                    self.hooks.lock_acquired(resource, reply)
                return LockHandle(resource, owner, FenceToken(reply, resource), lease)
            remaining = deadline - clock()
            if patience is None or remaining <= 0:
                detail = f" within {patience}" if patience is not None else ""
                if self.hooks is not None:
                    self.hooks.lock_acquire_failed(resource)
                raise LockNotAcquired(f"lock on {resource!r} is held by another owner{detail}")
            yield Sleep(min(interval, remaining))

    def release(self, handle: object) -> Steps[None]:
        """End the grant's lease (``lock_release.lua``); hooks told once it is gone."""
        handle = _check_handle(handle)
        yield from reply_of(
            scripts.lock_release(
                lock=self.keys.lock(handle.resource), owner=handle.owner_id, token=handle.token.value
            )
        )
        if self.hooks is not None:
            self.hooks.lock_released(handle.resource)

    def release_after(self, handle: LockHandle, body_error: BaseException) -> Steps[None]:
        """``hold``'s release after its body raised ``body_error``, which must reach the caller.

        A release that fails (the lease was lost) is noted on ``body_error``
        instead of replacing it.
        """
        try:
            yield from self.release(handle)
        except FenceKitError as release_error:
            if sys.version_info >= (3, 11):
                body_error.add_note(f"fencekit: releasing the lock also failed: {release_error!r}")

    def extend(self, handle: object, ttl: object) -> Steps[LockHandle]:
        """Set the grant's lease to ``ttl`` from now (``lock_extend.lua``): the handle with the new ttl."""
        handle = _check_handle(handle)
        lease_ms = ttl_ms(ttl)
        call = scripts.lock_extend(
            lock=self.keys.lock(handle.resource),
            owner=handle.owner_id,
            token=handle.token.value,
            ttl_ms=lease_ms,
        )
        extended = dataclasses.replace(handle, ttl=timedelta_arg(ttl, "ttl"))
        yield from reply_of(call)
        return extended


# -- the two drivers ---------------------------------------------------------------


class _Lock(Primitive[_LockRules]):
    """What both drivers share besides the steps: the client, the rules, the key names."""

    __slots__ = ()

    def lock_key(self, resource: str) -> str:
        """The Redis key that holds ``resource``'s lease (``P:lock:{resource}``)."""
        return self._rules.keys.lock(resource)


class DistributedLock(_Lock):
    """Leases with fencing tokens on ``redis.Redis`` or ``redis.RedisCluster``.

    Every key starts with ``{prefix}:``; a resource's keys share one hash tag.
    See the module docstring for what a lease does and does not guarantee.
    """

    __slots__ = ()
    _NAME = "DistributedLock"

    def __init__(
        self, redis: SyncClient, *, prefix: str = DEFAULT_PREFIX, hooks: FenceKitHooks | None = None
    ) -> None:
        """``hooks``: callbacks told of each grant, refusal and release (:mod:`fencekit.hooks`)."""
        self._redis = require_sync_client(redis, "DistributedLock")
        self._rules = _LockRules(prefix, hooks)

    def acquire(
        self,
        resource: str,
        *,
        ttl: timedelta,
        owner_id: str | None = None,
        blocking: bool = False,
        wait: timedelta | None = None,
        retry_interval: timedelta = DEFAULT_RETRY_INTERVAL,
    ) -> LockHandle:
        """Take a lease of ``ttl`` on ``resource`` and its new fencing token.

        ``owner_id`` defaults to a fresh uuid4 hex. Non-blocking (default):
        one attempt. ``blocking=True`` retries every ``retry_interval`` for up
        to ``wait``. Raises :class:`LockNotAcquired` when the lock stays held.
        """
        steps = self._rules.acquire(resource, ttl, owner_id, blocking, wait, retry_interval)
        return drive(self._redis, steps)

    def release(self, handle: LockHandle) -> None:
        """End this grant's lease; :class:`LockNotOwned` if it is gone already."""
        drive(self._redis, self._rules.release(handle))

    def extend(self, handle: LockHandle, *, ttl: timedelta) -> LockHandle:
        """Set this grant's lease to ``ttl`` from now; the same token, a new ``ttl``.

        Raises :class:`LockNotOwned` (changing nothing) when the lease expired
        or belongs to another grant; the token cannot be revived.
        """
        return drive(self._redis, self._rules.extend(handle, ttl))

    @contextlib.contextmanager
    def hold(
        self,
        resource: str,
        *,
        ttl: timedelta,
        owner_id: str | None = None,
        blocking: bool = False,
        wait: timedelta | None = None,
        retry_interval: timedelta = DEFAULT_RETRY_INTERVAL,
    ) -> Iterator[LockHandle]:
        """``with lock.hold(...) as handle:`` acquire, and release on exit.

        When the body raises, that exception propagates even if the release
        fails (the lease was lost); the release failure is attached as a note.
        When the body succeeds but the lease was lost, :class:`LockNotOwned`
        tells the caller its section was not exclusive to the end.
        """
        handle = self.acquire(
            resource, ttl=ttl, owner_id=owner_id, blocking=blocking, wait=wait, retry_interval=retry_interval
        )
        try:
            yield handle
        except BaseException as body_error:
            drive(self._redis, self._rules.release_after(handle, body_error))
            raise
        self.release(handle)


class AsyncDistributedLock(_Lock):
    """The asyncio twin of :class:`DistributedLock` (``redis.asyncio`` clients)."""

    __slots__ = ()
    _NAME = "AsyncDistributedLock"

    def __init__(
        self, redis: AsyncClient, *, prefix: str = DEFAULT_PREFIX, hooks: FenceKitHooks | None = None
    ) -> None:
        """``hooks``: callbacks told of each grant, refusal and release (:mod:`fencekit.hooks`)."""
        self._redis = require_async_client(redis, "AsyncDistributedLock")
        self._rules = _LockRules(prefix, hooks)

    async def acquire(
        self,
        resource: str,
        *,
        ttl: timedelta,
        owner_id: str | None = None,
        blocking: bool = False,
        wait: timedelta | None = None,
        retry_interval: timedelta = DEFAULT_RETRY_INTERVAL,
    ) -> LockHandle:
        """See :meth:`DistributedLock.acquire`."""
        steps = self._rules.acquire(resource, ttl, owner_id, blocking, wait, retry_interval)
        return await adrive(self._redis, steps)

    async def release(self, handle: LockHandle) -> None:
        """See :meth:`DistributedLock.release`."""
        await adrive(self._redis, self._rules.release(handle))

    async def extend(self, handle: LockHandle, *, ttl: timedelta) -> LockHandle:
        """See :meth:`DistributedLock.extend`."""
        return await adrive(self._redis, self._rules.extend(handle, ttl))

    @contextlib.asynccontextmanager
    async def hold(
        self,
        resource: str,
        *,
        ttl: timedelta,
        owner_id: str | None = None,
        blocking: bool = False,
        wait: timedelta | None = None,
        retry_interval: timedelta = DEFAULT_RETRY_INTERVAL,
    ) -> AsyncIterator[LockHandle]:
        """``async with lock.hold(...) as handle:``; see :meth:`DistributedLock.hold`."""
        handle = await self.acquire(
            resource, ttl=ttl, owner_id=owner_id, blocking=blocking, wait=wait, retry_interval=retry_interval
        )
        try:
            yield handle
        except BaseException as body_error:
            await adrive(self._redis, self._rules.release_after(handle, body_error))
            raise
        await self.release(handle)
