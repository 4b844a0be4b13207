"""The consumer registry: who consumes, what it polls, and which queues exist.

A consumer's heartbeat writes its :class:`ConsumerRecord` (``heartbeat.lua``,
the registry hash keyed by consumer id); the reaper reads it to learn which
queues a dead consumer polled, and the admin page to show it. The registry's
set of queue names is written by :func:`register_queues` (a producer's first
enqueue to a queue, a consumer at start) and read by :func:`known_queues`;
both are steps (:mod:`fencekit._redis.steps`), :func:`queue_names` and
:func:`registering`, so ``SyncClient`` runs the same rules.

A record in Redis may have been written by another version, or by anyone
with write access: :meth:`ConsumerRecord.from_json` never raises, it keeps
what is well-formed and drops the rest.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import orjson
import redis.asyncio

from fencekit._redis.keys import KeySpace, validate_queue
from fencekit._redis.run import as_text
from fencekit._redis.steps import Batch, Steps, adrive, cmd
from fencekit.errors import ConfigError

__all__ = [
    "HOSTNAME",
    "ConsumerRecord",
    "consumer_id",
    "known_queues",
    "lease_ok",
    "queue_names",
    "register_queues",
    "registering",
]

HOSTNAME = socket.gethostname()


def consumer_id(kind: str) -> str:
    """A consumer id that is never reused: host, pid, kind and a random incarnation.

    A zombie's ack could match a new delivery if an id came back, so every
    process start, and every pool child's restart, takes a new one.
    """
    return f"{HOSTNAME}:{os.getpid()}:{kind}:{uuid.uuid4().hex[:12]}"


def lease_ok(last_beat: float, ttl: float, now: float | None = None) -> bool:
    """The lease of a consumer: it may claim while its last successful beat is younger than TTL/2.

    A consumer cut off from Redis (or paused) stops taking tasks before its
    peers may reap it (they wait a whole TTL). Times are ``time.monotonic()``.
    """
    return (time.monotonic() if now is None else now) - last_beat < ttl / 2


def _opt_int(value: Any) -> int | None:
    return value if type(value) is int else None


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    """One consumer incarnation as the registry holds it."""

    id: str
    host: str
    pid: int | None
    kind: str
    queues: tuple[str, ...] | None
    concurrency: int | None
    started: float | None
    slot: int | None = None
    supervisor: int | None = None

    @classmethod
    def new(
        cls, cid: str, queues: Sequence[str], concurrency: int, kind: str, **extra: int | None
    ) -> ConsumerRecord:
        """The record of a consumer of this process, started now (``extra``: slot, pid, supervisor)."""
        fields: dict[str, Any] = {"pid": os.getpid(), **extra}
        return cls(
            id=cid,
            host=HOSTNAME,
            kind=kind,
            queues=tuple(queues),
            concurrency=concurrency,
            started=round(time.time(), 3),
            **fields,
        )

    def to_json(self) -> bytes:
        data = asdict(self)
        data["queues"] = list(self.queues) if self.queues is not None else None
        return orjson.dumps(data)

    @classmethod
    def from_json(cls, cid: str, raw: bytes | str | None) -> ConsumerRecord:
        """The record of ``cid`` from its stored JSON; unreadable fields become None (never raises)."""
        data: Any = {}
        if raw:
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                data = {}
        if not isinstance(data, dict):
            data = {}
        started = data.get("started")
        return cls(
            id=cid,
            host=str(data.get("host", "")),
            pid=_opt_int(data.get("pid")),
            kind=str(data.get("kind", "")),
            queues=_queues(data.get("queues")),
            concurrency=_opt_int(data.get("concurrency")),
            started=float(started) if type(started) in (int, float) else None,
            slot=_opt_int(data.get("slot")),
            supervisor=_opt_int(data.get("supervisor")),
        )


def _queues(value: Any) -> tuple[str, ...] | None:
    """The valid queue names of a stored list, or None when it is not a list of names."""
    if not isinstance(value, list) or not all(isinstance(q, str) for q in value):
        return None
    valid = []
    for q in value:
        try:
            valid.append(validate_queue(q))
        except ConfigError:
            continue
    return tuple(valid)


def queue_names(keys: KeySpace) -> Steps[list[str]]:
    """Every queue name ever used with this prefix, sorted.

    A member that is not a queue name (written by something else) is left
    out: it names no keys of ours.
    """
    (names,) = yield Batch((cmd("smembers", keys.queues),))
    return sorted(q for q in (as_text(n) for n in names) if _is_queue(q))


async def known_queues(client: redis.asyncio.Redis, keys: KeySpace) -> list[str]:
    """:func:`queue_names` on an asyncio client; raises StoreError."""
    return await adrive(client, queue_names(keys))


def _is_queue(name: str) -> bool:
    try:
        validate_queue(name)
    except ConfigError:
        return False
    return True


def registering(keys: KeySpace, queues: Iterable[str]) -> Steps[None]:
    """Record queue names in the registry (idempotent)."""
    names = list(queues)
    if names:
        yield Batch((cmd("sadd", keys.queues, *names),))


async def register_queues(client: redis.asyncio.Redis, keys: KeySpace, queues: Iterable[str]) -> None:
    """:func:`registering` on an asyncio client; raises StoreError."""
    await adrive(client, registering(keys, queues))
