"""How a delivery ends: the settle calls shared by the consumer and the reaper.

Every way a delivery leaves a consumer's in-flight hash -- acknowledged
(``ack_claim.lua``, in the consumer's turn), retried later (``retry.lua``),
returned to the head of its queue (``requeue.lua``), finished as failed or
dead-lettered (``fail.lua``), or dropped unrun as expired (``drop.lua``) --
is built here once, so the single-process ``Server``, the pool and the
reaper settle tasks by the same rules. Each
call acts only while the :class:`Delivery` is still in flight (invariant I3).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from fencekit._redis import scripts
from fencekit._redis.keys import KeySpace, is_jid
from fencekit._redis.link import Link, wait_replicas
from fencekit._redis.run import Durability
from fencekit.errors import PayloadError, StoreError
from fencekit.jobs import codec
from fencekit.jobs._ids import uuid7
from fencekit.jobs.records import JobError, encode_error
from fencekit.jobs.worker import RetryPolicy

__all__ = [
    "Delivery",
    "Retention",
    "Verdict",
    "after_crash",
    "after_stop",
    "confirm_settled",
    "corrupt",
    "delivery_token",
    "drop",
    "fail",
    "job_keys",
    "requeue",
    "retry",
    "returns",
]


@dataclass(frozen=True, slots=True)
class Retention:
    """What a queue keeps: how long a job's fence outlives its last raise, how many dead letters,
    finished records and failed records.

    Built from the ``fence_ttl``, ``keep_dead``, ``keep_finished`` and
    ``keep_failed`` settings (:mod:`fencekit.settings` holds their defaults).
    """

    fence_ttl_ms: int
    keep_dead: int
    keep_finished: int = 10_000
    keep_failed: int = 1_000

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> Retention:
        """From the settings of a ``Server`` or pool."""
        return cls(
            max(1, round(settings["fence_ttl"] * 1000)),
            settings["keep_dead"],
            settings["keep_finished"],
            settings["keep_failed"],
        )


@dataclass(frozen=True, slots=True)
class Delivery:
    """One claim of a task: its queue, the in-flight hash that holds it, its token and raw envelope."""

    queue: str
    inflight: str
    token: int
    raw: bytes = b""


def delivery_token(field: bytes | str) -> int | None:
    """The token of an in-flight hash field, or None for a field that is none (written by someone else)."""
    text = field.decode(errors="replace") if isinstance(field, bytes) else field
    return int(text) if text.isdigit() and 0 < len(text) < 20 else None


class InFlight(NamedTuple):
    """One delivery read from an in-flight hash (the admin page's and the stall report's view)."""

    token: int
    jid: str | None
    operation: str | None  # None: the envelope does not decode
    attempt: int
    recorded: bool = False  # the task keeps a record (its page at /admin/job exists while it runs)


def in_flight(entries: Mapping[Any, Any]) -> list[InFlight]:
    """The deliveries of one in-flight hash (``HGETALL``), fields that are no token left out.

    An envelope that does not decode still shows its jid when one can be
    read (:func:`~fencekit.jobs.codec.peek_jid`): this is for people.
    """
    found = []
    for field, raw in entries.items():
        token = delivery_token(field)
        if token is None:
            continue
        try:
            env = codec.decode(raw)
        except PayloadError:
            found.append(InFlight(token, codec.peek_jid(raw), None, 0))
        else:
            found.append(InFlight(token, env.jid, env.operation, env.attempt, env.keep is not None))
    return found


def corrupt(
    keys: KeySpace, queue: str, inflight: str, field: bytes | str, *, retention: Retention
) -> scripts.Call:
    """Take an in-flight field that is no delivery token out, as a dead letter with the reason."""
    name = field.decode(errors="replace") if isinstance(field, bytes) else field
    qk = keys.queue(queue)
    record = orjson.dumps(
        {
            "reason": f"in-flight entry {name[:80]!r} is not a delivery token (written by something else)",
            "jid": None,
            "queue": queue,
            "token": None,
            "consumer": None,
            "at": time.time_ns() // 1_000_000,
        }
    )
    return scripts.fail(
        inflight=inflight,
        stats=qk.stats,
        dead=qk.dead,
        dead_index=qk.dead_index,
        token=name,
        record=record,
        dead_id=uuid7(),
        keep_dead=retention.keep_dead,
    )


def _fence(keys: KeySpace, delivery: Delivery, jid: str | None) -> str:
    """The job's fence key; a delivery without a usable jid is fenced by its token."""
    return keys.job_fence(delivery.queue, jid if is_jid(jid) else f"token-{delivery.token}")


def job_keys(keys: KeySpace, queue: str, jid: str | None) -> scripts.JobRecordKeys | None:
    """The record keys of task ``jid`` of ``queue`` (None without a usable jid)."""
    if not is_jid(jid):
        return None
    qk = keys.queue(queue)
    return scripts.JobRecordKeys(qk.job(jid), qk.finished, qk.failed, qk.done_channel, jid)


def fail(
    keys: KeySpace,
    delivery: Delivery,
    *,
    jid: str | None,
    retention: Retention,
    reason: str = "",
    consumer: str | None = None,
    error: JobError | None = None,
    keep: bool = True,
) -> scripts.Call:
    """Finish as failed; with a ``reason`` also keep it as a dead letter.

    ``error`` (else the reason) goes into the task's record: a plain failure is
    kept as a failed record unless ``keep`` is False (the worker opted out).
    """
    qk = keys.queue(delivery.queue)
    if error is None:
        error = JobError("DeadLetter" if reason else "Failed", reason)
    record = b""
    if reason:
        record = orjson.dumps(
            {
                "reason": reason,
                "jid": jid,
                "queue": delivery.queue,
                "token": delivery.token,
                "consumer": consumer,
                "at": time.time_ns() // 1_000_000,
            }
        )
    return scripts.fail(
        inflight=delivery.inflight,
        stats=qk.stats,
        dead=qk.dead,
        dead_index=qk.dead_index,
        token=delivery.token,
        record=record,
        dead_id=uuid7(),
        keep_dead=retention.keep_dead,
        job=job_keys(keys, delivery.queue, jid) if keep or reason else None,
        error=encode_error(error),
        keep_failed=retention.keep_failed,
        keep_finished=retention.keep_finished,
    )


def drop(
    keys: KeySpace, delivery: Delivery, counter: str, *, jid: str | None, recorded: bool, retention: Retention
) -> scripts.Call:
    """Finish unrun, counted under ``counter`` ("expired": it was not started in time)."""
    return scripts.drop(
        inflight=delivery.inflight,
        stats=keys.queue(delivery.queue).stats,
        token=delivery.token,
        counter=counter,
        job=job_keys(keys, delivery.queue, jid) if recorded else None,
        keep_finished=retention.keep_finished,
    )


def requeue(
    keys: KeySpace,
    delivery: Delivery,
    envelope: bytes,
    *,
    jid: str | None,
    counter: str,
    retention: Retention,
    run: str = "",
) -> scripts.Call:
    """Return to the head of the queue (``counter`` "retried" for crashes, "" otherwise; ``run``
    "interrupted" for a task a stop interrupted at a checkpoint)."""
    qk = keys.queue(delivery.queue)
    return scripts.requeue(
        inflight=delivery.inflight,
        pending=qk.pending,
        stats=qk.stats,
        wake=qk.wake,
        fence=_fence(keys, delivery, jid),
        token=delivery.token,
        envelope=envelope,
        counter=counter,
        fence_ttl_ms=retention.fence_ttl_ms,
        record=keys.queue(delivery.queue).job(jid) if is_jid(jid) else None,
        run=run,
    )


def retry(
    keys: KeySpace,
    delivery: Delivery,
    envelope: codec.Envelope,
    following: int,
    delay: float,
    error: JobError | None = None,
) -> scripts.Call:
    """Schedule attempt ``following`` in ``delay`` seconds (the policy's delay, decided by the caller).

    A task with a record keeps the attempt's ``error`` in it.
    """
    qk = keys.queue(delivery.queue)
    recorded = envelope.keep is not None
    return scripts.retry(
        inflight=delivery.inflight,
        scheduled=qk.scheduled,
        stats=qk.stats,
        token=delivery.token,
        delay_ms=round(delay * 1000),
        envelope=envelope.next_attempt(following),
        record=qk.job(envelope.jid) if recorded else None,
        error=encode_error(error) if recorded and error is not None else b"",
    )


PolicyLookup = Callable[[str, str], RetryPolicy]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What happens to a delivery its consumer did not settle, and why (for the log)."""

    call: scripts.Call
    jid: str | None
    returned: bool
    reason: str


def after_crash(
    keys: KeySpace, delivery: Delivery, policy_for: PolicyLookup, *, retention: Retention
) -> Verdict:
    """A crash is a failed attempt: back at once with ``attempt + 1``, or failed."""
    try:
        envelope = codec.decode(delivery.raw)
    except PayloadError as exc:
        jid = codec.peek_jid(delivery.raw)
        reason = f"malformed payload: {exc}"
        call = fail(keys, delivery, jid=jid, reason=reason, retention=retention)
        return Verdict(call, jid, False, reason)
    following = policy_for(delivery.queue, envelope.operation).next_attempt(envelope.attempt)
    if following is None:
        reason = f"its consumer stopped during attempt {envelope.attempt + 1} and no retry is left"
        error = JobError("ConsumerLost", reason)
        call = fail(keys, delivery, jid=envelope.jid, retention=retention, error=error)
        return Verdict(call, envelope.jid, False, reason)
    call = requeue(
        keys,
        delivery,
        envelope.next_attempt(following),
        jid=envelope.jid,
        counter="retried",
        retention=retention,
    )
    return Verdict(call, envelope.jid, True, f"attempt {envelope.attempt + 1} -> {following + 1}")


def returns(
    keys: KeySpace,
    queue: str,
    inflight: str,
    entries: Sequence[Any],
    *,
    retention: Retention,
    skip: Collection[int] = (),
) -> list[scripts.Call]:
    """The calls that take a consumer's in-flight entries (``HGETALL``, flat) back to ``queue``.

    Every delivery not in ``skip`` is returned unfinished (:func:`after_stop`);
    a field that is no delivery token (written by someone else) is taken out
    as a dead letter instead of being trusted.
    """
    calls = []
    for field, raw in zip(entries[::2], entries[1::2]):
        token = delivery_token(field)
        if token is None:
            calls.append(corrupt(keys, queue, inflight, field, retention=retention))
        elif token not in skip:
            calls.append(after_stop(keys, Delivery(queue, inflight, token, raw), retention=retention).call)
    return calls


def after_stop(keys: KeySpace, delivery: Delivery, *, retention: Retention) -> Verdict:
    """A task returned unfinished (its consumer stopped, or the stop was cut short): back as it was."""
    jid = codec.peek_jid(delivery.raw)
    call = requeue(keys, delivery, delivery.raw, jid=jid, counter="", retention=retention)
    return Verdict(call, jid, True, "returned unfinished at shutdown")


# durable settlements (durable_replicas): scripts cannot WAIT themselves, so the consumer asks after
# the round trip; too few confirmations are a WARNING (the settlement landed; a failover could undo it)
async def confirm_settled(link: Link, durable: Durability, logger: logging.Logger) -> None:
    """``WAIT`` for ``durable.replicas``; say so when fewer confirm in time or Redis fails."""
    try:
        confirmed = await wait_replicas(link, durable)
    except StoreError as exc:
        logger.warning("could not wait for %d replica(s) after settling tasks: %s", durable.replicas, exc)
        return
    if confirmed < durable.replicas:
        logger.warning(
            "settlements confirmed by %d of %d replica(s) within %d ms: a failover now could undo them "
            "(those tasks would run again)",
            confirmed,
            durable.replicas,
            durable.timeout_ms,
        )
