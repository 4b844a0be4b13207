"""fencekit: Redis-backed background jobs where every delivery carries a fencing token.

Primitives (sync and asyncio): :func:`idempotency_key`, :class:`IdempotencyGuard`,
:class:`DistributedLock` with fencing tokens, :class:`FenceGate`.
The job queue: :class:`Client` (:class:`SyncClient` for synchronous code),
:class:`Task`, :class:`Server`, :class:`Queue` (:class:`SyncQueue`), :func:`current_job`;
task functions: ``@app.task`` (:class:`TaskFunction`);
the multiprocess pool: :class:`Pool` and :class:`App`.
Settings: :mod:`fencekit.settings`. Errors: :mod:`fencekit.errors` (every
exception fencekit raises is a :class:`FenceKitError`, apart from the plain
``TypeError`` of a primitive given the wrong kind of argument). The map of the
package is ``docs/design.md``.
"""

from typing import TYPE_CHECKING, Any

from fencekit import _compat
from fencekit._redis.clients import connect, connect_async
from fencekit.consume.job import Job, current_job
from fencekit.errors import (
    CanonicalizeError,
    ConfigError,
    CrossSlotWrite,
    DrainTimeout,
    DurabilityError,
    EncodeError,
    FencedOutError,
    FenceKitError,
    IdempotencyNotOwned,
    IdempotencyResultMissing,
    Interrupted,
    JobCancelled,
    JobExpired,
    JobFailed,
    JobNotFound,
    LockNotAcquired,
    LockNotOwned,
    NoCurrentJob,
    OutboxUnavailable,
    PayloadError,
    StoreError,
)
from fencekit.hooks import FenceKitHooks, JobEvent
from fencekit.integrations.django import SupportsFencedUpdate, fenced_update
from fencekit.jobs.functions import AsyncTaskFunction, SyncTaskFunction, TaskCall, TaskFunction
from fencekit.jobs.history import History, HistoryBucket
from fencekit.jobs.records import JobError, JobInfo, JobStatus, Progress
from fencekit.jobs.task import Task
from fencekit.jobs.worker import Performable, RetryPolicy, Worker, WorkerOptions
from fencekit.primitives.canonical import canonicalize, dumps_json, idempotency_key, loads_json
from fencekit.primitives.fence import AsyncFenceGate, FenceGate
from fencekit.primitives.idempotency import AsyncIdempotencyGuard, IdempotencyGuard
from fencekit.primitives.lock import AsyncDistributedLock, DistributedLock
from fencekit.primitives.tokens import BeginOutcome, FenceToken, LockHandle
from fencekit.produce._enqueue import Enqueued
from fencekit.produce.batch import Batch, BatchInfo, Chain, SyncBatch
from fencekit.produce.client import Client
from fencekit.produce.handle import DeadLetter, Queue, QueueStats, ScheduledTask
from fencekit.produce.schedules import ScheduleInfo
from fencekit.produce.sync_client import SyncClient
from fencekit.produce.sync_handle import SyncQueue
from fencekit.runtime.app import App
from fencekit.runtime.server import Server
from fencekit.settings import ClientOptions, PoolOptions, ServerOptions

if TYPE_CHECKING:
    from fencekit.pool import Pool

_compat.install()

__version__ = "0.2.0.dev0"


__all__ = [  # noqa: RUF022 - grouped by topic
    # primitives
    "AsyncDistributedLock",
    "AsyncFenceGate",
    "AsyncIdempotencyGuard",
    "BeginOutcome",
    "DistributedLock",
    "FenceGate",
    "FenceToken",
    "IdempotencyGuard",
    "LockHandle",
    "canonicalize",
    "connect",
    "connect_async",
    "dumps_json",
    "idempotency_key",
    "loads_json",
    # the job queue
    "App",
    "Batch",
    "BatchInfo",
    "Chain",
    "Client",
    "DeadLetter",
    "Enqueued",
    "History",
    "HistoryBucket",
    "Job",
    "JobError",
    "JobInfo",
    "JobStatus",
    "Performable",
    "Pool",
    "Progress",
    "Queue",
    "QueueStats",
    "RetryPolicy",
    "ScheduledTask",
    "ScheduleInfo",
    "Server",
    "SyncBatch",
    "SyncClient",
    "SyncQueue",
    "Task",
    "Worker",
    "current_job",
    # task functions (@app.task)
    "AsyncTaskFunction",
    "SyncTaskFunction",
    "TaskCall",
    "TaskFunction",
    "WorkerOptions",
    # fencing your database (Django; fencekit.sql for SQLAlchemy)
    "SupportsFencedUpdate",
    "fenced_update",
    # observability
    "FenceKitHooks",
    "JobEvent",
    # settings
    "ClientOptions",
    "PoolOptions",
    "ServerOptions",
    # errors
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
    "__version__",
]


def __getattr__(name: str) -> Any:
    """``fencekit.Pool`` loads the pool (and its CLI, argparse) on first use, not at ``import fencekit``."""
    if name == "Pool":
        from fencekit.pool import Pool

        globals()["Pool"] = Pool
        return Pool
    raise AttributeError(f"module 'fencekit' has no attribute {name!r}")
