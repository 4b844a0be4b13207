"""The exception tree of fencekit, translated from Redis at one boundary.

::

    FenceKitError                    root of everything fencekit raises
    ├── LockNotAcquired              lock held by someone else, or wait timed out
    ├── LockNotOwned                 release/extend by a holder whose lease is gone
    ├── IdempotencyNotOwned          mark_done by a worker that no longer owns the key
    ├── IdempotencyResultMissing     no memoised result for a key
    ├── FencedOutError               a token older than the newest one seen
    ├── CanonicalizeError (ValueError)  payload has no canonical JSON form
    ├── ConfigError (ValueError)     bad URL, bad worker settings, bad arguments
    │   └── CrossSlotWrite           a job's fenced write outside its queue's slot (a cluster)
    ├── PayloadError (ValueError)    an envelope that cannot be encoded or decoded
    ├── EncodeError (TypeError)      a value the RESP encoder cannot frame
    ├── StoreError                   Redis failed, timed out or went away mid-call
    │   └── DurabilityError          accepted by the master, not confirmed by enough replicas
    ├── OutboxUnavailable            the outbox's SQL database failed (the relay backs off, retries)
    ├── Interrupted                  checkpoint() while the process stops: back to the queue, no attempt
    ├── NoCurrentJob (RuntimeError)  current_job() outside a running job
    ├── JobNotFound (LookupError)    no record of that jid: never kept, or forgotten
    ├── JobFailed                    Client.result() of a task that failed (.error)
    ├── JobCancelled                 Client.result() of a task cancelled before it finished
    │   └── JobExpired               ... or dropped unrun past its expires time
    └── DrainTimeout                 a burst run or drain() ran out of time with tasks left (.left)

Redis errors become ours at one boundary (``fencekit._redis.run``:
``translate_error`` for redis-py's exceptions, ``translate_reply`` for an
error reply's text); Lua scripts report refusals with readable error
prefixes (``FENCED``, ``NOTOWNED`` …) that :data:`SCRIPT_ERRORS` maps to the
classes above, the way redis-py maps reply prefixes to its own exceptions.

One exception stands outside the tree on purpose: a primitive given an
argument of the wrong *type* (a TTL that is not a ``timedelta``, a client
that is not a redis-py client, a token that is not a ``FenceToken``) raises
a plain ``TypeError``, as Python's own functions do. A value of the right
type that is wrong is a :class:`ConfigError`, which is also a ``ValueError``.
"""

from __future__ import annotations

__all__ = [
    "SCRIPT_ERRORS",
    "CanonicalizeError",
    "ConfigError",
    "CrossSlotWrite",
    "DrainTimeout",
    "DurabilityError",
    "EncodeError",
    "FenceKitError",
    "FencedOutError",
    "IdempotencyNotOwned",
    "IdempotencyResultMissing",
    "Interrupted",
    "JobCancelled",
    "JobExpired",
    "JobFailed",
    "JobNotFound",
    "LockNotAcquired",
    "LockNotOwned",
    "NoCurrentJob",
    "OutboxUnavailable",
    "PayloadError",
    "StoreError",
    "script_error",
]


class FenceKitError(Exception):
    """Base class of every error fencekit raises."""


class LockNotAcquired(FenceKitError):
    """The lock is held by another owner, or a blocking wait ran out."""


class LockNotOwned(FenceKitError):
    """Release or extend by a holder that no longer owns the lease.

    The lease expired, or another owner holds it now; nothing was changed.
    """


class IdempotencyNotOwned(FenceKitError):
    """``mark_done`` by a worker that did not begin the key (or lost it)."""


class IdempotencyResultMissing(FenceKitError):
    """No memoised result: the key is absent, pending, done without a result, or expired."""


class FencedOutError(FenceKitError):
    """A write presented a fencing token older than the newest one recorded.

    The write did not happen. A stale holder (paused, partitioned, reaped)
    gets this instead of overwriting the work of a newer holder.
    """


class CanonicalizeError(FenceKitError, ValueError):
    """The payload has no canonical JSON form (NaN, bytes, sets, objects…)."""


class ConfigError(FenceKitError, ValueError):
    """A setting is wrong: a URL, a worker attribute, a pool flag."""


class CrossSlotWrite(ConfigError):
    """A job's fenced write names a key outside its queue's hash tag, on a Redis Cluster.

    The write runs in one script with the delivery's in-flight entry and the
    job's fence, so on a cluster its key must share the queue's slot
    (``{<queue>}:...``; on one Redis any key works). It could never pass, so it
    is refused before it is sent and the task fails at once, without retries.
    """


class PayloadError(FenceKitError, ValueError):
    """A task envelope cannot be encoded, or a stored one cannot be decoded."""


class EncodeError(FenceKitError, TypeError):
    """The RESP encoder was given a value it cannot frame (only bytes, str, int, float)."""


class StoreError(FenceKitError):
    """Redis failed, timed out or disconnected during a call.

    The command is never re-sent: a lost reply does not mean the command did
    not run, so the caller decides what to do. ``__cause__`` holds the
    original redis-py (or socket) exception.
    """


class DurabilityError(StoreError):
    """The master accepted the write, but fewer replicas than asked confirmed it in time.

    The write is not lost yet: it is on the master, and replication goes on.
    It may be lost if the master fails before a replica has it. Re-sending
    could duplicate it; ``confirmed`` tells how many replicas had it.
    """

    def __init__(self, message: str, confirmed: int = 0) -> None:
        super().__init__(message)
        self.confirmed = confirmed


class OutboxUnavailable(FenceKitError):
    """The outbox's SQL database failed or cannot be reached: the relay backs off and retries
    (its rows stay in the table; a batch whose delete failed is pushed again, deduped)."""

    transient = True  # logged as a WARNING: not the process's Redis outage


class Interrupted(FenceKitError):
    """Raised by ``checkpoint()`` (and an ``iterate`` step) while the process stops: the state is
    stored, and the task goes back to its queue without counting an attempt, to resume from it.
    Let it propagate: a job that swallows it keeps the stop waiting (and is logged)."""


class NoCurrentJob(FenceKitError, RuntimeError):
    """``current_job()`` was called outside a running job's ``perform``."""


class JobNotFound(FenceKitError, LookupError):
    """No record of the task: it keeps none (``keep_result=0``), or it was forgotten."""


class JobFailed(FenceKitError):
    """The task failed for good; :attr:`error` is its last error (type, message, traceback)."""

    def __init__(self, message: str, error: object = None) -> None:
        super().__init__(message)
        self.error = error


class JobCancelled(FenceKitError):
    """The task was cancelled before it finished."""


class JobExpired(JobCancelled):
    """The task was dropped unrun: its ``expires`` time had passed when it was claimed."""


class DrainTimeout(FenceKitError):
    """Burst mode (``Server(burst=True)``, ``fencekit.testing.drain``) ran out of time with tasks left.

    ``left`` says what each non-empty queue still held (pending, scheduled,
    in flight, when the next scheduled task is due); the tasks stay in Redis.
    """

    def __init__(self, message: str, left: str = "") -> None:
        super().__init__(message)
        self.left = left


#: Error-reply prefixes used by fencekit's Lua scripts, mapped to exceptions.
SCRIPT_ERRORS: dict[str, type[FenceKitError]] = {
    "FENCED": FencedOutError,
    "NOTOWNED": LockNotOwned,
    "IDEMNOTOWNED": IdempotencyNotOwned,
    # a batch's bookkeeping (docs/design/batches.md): the caller's id or call was wrong
    "BATCHEXISTS": ConfigError,
    "BATCHARMED": ConfigError,
    "NOBATCH": ConfigError,
    "BADNOTE": PayloadError,
}


def script_error(message: str) -> FenceKitError | None:
    """Map a Lua error reply to our exception, or ``None`` if it is not ours."""
    head, _, rest = message.partition(" ")
    cls = SCRIPT_ERRORS.get(head)
    return cls(rest or message) if cls is not None else None
