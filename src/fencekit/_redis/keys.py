"""Every Redis key fencekit uses is built here, and nowhere else.

All keys begin with ``{prefix}:`` (default ``fencekit``). The keys that one Lua
script touches share one Redis Cluster hash tag, so every script runs on
Cluster too (invariant I5 of ``docs/design.md``). The schema, with ``P`` the prefix::

    primitives (tag = the resource or key name, or the tag it already carries)
    P:lock:{R}                 STRING owner id, PX lease         DistributedLock
    P:lock:{R}:seq             STRING last fencing token issued  DistributedLock
    P:fence:{R}                STRING highest token accepted     FenceGate
    P:idem:{K}                 STRING "pending:<owner>" | "done" IdempotencyGuard
    P:idem:{K}:result          STRING JSON memo                  IdempotencyGuard

    one queue Q (tag = the queue name)
    P:{Q}:pending              LIST   envelopes; LPUSH in, RPOP out (FIFO) -- of priority 0
    P:{Q}:pending:<p>          LIST   the same for tasks of priority p != 0 (-5..5, docs/guides/flow.md)
    P:{Q}:pending:prio         ZSET   p -> p of each priority list that may be non-empty, and
                                      "f<p>" -> p of each priority with a fair-share ring
                                      (a marker: claims look past the plain list only when
                                      it exists; built from the pending key in lua/_prio.lua)
    P:{Q}:fair:<p>:<key>       LIST   the waiting tasks of fair key <key> at priority p
    P:{Q}:fairring:<p>         LIST   the fair keys of priority p with work, in turn order
                                      (RPOP the next, LPUSH it back), and "" for the keyless
    P:{Q}:fairturn:<p>         HASH   key -> turns taken in a row (a key with fair_weights)
    P:{Q}:fairlen              STRING how many tasks wait on the fair keys' lists (readers)
    P:{Q}:rate:<operation>     HASH   token bucket of a rate-limited worker: t (tokens),
                                      at (Redis TIME, us, of the last refill); expires once
                                      it would be full again (lua/_flow.lua)
    P:{Q}:slots:<key>          SET    delivery tokens holding a slot of concurrency key <key>
                                      (max_concurrency of the worker; lua/_slots.lua)
    P:{Q}:parked:<key>         LIST   tasks of <key> claimed while its slots were full; one
                                      goes back to the head of pending per slot given back
    P:{Q}:parkedkeys           SET    the keys with parked tasks (readers count them as pending)
    P:{Q}:debounce:<key>       HASH   jid, env, first: the debounced task waiting for <key>
                                      (lua/enqueue_debounce.lua)
    P:{Q}:rparked:<operation>  LIST   tasks of a rate-limited operation claimed without a token
                                      (and those behind them); the claim takes them back first.
                                      A key of a per-key rate limit has its own, named (as its
                                      bucket P:{Q}:rate:...) <operation>, \\x1f, <key>
    P:{Q}:rparkedops           ZSET   operations with tasks parked for a token, scored by the ms
                                      their next token is due (readers count them as pending)
    P:{Q}:rparkedspec          HASH   operation -> "rate burst" of its parked tasks' bucket
    P:{Q}:token                STRING last delivery token issued for Q
    P:{Q}:inflight:<consumer>  HASH   token -> envelope, one per consumer incarnation
    P:{Q}:scheduled            ZSET   envelope scored by due time (ms)
    P:{Q}:stats                HASH   enqueued processed failed retried fenced_out dead
    P:{Q}:dead                 HASH   <id> -> raw payload as stored, "<id>:why" -> JSON
                                      {reason, jid, queue, token, consumer, at}
    P:{Q}:dead:index           ZSET   dead-letter id scored by time (ms)
    P:{Q}:wake                 LIST   at most one marker: "work may be waiting"
    P:{Q}:job:<jid>            HASH   the task's record (only with keep_result > 0, or once it
                                      failed): env (the envelope's first 64 bytes; env1,
                                      env2, ... the rest, so Redis keeps a small record a
                                      listpack: lua/_env.lua), state, enqueued, due, token,
                                      result, error, finished, progress, keep, by (the
                                      consumer that completed it), runs (one line a run that
                                      ended otherwise: token, end, outcome, consumer), uk (the
                                      <key> of the unique key it holds, lua/_record.lua)
    P:{Q}:unique:<key>         STRING jid of the task holding Task(unique_key=<key>); lives
                                      while that task's record does (or unique_for)
    P:{Q}:finished             LIST   record keys of finished tasks, newest first: the
                                      newest keep_finished are kept
    P:{Q}:failed               LIST   record keys of failed tasks, newest first: the
                                      newest keep_failed are kept
    P:{Q}:done                 (sharded pub/sub channel) the jid of each recorded task
                                      that finished, for Client.result()
    P:{Q}:cancel               (sharded pub/sub channel) "<jid> <token>" of a running
                                      delivery cancelled, for its consumer
    P:{Q}:cancelled            ZSET   the same messages scored by token, the newest 1,000 for
                                      an hour: read by a consumer that subscribed again
    P:{Q}:history:last         HASH   the counters the previous history sample saw, and
                                      the newest bucket of each tier (m, h)
    P:{Q}:history:m            HASH   minute number -> the minute's history (jobs/history.py):
                                      counts, depth, durations; the newest 2,880 minutes
    P:{Q}:history:h            HASH   hour number -> the same per hour; the newest 2,160 hours
    P:{Q}:schedules            HASH   operation -> JSON definition of its schedule (cron or
                                      every, tz, catch-up, params), written by each process
                                      that runs it (services/_ticker.py), read by schedules()
    P:{Q}:cron:<operation>     STRING the newest tick (Unix ms) enqueued for that schedule by
                                      any host: periodic_enqueue.lua enqueues only newer ticks
    P:fence:{Q}:job:<jid>      STRING highest token of the task's deliveries whose writes
                                      stand (raised past a reaped or returned delivery);
                                      the fence of ``current_job().set_if_fresh``

    one batch B (tag = "b:" + the batch id; docs/design/batches.md)
    P:{b:B}:batch              HASH   the batch's bookkeeping: state (open, armed, completing,
                                      done), total, final, succeeded, failed, cancelled,
                                      created, finished (ms), callbacks (JSON envelopes by
                                      kind), parent (the batch that counts this one)
    P:{b:B}:children           HASH   child jid -> "" while it is not final, then its outcome
                                      (s succeeded, f failed for good, c cancelled): a child
                                      is counted once, whichever note about it came first

    registry (tag = "registry")
    P:{registry}:consumers     HASH   consumer id -> JSON {host, pid, queues, started}
    P:{registry}:beats         ZSET   consumer id scored by last heartbeat (ms)
    P:{registry}:queues        SET    every queue name ever used
    P:{registry}:store         STRING random id written by the first heartbeat; its loss
                                      means Redis lost its data

A resource or key name that already contains a hash tag (``"{batch-42}:x"``)
keeps it, so a caller can co-locate, say, an idempotency key and its lock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeGuard

from fencekit.errors import ConfigError

DEFAULT_PREFIX = "fencekit"

_HAS_TAG = re.compile(r"\{[^}]+\}")
_BAD_QUEUE = re.compile(r"[\s{}]")
MAX_QUEUE_NAME = 200


def _tagged(name: str) -> str:
    """``name`` if it already carries a Cluster hash tag, else ``{name}``."""
    first = name.find("{")
    if first != -1 and _HAS_TAG.match(name, first):
        return name
    return "{" + name + "}"


def validate_name(name: object, label: str) -> str:
    """A resource, key or namespace: a non-empty ``str`` with no whitespace."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{label} must be a non-empty str, got {name!r}")
    if name.isprintable() and " " not in name:
        return name  # the usual case, one C-level scan (printable and no space: no whitespace, see is_jid)
    if any(ch.isspace() for ch in name):
        raise ConfigError(f"{label} must not contain whitespace: {name!r}")
    return name


MAX_JID = 200


JID_RULE = f'1 to {MAX_JID} printable characters without whitespace, " or \\'
"""What :func:`is_jid` accepts, as error messages say it."""


def is_jid(value: object) -> TypeGuard[str]:
    """True for a usable jid: 1 to :data:`MAX_JID` printable characters, no whitespace, ``"`` or ``\\``.

    A jid becomes part of a key (the job's fence), a log line and an admin
    page, and the scripts find a task by ``{"jid":"<jid>"`` at the start of its
    envelope: ``"`` and ``\\`` are the two printable characters JSON escapes
    (orjson writes every other one as is), so a jid holding one would be
    written differently from the needle. Anything else is refused at every
    entrance (:func:`jid_error`) and dead-lettered at decode.
    """
    # Every whitespace character but the ASCII space is already not printable (checked over
    # all code points in tests/unit/test_queue_units.py), so these are C-level scans, not a loop.
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_JID
        and value.isprintable()
        and " " not in value
        and '"' not in value
        and "\\" not in value
    )


def jid_error(value: object, field: str = "jid") -> str | None:
    """Why ``value`` is not a usable jid, naming the first bad character (None: it is one)."""
    if is_jid(value):
        return None
    if not isinstance(value, str):
        return f"{field} must be a str ({JID_RULE}), got {type(value).__name__} {value!r}"
    if not 0 < len(value) <= MAX_JID:
        return f"{field} must be {JID_RULE}, got {len(value)} characters"
    bad = next(c for c in value if c in ' "\\' or not c.isprintable())
    return f"{field} must not contain {bad!r} ({JID_RULE}), got {value!r}"


def validate_prefix(prefix: object) -> str:
    """A key prefix: a name without braces (braces would become the hash tag)."""
    prefix = validate_name(prefix, "prefix")
    if "{" in prefix or "}" in prefix:
        raise ConfigError(f"prefix must not contain braces: {prefix!r}")
    return prefix


def validate_queue(name: object) -> str:
    """A queue name: a raw identifier such as ``"emails"`` (no whitespace or braces)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"queue name must be a non-empty str, got {name!r}")
    if _BAD_QUEUE.search(name) or len(name) > MAX_QUEUE_NAME:
        raise ConfigError(
            f"queue name must have at most {MAX_QUEUE_NAME} characters and no whitespace or braces: {name!r}"
        )
    return name


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The keys of one queue; all share the hash tag ``{queue}``."""

    name: str
    pending: str
    token_counter: str
    scheduled: str
    stats: str
    dead: str
    dead_index: str
    wake: str
    finished: str
    failed: str
    done_channel: str
    cancel_channel: str
    cancelled: str
    history_last: str
    history_minutes: str
    history_hours: str
    schedules: str
    _inflight_base: str
    _job_base: str

    def inflight(self, consumer_id: str) -> str:
        """The in-flight hash of one consumer incarnation for this queue."""
        return self._inflight_base + consumer_id

    def debounce(self, key: str) -> str:
        """The key of ``Task(debounce_key=key)``: the jid and envelope of the task waiting for it."""
        return self._job_base[: -len("job:")] + "debounce:" + key

    def unique(self, key: str) -> str:
        """The dedupe key of ``Task(unique_key=key)``: the jid of the task holding it."""
        return self._job_base[: -len("job:")] + "unique:" + key

    def relayed(self, jid: str) -> str:
        """``P:{Q}:relayed:<jid>``: task ``jid`` came from the SQL outbox (the relay pushes it once)."""
        return self._job_base[: -len("job:")] + "relayed:" + jid

    def cron_last(self, operation: str) -> str:
        """The newest tick enqueued for the schedule of ``operation`` (``P:{Q}:cron:<operation>``)."""
        return self._job_base[: -len("job:")] + "cron:" + operation

    def base(self) -> str:
        """``P:{Q}:``: what the claim script builds slot keys from (``slots:<key>``, ``parked:<key>``)."""
        return self._job_base[: -len("job:")]

    def rate_prefix(self) -> str:
        """``P:{Q}:rate:``: the bucket of operation ``op`` is it + ``op`` (built in the claim script)."""
        return self._job_base[: -len("job:")] + "rate:"

    def state(self, jid: str) -> str:
        """``P:{Q}:state:<jid>``: the checkpointed state of task ``jid`` (``current_job().checkpoint``)."""
        return self._job_base[: -len("job:")] + "state:" + jid

    def waiting(self) -> str:
        """``P:{Q}:waiting``: tasks held until their parents are final (``Task(depends_on=...)``)."""
        return self._job_base[: -len("job:")] + "waiting"

    def notes(self) -> str:
        """``P:{Q}:notes``: the batch children's notes the settles of this queue left (batches.md)."""
        return self._job_base[: -len("job:")] + "notes"

    def job(self, jid: str) -> str:
        """The record of task ``jid``: its state, result or error, progress (``P:{Q}:job:<jid>``)."""
        return self._job_base + jid


@dataclass(frozen=True, slots=True)
class BatchKeys:
    """The keys of one batch; both share the hash tag ``{b:<bid>}`` (a slot of its own)."""

    bid: str
    meta: str
    children: str


def job_resource(queue: str, jid: str) -> str:
    """The fence resource of a task: tagged with its queue, so the queue's scripts reach it.

    Every delivery of the task writes through this one fence, so a newer
    delivery's token always wins over an older one's.
    """
    return f"{{{queue}}}:job:{jid}"


class KeySpace:
    """Builds the keys of one prefix (see the module docstring for the schema)."""

    __slots__ = ("_queues", "prefix")

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        self.prefix = validate_prefix(prefix)
        self._queues: dict[str, QueueKeys] = {}

    # primitives -----------------------------------------------------------
    def lock(self, resource: str) -> str:
        return f"{self.prefix}:lock:{_tagged(validate_name(resource, 'resource'))}"

    def lock_seq(self, resource: str) -> str:
        return self.lock(resource) + ":seq"

    def fence(self, resource: str) -> str:
        return f"{self.prefix}:fence:{_tagged(validate_name(resource, 'resource'))}"

    def idempotency(self, key: str) -> str:
        return f"{self.prefix}:idem:{_tagged(validate_name(key, 'idempotency key'))}"

    def idempotency_result(self, key: str) -> str:
        return self.idempotency(key) + ":result"

    def job_fence(self, queue: str, jid: str) -> str:
        """The fence key of task ``jid`` of ``queue`` (``P:fence:{Q}:job:<jid>``)."""
        return self.fence(job_resource(queue, jid))

    # queues ---------------------------------------------------------------
    def queue(self, name: str) -> QueueKeys:
        """The keys of queue ``name`` (cached: built once per queue)."""
        keys = self._queues.get(name)
        if keys is None:
            base = f"{self.prefix}:{{{validate_queue(name)}}}:"
            keys = QueueKeys(
                name=name,
                pending=base + "pending",
                token_counter=base + "token",
                scheduled=base + "scheduled",
                stats=base + "stats",
                dead=base + "dead",
                dead_index=base + "dead:index",
                wake=base + "wake",
                finished=base + "finished",
                failed=base + "failed",
                done_channel=base + "done",
                cancel_channel=base + "cancel",
                cancelled=base + "cancelled",
                history_last=base + "history:last",
                history_minutes=base + "history:m",
                history_hours=base + "history:h",
                schedules=base + "schedules",
                _inflight_base=base + "inflight:",
                _job_base=base + "job:",
            )
            self._queues[name] = keys
        return keys

    # batches --------------------------------------------------------------
    def batch(self, bid: str) -> BatchKeys:
        """The keys of batch ``bid`` (an id of the jid alphabet: ``jid_error`` names what is wrong)."""
        problem = jid_error(bid, "batch id")
        if problem is not None:
            raise ConfigError(problem)
        base = f"{self.prefix}:{{b:{bid}}}:"
        return BatchKeys(bid=bid, meta=base + "batch", children=base + "children")

    @property
    def batches(self) -> str:
        """``P:{batches}:index``: every batch not closed yet (ZSET bid -> created ms), for the
        reconciler, the admin page and ``/metrics``."""
        return f"{self.prefix}:{{batches}}:index"

    # registry -------------------------------------------------------------
    @property
    def consumers(self) -> str:
        return f"{self.prefix}:{{registry}}:consumers"

    @property
    def paused(self) -> str:
        """``P:{registry}:paused``: the names of the queues an operator paused (SET)."""
        return f"{self.prefix}:{{registry}}:paused"

    @property
    def beats(self) -> str:
        return f"{self.prefix}:{{registry}}:beats"

    @property
    def queues(self) -> str:
        return f"{self.prefix}:{{registry}}:queues"

    @property
    def store(self) -> str:
        return f"{self.prefix}:{{registry}}:store"
