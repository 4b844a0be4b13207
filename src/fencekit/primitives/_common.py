"""Rules every primitive shares: which clients it takes, TTLs as Redis units, owner ids, one round trip.

The rules of :mod:`~fencekit.primitives.lock`, :mod:`~fencekit.primitives.fence`
and :mod:`~fencekit.primitives.idempotency` are steps
(:mod:`fencekit._redis.steps`), run by a sync and an asyncio driver. They
check their arguments here, so a ``timedelta`` becomes the same number of
milliseconds, and an owner id the same string, whichever primitive gets it;
and they send each script call or command with :func:`reply_of`. The two
drivers of a primitive derive from :class:`Primitive`.
"""

from __future__ import annotations

import math
import uuid
from datetime import timedelta
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import redis
import redis.asyncio

from fencekit._redis.keys import KeySpace
from fencekit._redis.steps import Batch, Op, Steps
from fencekit.errors import ConfigError

__all__ = [
    "AsyncClient",
    "Primitive",
    "SyncClient",
    "reply_of",
    "require_async_client",
    "require_sync_client",
    "resolve_owner",
    "timedelta_arg",
    "ttl_ms",
    "ttl_seconds",
]

SyncClient = Any  # redis.Redis | redis.RedisCluster (redis-py's overloads need Any here)
AsyncClient = Any  # redis.asyncio.Redis | redis.asyncio.RedisCluster


class _Rules(Protocol):
    @property
    def keys(self) -> KeySpace: ...


R = TypeVar("R", bound=_Rules)


class Primitive(Generic[R]):
    """What a primitive's sync and asyncio classes share besides its steps: the client, the rules, the prefix.

    Each class sets ``_redis`` (its kind of client, checked) and ``_rules``
    (the steps) in its ``__init__``, and ``_NAME``, its name in ``repr``.
    """

    __slots__ = ("_redis", "_rules")
    _NAME: ClassVar[str]
    _rules: R

    @property
    def prefix(self) -> str:
        return self._rules.keys.prefix

    def __repr__(self) -> str:
        return f"{self._NAME}(prefix={self.prefix!r})"


def require_sync_client(client: object, owner: str) -> SyncClient:
    """``client`` if it is a synchronous redis-py client, else TypeError."""
    if isinstance(client, (redis.asyncio.Redis, redis.asyncio.RedisCluster)):
        raise TypeError(f"{owner} needs a synchronous redis client; use Async{owner} for asyncio")
    if not isinstance(client, (redis.Redis, redis.RedisCluster)):
        raise TypeError(f"{owner} needs a redis.Redis or redis.RedisCluster, got {client!r}")
    return client


def require_async_client(client: object, owner: str) -> AsyncClient:
    """``client`` if it is an asyncio redis-py client, else TypeError."""
    if isinstance(client, (redis.Redis, redis.RedisCluster)):
        raise TypeError(
            f"{owner} needs a redis.asyncio client; use {owner.removeprefix('Async')} for a synchronous one"
        )
    if not isinstance(client, (redis.asyncio.Redis, redis.asyncio.RedisCluster)):
        raise TypeError(f"{owner} needs a redis.asyncio.Redis or RedisCluster, got {client!r}")
    return client


def timedelta_arg(value: object, label: str) -> timedelta:
    """``value`` if it is a ``timedelta``, else TypeError naming ``label``."""
    if not isinstance(value, timedelta):
        raise TypeError(f"{label} must be a datetime.timedelta, got {type(value).__name__} {value!r}")
    return value


def ttl_ms(value: object, label: str = "ttl") -> int:
    """A positive ``timedelta`` in whole milliseconds (rounded up), at least 1 ms."""
    ttl = timedelta_arg(value, label)
    if ttl <= timedelta(0):
        raise ConfigError(f"{label} must be positive, got {ttl!r}")
    return math.ceil(ttl / timedelta(milliseconds=1))


def ttl_seconds(value: object, label: str = "ttl") -> int:
    """A ``timedelta`` of at least one second in whole seconds (rounded up)."""
    ttl = timedelta_arg(value, label)
    if ttl < timedelta(seconds=1):
        raise ConfigError(f"{label} must be at least 1 second (Redis EX), got {ttl!r}")
    return math.ceil(ttl / timedelta(seconds=1))


def resolve_owner(value: object) -> str:
    """The owner id a lock grant or an idempotency key records: ``value``, or a fresh uuid4 hex."""
    if value is None:
        return uuid.uuid4().hex
    if not isinstance(value, str) or not value:
        raise ConfigError(f"owner_id must be a non-empty str, got {value!r}")
    return value


def reply_of(op: Op) -> Steps[Any]:
    """The reply of one script call or command, in a round trip of its own.

    An error reply is raised translated (a script's refusal as its
    :class:`~fencekit.errors.FenceKitError`), at the ``yield from``, so a rule
    can catch it there; a script missing on the server is loaded first.
    """
    replies = yield Batch([op])
    return replies[0]
