"""How a delivery ends: the settle calls shared by the consumer and the reaper.

Every way a delivery leaves a consumer's in-flight hash -- acknowledged
(``ack_claim.lua``, in the consumer's turn), retried later (``retry.lua``),
returned to the head of its queue (``requeue.lua``), or finished as failed or
dead-lettered (``fail.lua``) -- is built here once, so the single-process
``Server``, the pool and the reaper settle tasks by the same rules.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace
from fencekit.errors import PayloadError
from fencekit.queue import codec
from fencekit.queue.ids import uuid7
from fencekit.queue.job import job_resource
from fencekit.queue.worker import RetryPolicy

DEFAULT_FENCE_TTL_MS = 7 * 24 * 3600 * 1000
DEFAULT_KEEP_DEAD = 10_000


@dataclass(frozen=True, slots=True)
class SettleSettings:
    """Expiry of job fence keys, and how many dead letters a queue keeps."""

    fence_ttl_ms: int = DEFAULT_FENCE_TTL_MS
    keep_dead: int = DEFAULT_KEEP_DEAD


def _fence(keys: KeySpace, queue: str, jid: str | None, token: int) -> str:
    return keys.fence(job_resource(queue, jid or f"token-{token}"))


def fail(
    keys: KeySpace,
    queue: str,
    inflight: str,
    token: int,
    *,
    jid: str | None,
    reason: str = "",
    consumer: str | None = None,
    settings: SettleSettings,
) -> scripts.Call:
    """Finish as failed; with a ``reason`` also keep it as a dead letter."""
    qk = keys.queue(queue)
    record = b""
    if reason:
        record = orjson.dumps(
            {
                "reason": reason,
                "jid": jid,
                "queue": queue,
                "token": token,
                "consumer": consumer,
                "at": time.time_ns() // 1_000_000,
            }
        )
    return scripts.fail(
        inflight=inflight,
        stats=qk.stats,
        dead=qk.dead,
        dead_index=qk.dead_index,
        fence=_fence(keys, queue, jid, token),
        token=token,
        record=record,
        dead_id=uuid7(),
        keep_dead=settings.keep_dead,
        fence_ttl_ms=settings.fence_ttl_ms,
    )


def requeue(
    keys: KeySpace,
    queue: str,
    inflight: str,
    token: int,
    envelope: bytes,
    *,
    jid: str | None,
    counter: str,
    settings: SettleSettings,
) -> scripts.Call:
    """Return to the head of the queue (``counter`` "retried" for crashes, "" otherwise)."""
    qk = keys.queue(queue)
    return scripts.requeue(
        inflight=inflight,
        pending=qk.pending,
        stats=qk.stats,
        wake=qk.wake,
        fence=_fence(keys, queue, jid, token),
        token=token,
        envelope=envelope,
        counter=counter,
        fence_ttl_ms=settings.fence_ttl_ms,
    )


def retry(
    keys: KeySpace, queue: str, inflight: str, token: int, envelope: codec.Envelope, following: int
) -> scripts.Call:
    """Schedule attempt ``following`` after the policy's delay."""
    qk = keys.queue(queue)
    return scripts.retry(
        inflight=inflight,
        scheduled=qk.scheduled,
        stats=qk.stats,
        token=token,
        delay_ms=round(RetryPolicy.delay(envelope.attempt) * 1000),
        envelope=envelope.next_attempt(following),
    )


PolicyLookup = Callable[[str, str], RetryPolicy]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What happens to a delivery whose consumer died, and why (for the log)."""

    call: scripts.Call
    jid: str | None
    returned: bool
    reason: str


def after_crash(
    keys: KeySpace,
    queue: str,
    inflight: str,
    token: int,
    raw: bytes,
    policy_for: PolicyLookup,
    *,
    settings: SettleSettings,
) -> Verdict:
    """A crash is a failed attempt: back at once with ``attempt + 1``, or failed."""
    try:
        envelope = codec.decode(raw)
    except PayloadError as exc:
        jid = codec.peek_jid(raw)
        reason = f"malformed payload: {exc}"
        call = fail(keys, queue, inflight, token, jid=jid, reason=reason, settings=settings)
        return Verdict(call, jid, False, reason)
    following = policy_for(queue, envelope.operation).next_attempt(envelope.attempt)
    if following is None:
        call = fail(keys, queue, inflight, token, jid=envelope.jid, settings=settings)
        return Verdict(call, envelope.jid, False, f"its consumer died during attempt {envelope.attempt + 1}")
    call = requeue(
        keys,
        queue,
        inflight,
        token,
        envelope.next_attempt(following),
        jid=envelope.jid,
        counter="retried",
        settings=settings,
    )
    return Verdict(call, envelope.jid, True, f"attempt {envelope.attempt + 1} -> {following + 1}")


def after_stop(
    keys: KeySpace,
    queue: str,
    inflight: str,
    token: int,
    raw: bytes,
    policy_for: PolicyLookup,
    *,
    settings: SettleSettings,
) -> Verdict:
    """A stop cut short by the supervisor: back as it was, no attempt counted."""
    jid = codec.peek_jid(raw)
    call = requeue(keys, queue, inflight, token, raw, jid=jid, counter="", settings=settings)
    return Verdict(call, jid, True, "returned unfinished at shutdown")
