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

The two classes share one implementation of the rules (argument checks, key
and script-call building, reading the replies): :class:`_Acquisition` and
the module-level helpers. They differ only in how a call is executed
(``runner.run`` or ``await runner.arun``) and how they wait between attempts
(``time.sleep`` or ``asyncio.sleep``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

from fencekit._redis import run as runner
from fencekit._redis import scripts
from fencekit._redis.keys import DEFAULT_PREFIX, KeySpace
from fencekit._redis.scripts import Call
from fencekit.errors import ConfigError, FenceKitError, LockNotAcquired
from fencekit.hooks import FenceKitHooks, check_hooks
from fencekit.primitives._common import (
    AsyncClient,
    SyncClient,
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


def _release_failed(body_error: BaseException, release_error: FenceKitError) -> None:
    """Keep the body's exception; record that the release failed too."""
    if sys.version_info >= (3, 11):
        body_error.add_note(f"fencekit: releasing the lock also failed: {release_error!r}")


# -- the shared rules --------------------------------------------------------------


class _LockRules:
    """Keys and script calls of one prefix; no I/O."""

    __slots__ = ("hooks", "keys")

    def __init__(self, prefix: str, hooks: FenceKitHooks | None) -> None:
        self.keys = KeySpace(prefix)
        self.hooks = check_hooks(hooks)

    def released(self, handle: LockHandle) -> None:
        if self.hooks is not None:
            self.hooks.lock_released(handle.resource)

    def lock_key(self, resource: str) -> str:
        return self.keys.lock(resource)

    def release_call(self, handle: object) -> Call:
        handle = _check_handle(handle)
        return scripts.lock_release(
            lock=self.keys.lock(handle.resource), owner=handle.owner_id, token=handle.token.value
        )

    def extend_call(self, handle: object, ttl: object) -> tuple[Call, LockHandle]:
        """The extend call and the handle it yields when Redis accepts it."""
        handle = _check_handle(handle)
        lease_ms = ttl_ms(ttl)
        call = scripts.lock_extend(
            lock=self.keys.lock(handle.resource),
            owner=handle.owner_id,
            token=handle.token.value,
            ttl_ms=lease_ms,
        )
        return call, dataclasses.replace(handle, ttl=timedelta_arg(ttl, "ttl"))

    def acquisition(
        self,
        resource: str,
        *,
        ttl: object,
        owner_id: object,
        blocking: bool,
        wait: object,
        retry_interval: object,
    ) -> _Acquisition:
        return _Acquisition(
            self.keys,
            self.hooks,
            resource,
            ttl=ttl,
            owner_id=owner_id,
            blocking=blocking,
            wait=wait,
            retry_interval=retry_interval,
        )


class _Acquisition:
    """One ``acquire``: the script call to (re)send and when to stop trying.

    Drivers loop: send :attr:`call`, pass the reply to :meth:`granted`; on
    ``None`` sleep :meth:`next_delay` seconds (which raises
    :class:`LockNotAcquired` when there is no time left) and try again.
    """

    __slots__ = ("_deadline", "_hooks", "_interval", "_wait", "call", "owner_id", "resource", "ttl")

    def __init__(
        self,
        keys: KeySpace,
        hooks: FenceKitHooks | None,
        resource: str,
        *,
        ttl: object,
        owner_id: object,
        blocking: bool,
        wait: object,
        retry_interval: object,
    ) -> None:
        lease_ms = ttl_ms(ttl)
        self._hooks = hooks
        self.ttl = timedelta_arg(ttl, "ttl")
        self.resource = resource
        self.owner_id = resolve_owner(owner_id)
        if not isinstance(blocking, bool):
            raise TypeError(f"blocking must be a bool, got {blocking!r}")
        self._wait: timedelta | None = None
        if blocking:
            if wait is None:
                raise ConfigError("blocking=True needs wait=timedelta(...): how long to keep trying")
            self._wait = timedelta_arg(wait, "wait")
            if self._wait < timedelta(0):
                raise ConfigError(f"wait must not be negative, got {self._wait!r}")
            ttl_ms(retry_interval, "retry_interval")
        elif wait is not None:
            raise ConfigError("wait only applies with blocking=True")
        self._interval = timedelta_arg(retry_interval, "retry_interval").total_seconds()
        self.call = scripts.lock_acquire(
            lock=keys.lock(resource),
            seq=keys.lock_seq(resource),
            owner=self.owner_id,
            ttl_ms=lease_ms,
        )
        self._deadline = time.monotonic() + (self._wait.total_seconds() if self._wait else 0.0)

    def granted(self, reply: object) -> LockHandle | None:
        """The handle when ``reply`` is a token, ``None`` when the lock is held."""
        if reply is None:
            return None
        if isinstance(reply, bool) or not isinstance(reply, int):
            raise FenceKitError(f"unexpected reply from lock_acquire.lua: {reply!r}")
        if self._hooks is not None:
            self._hooks.lock_acquired(self.resource, reply)
        return LockHandle(self.resource, self.owner_id, FenceToken(reply, self.resource), self.ttl)

    def next_delay(self) -> float:
        """Seconds to wait before the next attempt; LockNotAcquired when out of time."""
        remaining = self._deadline - time.monotonic()
        if self._wait is None or remaining <= 0:
            detail = f" within {self._wait}" if self._wait is not None else ""
            if self._hooks is not None:
                self._hooks.lock_acquire_failed(self.resource)
            raise LockNotAcquired(f"lock on {self.resource!r} is held by another owner{detail}")
        return min(self._interval, remaining)


# -- the two drivers ---------------------------------------------------------------


class DistributedLock:
    """Leases with fencing tokens on ``redis.Redis`` or ``redis.RedisCluster``.

    Every key starts with ``{prefix}:``; a resource's keys share one hash tag.
    See the module docstring for what a lease does and does not guarantee.
    """

    __slots__ = ("_redis", "_rules")

    def __init__(
        self, redis: SyncClient, *, prefix: str = DEFAULT_PREFIX, hooks: FenceKitHooks | None = None
    ) -> None:
        """``hooks``: callbacks told of each grant, refusal and release (:mod:`fencekit.hooks`)."""
        self._redis = require_sync_client(redis, "DistributedLock")
        self._rules = _LockRules(prefix, hooks)

    @property
    def prefix(self) -> str:
        return self._rules.keys.prefix

    def lock_key(self, resource: str) -> str:
        """The Redis key that holds ``resource``'s lease (``P:lock:{resource}``)."""
        return self._rules.lock_key(resource)

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
        attempt = self._rules.acquisition(
            resource,
            ttl=ttl,
            owner_id=owner_id,
            blocking=blocking,
            wait=wait,
            retry_interval=retry_interval,
        )
        while True:
            handle = attempt.granted(runner.run(self._redis, attempt.call))
            if handle is not None:
                return handle
            time.sleep(attempt.next_delay())

    def release(self, handle: LockHandle) -> None:
        """End this grant's lease; :class:`LockNotOwned` if it is gone already."""
        runner.run(self._redis, self._rules.release_call(handle))
        self._rules.released(handle)

    def extend(self, handle: LockHandle, *, ttl: timedelta) -> LockHandle:
        """Set this grant's lease to ``ttl`` from now; the same token, a new ``ttl``.

        Raises :class:`LockNotOwned` (changing nothing) when the lease expired
        or belongs to another grant; the token cannot be revived.
        """
        call, extended = self._rules.extend_call(handle, ttl)
        runner.run(self._redis, call)
        return extended

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
            resource,
            ttl=ttl,
            owner_id=owner_id,
            blocking=blocking,
            wait=wait,
            retry_interval=retry_interval,
        )
        try:
            yield handle
        except BaseException as body_error:
            try:
                self.release(handle)
            except FenceKitError as release_error:
                _release_failed(body_error, release_error)
            raise
        self.release(handle)

    def __repr__(self) -> str:
        return f"DistributedLock(prefix={self.prefix!r})"


class AsyncDistributedLock:
    """The asyncio twin of :class:`DistributedLock` (``redis.asyncio`` clients)."""

    __slots__ = ("_redis", "_rules")

    def __init__(
        self, redis: AsyncClient, *, prefix: str = DEFAULT_PREFIX, hooks: FenceKitHooks | None = None
    ) -> None:
        """``hooks``: callbacks told of each grant, refusal and release (:mod:`fencekit.hooks`)."""
        self._redis = require_async_client(redis, "AsyncDistributedLock")
        self._rules = _LockRules(prefix, hooks)

    @property
    def prefix(self) -> str:
        return self._rules.keys.prefix

    def lock_key(self, resource: str) -> str:
        """The Redis key that holds ``resource``'s lease (``P:lock:{resource}``)."""
        return self._rules.lock_key(resource)

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
        attempt = self._rules.acquisition(
            resource,
            ttl=ttl,
            owner_id=owner_id,
            blocking=blocking,
            wait=wait,
            retry_interval=retry_interval,
        )
        while True:
            handle = attempt.granted(await runner.arun(self._redis, attempt.call))
            if handle is not None:
                return handle
            await asyncio.sleep(attempt.next_delay())

    async def release(self, handle: LockHandle) -> None:
        """See :meth:`DistributedLock.release`."""
        await runner.arun(self._redis, self._rules.release_call(handle))
        self._rules.released(handle)

    async def extend(self, handle: LockHandle, *, ttl: timedelta) -> LockHandle:
        """See :meth:`DistributedLock.extend`."""
        call, extended = self._rules.extend_call(handle, ttl)
        await runner.arun(self._redis, call)
        return extended

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
            resource,
            ttl=ttl,
            owner_id=owner_id,
            blocking=blocking,
            wait=wait,
            retry_interval=retry_interval,
        )
        try:
            yield handle
        except BaseException as body_error:
            try:
                await self.release(handle)
            except FenceKitError as release_error:
                _release_failed(body_error, release_error)
            raise
        await self.release(handle)

    def __repr__(self) -> str:
        return f"AsyncDistributedLock(prefix={self.prefix!r})"
