"""Builders of the primitives' scripts: locks, fences, idempotency keys, and the 0.1-0.6 key upgrade.

Their keys come from the caller's resource (not a queue's hash tag), which is why
``tests/unit/test_queue_units.py`` checks them apart from the queue's scripts.
"""

from __future__ import annotations

from collections.abc import Sequence

from fencekit._redis.scripts._load import Arg, Call, call

# -- locks -------------------------------------------------------------------------


def lock_acquire(*, lock: str, seq: str, owner: str, ttl_ms: int) -> Call:
    """Grant a lease and issue its token; reply token or nil (``lock_acquire.lua``)."""
    return call("lock_acquire", (lock, seq), (owner, ttl_ms))


def lock_release(*, lock: str, owner: str, token: int) -> Call:
    """Release one grant; error ``NOTOWNED`` when gone (``lock_release.lua``)."""
    return call("lock_release", (lock,), (owner, token))


def lock_extend(*, lock: str, owner: str, token: int, ttl_ms: int) -> Call:
    """Extend one grant; error ``NOTOWNED`` when gone (``lock_extend.lua``)."""
    return call("lock_extend", (lock,), (owner, token, ttl_ms))


# -- fences ------------------------------------------------------------------------


def fence_check(*, fence: str, token: int) -> Call:
    """Diagnostic check; reply current max, error ``FENCED`` (``fence_check.lua``)."""
    return call("fence_check", (fence,), (token,))


def fence_advance(*, fence: str, token: int, fence_ttl_ms: int) -> Call:
    """Accept and record a token; error ``FENCED`` (``fence_advance.lua``)."""
    return call("fence_advance", (fence,), (token, fence_ttl_ms))


def fence_set(*, fence: str, target: str, token: int, value: Arg, fence_ttl_ms: int) -> Call:
    """Fenced SET of ``target``; error ``FENCED`` (``fence_set.lua``)."""
    return call("fence_set", (fence, target), (token, value, fence_ttl_ms))


# -- idempotency -------------------------------------------------------------------


def idem_begin(*, key: str, result: str, owner: str, ttl_s: int) -> Call:
    """SET NX the pending marker; reply 1 begun / 0 exists (``idem_begin.lua``)."""
    return call("idem_begin", (key, result), (owner, ttl_s))


def idem_done(*, key: str, result: str, owner: str, ttl_s: int, store: bool, memo: str) -> Call:
    """Owner-checked done (+ memo); error ``IDEMNOTOWNED`` (``idem_done.lua``)."""
    return call("idem_done", (key, result), (owner, ttl_s, 1 if store else 0, memo))


def idem_reclaim(*, key: str, result: str, lock: str, owner: str, ttl_s: int, reserve_ms: int) -> Call:
    """Begin or take over a stale pending key, reserving the lock (``idem_reclaim.lua``)."""
    return call("idem_reclaim", (key, result, lock), (owner, ttl_s, reserve_ms))


# -- upgrade from the published fencekit 0.1-0.6 -----------------------------------


def upgrade_move(*, kind: str, keys: Sequence[str], delete: bool, dry_run: bool) -> Call:
    """Carry one old-layout key (with its memo or counter) to ours (``upgrade_move.lua``).

    ``kind`` is ``"idem"`` (old marker, old memo, our marker, our memo),
    ``"lock"`` (old lock, old counter, our lock) or ``"counter"`` (old, ours);
    reply ``migrated`` / ``current`` / ``kept`` / ``gone`` / ``foreign``.
    """
    return call("upgrade_move", keys, (kind, 1 if delete else 0, 1 if dry_run else 0))
