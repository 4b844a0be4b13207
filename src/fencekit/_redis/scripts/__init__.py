"""The Lua scripts, loaded from ``lua/*.lua``, and one typed builder per script.

Each ``.lua`` file is one atomic state transition and opens with a header that
lists its KEYS, ARGV and replies. Python never spells KEYS/ARGV positions
anywhere else: every script has one builder, taking keys then arguments as named
parameters and returning a :class:`Call`. Runners (:func:`fencekit._redis.run.run`,
:func:`fencekit._redis.run.arun`, the lean connection) execute a ``Call`` by SHA
and load the script on ``NOSCRIPT``.

The package is split by job; callers import this package only
(``from fencekit._redis import scripts``, then ``scripts.ack_claim(...)``):

- ``_load``: the loader (``Script``, ``Call``, ``call``, ``--!include``, ``SCRIPTS``);
- ``primitives``: locks, fences, idempotency keys, the 0.1-0.6 key upgrade;
- ``queue``: one job's path -- enqueue, claim, settle, a running job's writes;
- ``admin``: the operator's and reader's scripts (records, cancel, bulk, burst probe);
- ``loops``: the maintenance loops (heartbeat, reaper, scheduler, history, ticker);
- ``batches``: a batch's bookkeeping, in the batch's own slot;
- ``deps``: tasks held for their parents (``Task(depends_on=...)``), in their queue's slot.
"""

from __future__ import annotations

from fencekit._redis.scripts._load import SCRIPTS, Arg, Call, Script, call, load, script_names
from fencekit._redis.scripts.admin import (
    backlog,
    cancel,
    dead_drop,
    dead_purge,
    dead_revive,
    dead_revive_many,
    drain_probe,
    failed_retry,
    failed_retry_many,
    job_info,
    pending_read,
    purge,
    record_drop,
    run_now,
)
from fencekit._redis.scripts.batches import batch_add, batch_arm, batch_done, batch_note, batch_open
from fencekit._redis.scripts.deps import dep_cancel, dep_release, dep_wait
from fencekit._redis.scripts.loops import (
    expired,
    forget,
    heartbeat,
    history_sample,
    outbox_forget,
    outbox_push,
    periodic_enqueue,
    schedule,
)
from fencekit._redis.scripts.primitives import (
    fence_advance,
    fence_check,
    fence_set,
    idem_begin,
    idem_done,
    idem_reclaim,
    lock_acquire,
    lock_extend,
    lock_release,
    upgrade_move,
)
from fencekit._redis.scripts.queue import (
    JobRecordKeys,
    RecordedAck,
    StagedWrite,
    ack_claim,
    checkpoint,
    drop,
    enqueue,
    enqueue_debounce,
    enqueue_tracked,
    enqueue_unique,
    fail,
    has_work,
    job_progress,
    job_set,
    job_set_many,
    requeue,
    retry,
)

__all__ = [
    "SCRIPTS",
    "Arg",
    "Call",
    "JobRecordKeys",
    "RecordedAck",
    "Script",
    "StagedWrite",
    "ack_claim",
    "backlog",
    "batch_add",
    "batch_arm",
    "batch_done",
    "batch_note",
    "batch_open",
    "call",
    "cancel",
    "checkpoint",
    "dead_drop",
    "dead_purge",
    "dead_revive",
    "dead_revive_many",
    "dep_cancel",
    "dep_release",
    "dep_wait",
    "drain_probe",
    "drop",
    "enqueue",
    "enqueue_debounce",
    "enqueue_tracked",
    "enqueue_unique",
    "expired",
    "fail",
    "failed_retry",
    "failed_retry_many",
    "fence_advance",
    "fence_check",
    "fence_set",
    "forget",
    "has_work",
    "heartbeat",
    "history_sample",
    "idem_begin",
    "idem_done",
    "idem_reclaim",
    "job_info",
    "job_progress",
    "job_set",
    "job_set_many",
    "load",
    "lock_acquire",
    "lock_extend",
    "lock_release",
    "outbox_forget",
    "outbox_push",
    "pending_read",
    "periodic_enqueue",
    "purge",
    "record_drop",
    "requeue",
    "retry",
    "run_now",
    "schedule",
    "script_names",
    "upgrade_move",
]
