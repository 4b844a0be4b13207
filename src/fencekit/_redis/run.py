"""Running commands and scripts through redis-py, and the one translation of Redis errors.

:func:`translate_error` (exceptions of redis-py and sockets) and
:func:`translate_reply` (an error reply's text, as the hot path reads it)
are the only places where a Redis error becomes ours: a script's refusal
(``FENCED``, ``NOTOWNED`` ... via :data:`fencekit.errors.SCRIPT_ERRORS`),
a ``READONLY`` reply (the master was demoted), or any other failure as
:class:`~fencekit.errors.StoreError`. :func:`run`, :func:`arun` and
:func:`apipeline` execute :class:`~fencekit._redis.scripts.Call` values by
SHA and load a script on ``NOSCRIPT`` (the script did not run, so that is not
a re-send). :class:`Durability` is the ``WAIT`` that follows writes when
``durable_replicas`` asks for it (Redis refuses ``WAIT`` inside scripts).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, NamedTuple, overload

import redis
import redis.asyncio
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)

from fencekit._redis.scripts import Call
from fencekit.errors import ConfigError, FenceKitError, StoreError, script_error

__all__ = [
    "ClusterDown",
    "Durability",
    "KeysMoving",
    "NodeLost",
    "NotSent",
    "Redirected",
    "TryAgain",
    "Unblocked",
    "arun",
    "as_text",
    "run",
    "translate_error",
    "translate_reply",
    "translated",
]

READONLY_REASON = "Redis is a read-only replica now (failover?)"


class Redirected(StoreError):
    """A cluster node answered ``MOVED`` or ``ASK``: it did not run the command; ``address`` owns the slot.

    On a ``redis+cluster://`` URL the cluster link follows it (a redirect is
    not a re-send: the node said it did not run the command); anywhere else it
    means a plain URL points at a cluster node.
    """

    def __init__(self, message: str, kind: str, slot: int, address: tuple[str, int]) -> None:
        super().__init__(message)
        self.kind = kind
        self.slot = slot
        self.address = address


class NodeLost(StoreError):
    """One Redis Cluster node could not be reached or its connection failed; the others are unaffected.

    Like any lost reply, the request may have run on that node and is not
    re-sent. The cluster link puts it in the slots of that node's calls only.
    """


class TryAgain(StoreError):
    """``TRYAGAIN``: the keys of one command are split by a slot migration under way; it did not run."""

    transient = True
    """A cluster in motion (a migration, a failover), not a fault: loops log it as a WARNING."""


class KeysMoving(StoreError):
    """A script reached a key of its slot that a migration already moved to another node.

    Our scripts name the priority and parked lists from their declared keys
    (one hash tag), so the node runs them and they stop at the first such key:
    a read changed nothing (the queue handle's reads raise :class:`TryAgain`),
    a write may have made its changes before that key and is not re-sent.
    """


class NotSent(TryAgain):
    """The request was never written: its connection was closed (or closed under the write).

    It provably did not run, so the cluster link sends it again on the slot's
    owner (I4 allows exactly this re-send); anywhere else the owner opens a new
    connection as for any lost one.
    """


class ClusterDown(TryAgain):
    """``CLUSTERDOWN``: the cluster refuses commands (a failed primary not yet replaced); it did not run."""


class Unblocked(TryAgain):
    """``UNBLOCKED``: a blocking command (``BLPOP``) was released because its node changed role
    (a failover made the primary a replica); it returned nothing. Read the map, then block again."""


def _redirect(message: str) -> Redirected | None:
    kind, _, rest = message.partition(" ")
    slot_text, _, where = rest.partition(" ")
    host, _, port_text = where.rpartition(":")
    if not (slot_text.isdigit() and port_text.isdigit()):
        return None
    reason = (
        f"{message}: the key's slot is served by another Redis Cluster node "
        "(a plain redis:// URL pointing at a cluster node? use redis+cluster://)"
    )
    return Redirected(reason, kind, int(slot_text), (host.strip("[]") or "127.0.0.1", int(port_text)))


OOM_REASON = "Redis is out of memory (OOM: over maxmemory, writes refused)"


@overload
def as_text(value: bytes | str) -> str: ...
@overload
def as_text(value: bytes | str | None) -> str | None: ...
def as_text(value: bytes | str | None) -> str | None:
    """A reply as ``str`` whatever the client's ``decode_responses`` (``None`` stays ``None``).

    Bytes that are not UTF-8 are replaced, not refused: a reply is shown or
    compared, never trusted to be well-formed.
    """
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value


def is_bad_database(message: str) -> bool:
    """True for the reply to ``SELECT`` of a database index the server does not have."""
    return "DB index is out of range" in message


def is_readonly(message: str) -> bool:
    """True for the error reply of a write sent to a replica."""
    return message.startswith("READONLY")


def is_out_of_memory(message: str) -> bool:
    """True for the refusal of a write while Redis is over ``maxmemory`` (direct or inside a script)."""
    return message.startswith("OOM") or "used memory > 'maxmemory'" in message


def translate_reply(message: str) -> FenceKitError:
    """Our exception for an error reply's text (a script's refusal, READONLY, OOM, anything else)."""
    if is_readonly(message):
        return StoreError(f"{READONLY_REASON}: {message}")
    if is_bad_database(message):
        return ConfigError(
            f"{message} (the URL names a database this Redis does not have: see its 'databases')"
        )
    if message.startswith(("MOVED ", "ASK ")):
        redirect = _redirect(message)
        if redirect is not None:
            return redirect
    if message.startswith("CLUSTERDOWN"):
        return ClusterDown(f"{message} (a primary failed and is not replaced yet; the command did not run)")
    if message.startswith("Script attempted to access a non local key"):
        return KeysMoving(f"{message} (a slot migration moved some of this script's keys)")
    if message.startswith("UNBLOCKED"):
        return Unblocked(f"{message} (a failover; the blocking command returned nothing)")
    if message.startswith("TRYAGAIN"):
        return TryAgain(f"{message} (a slot migration is moving these keys; the command did not run)")
    if is_out_of_memory(message):
        return StoreError(f"{OOM_REASON}: {message}")
    mapped = script_error(message)
    if mapped is not None:
        return mapped
    return StoreError(f"ResponseError: {message}")


def translate_error(exc: BaseException) -> BaseException:
    """Our exception for a redis-py or socket error; anything else is returned as it is."""
    if isinstance(exc, ReadOnlyError):
        return StoreError(f"{READONLY_REASON}: {exc}")
    if isinstance(exc, (MovedError, AskError, TryAgainError)):  # redis-py strips the reply's first word
        head = "MOVED" if isinstance(exc, MovedError) else "ASK" if isinstance(exc, AskError) else "TRYAGAIN"
        return translate_reply(f"{head} {exc}")
    if isinstance(exc, ClusterDownError):
        return translate_reply(f"CLUSTERDOWN {exc}")
    if isinstance(exc, ResponseError):
        return translate_reply(str(exc))
    if isinstance(exc, (RedisError, OSError)):
        return StoreError(f"{type(exc).__name__}: {exc}")
    return exc


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Re-raise redis-py and socket errors as fencekit errors."""
    try:
        yield
    except (TimeoutError, RedisError, OSError) as exc:
        raise translate_error(exc) from exc


class Durability(NamedTuple):
    """``WAIT replicas timeout_ms`` after writes: how many replicas must confirm, within how long."""

    replicas: int
    timeout_ms: int

    @classmethod
    def of(cls, replicas: int, timeout: float) -> Durability | None:
        """The WAIT of ``durable_replicas``/``durable_timeout`` settings, or None when off."""
        return cls(replicas, max(1, round(timeout * 1000))) if replicas else None

    def command(self) -> tuple[str, int, int]:
        return ("WAIT", self.replicas, self.timeout_ms)

    @property
    def reply_timeout(self) -> float:
        """Seconds to wait for WAIT's reply: its own timeout plus a margin for the round trip."""
        return self.timeout_ms / 1000 + 5.0


def run(client: redis.Redis | redis.RedisCluster, call: Call) -> Any:
    """Execute ``call`` synchronously by SHA; load the script on ``NOSCRIPT``."""
    keys_and_args = (*call.keys, *call.args)
    with translated():
        try:
            return client.evalsha(call.script.sha, len(call.keys), *keys_and_args)
        except NoScriptError:
            client.script_load(call.script.source)
            return client.evalsha(call.script.sha, len(call.keys), *keys_and_args)


async def arun(client: redis.asyncio.Redis | redis.asyncio.RedisCluster, call: Call) -> Any:
    """Execute ``call`` on an asyncio client by SHA; load the script on ``NOSCRIPT``."""
    keys_and_args = (*call.keys, *call.args)
    with translated():
        try:
            return await client.evalsha(call.script.sha, len(call.keys), *keys_and_args)
        except NoScriptError:
            await client.script_load(call.script.source)
            return await client.evalsha(call.script.sha, len(call.keys), *keys_and_args)
