"""The running job: ``current_job()`` inside ``perform`` returns its delivery.

A delivery is one claim of a task (``jid``, ``queue``, ``operation``, ``attempt``) with the fencing
``token`` it was issued, of resource ``{queue}:job:<jid>``; a newer delivery holds a larger one.
``await job.set_if_fresh(key, value)`` SETs ``key`` only while this delivery is the task's current
one -- in its consumer's in-flight hash, not older than the job's fence (raised as a delivery is
reaped or returned) -- else raises :class:`~fencekit.errors.FencedOutError` and changes nothing
(``job_set.lua``; no key of its own is left behind); ``job.set_on_ack(key, value)`` stages the
same write to land with the ack (``ack_claim.lua``). A sync task (a plain ``def``, run in a thread:
:mod:`fencekit.consume._threads`) uses the ``*_sync`` forms: they run the same coroutine on the
job's event loop and wait for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import orjson

from fencekit._redis import scripts
from fencekit._redis.cluster.routing import slot_of
from fencekit._redis.keys import QueueKeys, job_resource
from fencekit._redis.run import translate_reply
from fencekit._redis.scripts import Call
from fencekit.consume._iterate import walk, walk_sync
from fencekit.errors import CrossSlotWrite, FencedOutError, Interrupted, NoCurrentJob, PayloadError
from fencekit.jobs.codec import check_params
from fencekit.jobs.records import encode_progress
from fencekit.primitives.fence import FenceRules, FenceValue
from fencekit.primitives.tokens import FenceToken
from fencekit.produce._batching import Coalescer

if TYPE_CHECKING:
    from fencekit.jobs.task import Task
    from fencekit.produce.client import Client

_current: ContextVar[Job] = ContextVar("fencekit_current_job")
_loop: ContextVar[asyncio.AbstractEventLoop] = ContextVar("fencekit_job_loop")


_T = TypeVar("_T")

STATE_TTL_MS = 30 * 86_400_000
"""A checkpointed state lives this long after its latest checkpoint if its task never ends
(it is dropped or given its record's retention as the task ends: lua/_ckpt.lua)."""

Write = tuple[str, str, str, int, "str | bytes | int | float"]  # inflight, fence, target, token, value
MAX_STAGED = 1000  # how many set_on_ack writes one delivery may stage (they ride one script call)


def fenced_writes(run: Callable[[Call], Awaitable[Any]]) -> Coalescer[Write, None]:
    """The fenced writes of one consumer's jobs of one queue: made while one is in flight, they go together.

    One write alone is ``job_set.lua``; a batch is one ``job_set_many.lua``
    call, whose reply holds each write's own 1 or ``FENCED`` error.
    """

    async def send(writes: list[Write]) -> list[BaseException | None]:
        if len(writes) == 1:
            inflight, fence, target, token, value = writes[0]
            try:
                await run(
                    scripts.job_set(inflight=inflight, fence=fence, target=target, token=token, value=value)
                )
            except FencedOutError as exc:
                return [exc]
            return [None]
        replies = await run(scripts.job_set_many(writes))
        return [translate_reply(str(r)) if isinstance(r, BaseException) else None for r in replies]

    return Coalescer(send, "fencekit-fenced-writes")


class JobSite(NamedTuple):
    """What every job of one consumer on one queue shares (built once per queue, not per task)."""

    queue: str
    inflight: str  # the consumer's in-flight hash: where a write checks the delivery is current
    rules: FenceRules
    run: Callable[[Call], Awaitable[Any]]
    client: Client
    keys: QueueKeys  # the queue's keys: where a job's record is
    writes: Coalescer[Write, None]  # the consumer's fenced writes (fenced_writes)
    slot: int | None = None  # on a Redis Cluster: the queue's hash slot (a write's key must share it)
    stopping: Callable[[], bool] = lambda: False  # its consumer is stopping (a checkpoint interrupts)


class Job:
    """The delivery being performed (see the module docstring); its attributes are read-only.

    Built for every task claimed, so it is a slots class whose per-queue parts
    live in one shared :class:`JobSite` and whose :attr:`token` is made when
    first read.
    """

    __slots__ = (
        "_attempt",
        "_batch",
        "_checkpointed",
        "_delivery",
        "_interrupted",
        "_jid",
        "_operation",
        "_pace",
        "_params",
        "_parents",
        "_refused",
        "_site",
        "_staged",
        "_state",
        "_token",
    )

    def __init__(
        self,
        jid: str,
        operation: str,
        attempt: int,
        params: dict[str, Any],
        delivery: int,
        site: JobSite,
        batch: str | None = None,
        parents: dict[str, Any] | None = None,
        state: Any = None,
        pace: tuple[int, float] = (100, 5.0),
    ) -> None:
        self._jid = jid
        self._operation = operation
        self._attempt = attempt
        self._params = params
        self._delivery = delivery
        self._site = site
        self._token: FenceToken | None = None
        self._refused: str | None = None
        self._batch = batch
        self._parents = parents
        self._state = state
        self._checkpointed = False
        self._interrupted = False
        self._pace = pace
        self._staged: list[scripts.StagedWrite] | None = None  # set_on_ack's writes

    @property
    def jid(self) -> str:
        return self._jid

    @property
    def queue(self) -> str:
        return self._site.queue

    @property
    def operation(self) -> str:
        return self._operation

    @property
    def attempt(self) -> int:
        """0 for the first run, 1 for the first retry, ..."""
        return self._attempt

    @property
    def params(self) -> dict[str, Any]:
        return self._params

    @property
    def batch_id(self) -> str | None:
        """The id of the batch this task is a child or a callback of (``client.batch``), else None."""
        return self._batch

    @property
    def parent_results(self) -> dict[str, Any]:
        """The results of the tasks this one depended on (``Task(depends_on=...)``), by jid;
        empty for a task without parents. A parent that failed (``on_parent_failure="run"``)
        or kept no result is absent."""
        return self._parents or {}

    @property
    def state(self) -> Any:
        """The state this task's latest :meth:`checkpoint` stored (by this delivery or an earlier
        one), None before its first checkpoint: a long job resumes from it."""
        return self._state

    @property
    def checkpointed(self) -> bool:
        """True once this delivery stored a checkpoint, or it resumed from one."""
        return self._checkpointed or self._state is not None

    @property
    def stopping(self) -> bool:
        """True once its process is stopping: its next checkpoint raises ``Interrupted``."""
        return self._site.stopping()

    async def checkpoint(self, state: Any) -> None:
        """Store ``state`` (plain JSON) for this task while this delivery is its current one.

        The task's next delivery -- after a crash, a retry or a drain -- reads it as
        :attr:`state`. A delivery that is no longer current (reaped after a pause,
        returned, finished, timed out) is refused in Redis and counted ``fenced_out``:
        this raises :class:`~fencekit.errors.FencedOutError`, so a stale run stops and
        never overwrites a newer checkpoint. ``state`` is bounded by ``max_payload``
        (:class:`~fencekit.errors.PayloadError` above it). One script call
        (``checkpoint.lua``), one round trip. While the process stops, the state is
        stored and then :class:`~fencekit.errors.Interrupted` is raised: let it propagate,
        the task goes back to its queue without counting an attempt, to resume from it.
        """
        await self._store(state, None)

    async def _store(self, state: Any, progress: tuple[float, str] | None) -> None:
        self._check_current()
        site = self._site
        check_params(state, "state")
        value = orjson.dumps(state)
        limit = site.client.max_payload
        if len(value) > limit:
            raise PayloadError(
                f"checkpoint of task {self._jid} is {len(value)} bytes, above max_payload={limit}"
            )
        _, fence, target, _ = site.rules.write(self.token, site.keys.state(self._jid), 0)
        call = scripts.checkpoint(
            inflight=site.inflight,
            fence=fence,
            state=target,
            stats=site.keys.stats,
            token=self._delivery,
            value=value,
            ttl_ms=STATE_TTL_MS,
            record=site.keys.job(self._jid) if progress is not None else None,
            progress=encode_progress(*progress) if progress is not None else b"",
        )
        try:
            await site.run(call)
        except FencedOutError:
            self.fence_locally("was fenced out by Redis (reaped, returned or superseded)")
            raise
        self._state = state
        self._checkpointed = True
        if site.stopping():
            self._interrupted = True
            raise Interrupted(f"task {self._jid}: its process is stopping; it resumes from this checkpoint")

    def checkpoint_sync(self, state: Any) -> None:
        """:meth:`checkpoint` from a sync task's thread: blocks until Redis answered."""
        _blocking(self.checkpoint(state))

    def _store_sync(self, state: Any, progress: tuple[float, str] | None) -> None:
        _blocking(self._store(state, progress))

    def iterate(
        self,
        source: Sequence[Any] | Callable[[Any], Any],
        *,
        cursor: Any = None,
        every: int | None = None,
        seconds: float | None = None,
    ) -> AsyncIterator[Any]:
        """``async for item in current_job().iterate(source)``: walk ``source`` -- a sequence, or
        ``fetch(cursor) -> (items, next_cursor)`` (async or not; ``next_cursor`` None ends it) --
        from where the task's last checkpoint left it, checkpointing every ``every`` items or
        ``seconds`` seconds (default: the worker's ``checkpoint_every``, ``checkpoint_seconds``).
        ``cursor``: where a first delivery starts. Progress (done of total) is reported with each
        checkpoint of a sequence. See :mod:`fencekit.consume._iterate`."""
        n, s = self._pace
        return walk(self, source, cursor, every or n, seconds or s)

    def iterate_sync(
        self,
        source: Sequence[Any] | Callable[[Any], Any],
        *,
        cursor: Any = None,
        every: int | None = None,
        seconds: float | None = None,
    ) -> Iterator[Any]:
        """:meth:`iterate` for a sync task (a plain ``def``): ``for item in job.iterate_sync(source)``."""
        n, s = self._pace
        return walk_sync(self, source, cursor, every or n, seconds or s)

    @property
    def token(self) -> FenceToken:
        """This delivery's fencing token, of resource ``{queue}:job:<jid>``."""
        if self._token is None:
            self._token = FenceToken(self._delivery, job_resource(self._site.queue, self._jid))
        return self._token

    def __repr__(self) -> str:
        return (
            f"Job(jid={self._jid!r}, queue={self.queue!r}, operation={self._operation!r}, "
            f"attempt={self._attempt})"
        )

    def fence_locally(self, why: str) -> None:
        """This delivery stopped being current (it timed out, was cancelled): from now on its
        writes are refused here, before Redis refuses them too."""
        self._refused = why

    def time_out(self, seconds: float) -> None:
        self.fence_locally(f"timed out after {seconds:g}s")

    async def set_if_fresh(self, key: str, value: str | bytes | int | float) -> None:
        """``SET key value`` while this delivery is the task's current one (one atomic script).

        It goes over the consumer's hot-path connection (writes of several jobs made while one is
        in flight share one script call), and raises :class:`~fencekit.errors.FencedOutError` once
        the delivery was reaped, returned, finished or timed out, or a newer one exists. On a Redis
        Cluster ``key`` must share the queue's hash tag (``{<queue>}:...``): another is
        :class:`~fencekit.errors.CrossSlotWrite` at once, and the task fails without retries."""
        fence, target, value = self._write(key, value)
        try:
            await self._site.writes.submit((self._site.inflight, fence, target, self._delivery, value))
        except FencedOutError:
            self.fence_locally("was fenced out by Redis (reaped, returned or superseded)")
            raise

    def set_on_ack(self, key: str, value: str | bytes | int | float) -> None:
        """Stage ``SET key value`` to land with this delivery's ack, in the same script.

        Nothing is sent now: the write lands only if the job returns and its ack is accepted (the
        delivery still current: in flight, not older than the job's fence), atomically with it; a
        run that raises, times out, is cancelled, reaped or returned writes nothing, and a crash
        before the ack leaves nothing half-written. :meth:`set_if_fresh`'s checks (a stale
        delivery, a key off the queue's hash tag) raise at once. No round trip of its own: for
        output the job need not read back. At most :data:`MAX_STAGED` per delivery."""
        fence, target, value = self._write(key, value)
        if self._staged is None:
            self._staged = []
        elif len(self._staged) >= MAX_STAGED:
            raise ValueError(f"at most {MAX_STAGED} writes ride one ack; await set_if_fresh() for more")
        self._staged.append(scripts.StagedWrite(self._delivery, fence, target, value))

    def _write(self, key: str, value: object) -> tuple[str, str, FenceValue]:
        # a fenced write's fence key, target and value, checked before Redis sees it (no FenceToken made)
        self._check_current()
        site = self._site
        fence, target, checked = site.rules.target(job_resource(site.queue, self._jid), key, value)
        if site.slot is not None and slot_of(target) != site.slot:
            raise CrossSlotWrite(
                f"key {target!r} is outside queue {site.queue!r}'s hash tag: on a Redis Cluster a job's "
                f"fenced write must share it, e.g. '{{{site.queue}}}:{target}' (not sent; not retried)"
            )
        return fence, target, checked

    @property
    def fenced_out(self) -> str | None:
        """Why this delivery's writes are refused (None: they are not)."""
        return self._refused

    async def progress(self, fraction: float, message: str = "") -> bool:
        """Report how far the job is (``fraction`` from 0 to 1), shown by ``client.job(jid)``.

        Written into the task's record only while this delivery is current
        (:class:`~fencekit.errors.FencedOutError` otherwise); returns False when
        the task keeps no record (``keep_result=0``).
        """
        self._check_current()
        site = self._site
        call = scripts.job_progress(
            inflight=site.inflight,
            record=site.keys.job(self._jid),
            token=self._delivery,
            progress=encode_progress(fraction, message),
        )
        return bool(await site.run(call))

    def set_if_fresh_sync(self, key: str, value: str | bytes | int | float) -> None:
        """:meth:`set_if_fresh` from a sync task's thread: blocks until Redis answered."""
        _blocking(self.set_if_fresh(key, value))

    def progress_sync(self, fraction: float, message: str = "") -> bool:
        """:meth:`progress` from a sync task's thread: blocks until Redis answered."""
        return _blocking(self.progress(fraction, message))

    def _check_current(self) -> None:
        if self._refused is not None:
            raise FencedOutError(
                f"delivery {self._delivery} of task {self._jid} {self._refused}; its writes are refused"
            )

    async def enqueue(
        self, task: Task, *, delay: float | timedelta | None = None, at: datetime | None = None
    ) -> str:
        """Enqueue a follow-up task on this consumer's connection; returns its jid."""
        return await self._site.client.enqueue(task, delay=delay, at=at)


def current_job() -> Job:
    """The delivery whose ``perform`` is running in this context.

    Raises :class:`~fencekit.errors.NoCurrentJob` outside a job.
    """
    try:
        return _current.get()
    except LookupError:
        raise NoCurrentJob(
            "current_job() was called outside a running job; call it inside a worker's perform()"
        ) from None


def bind_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Record the job's event loop in its context (a sync run's thread hops back to it)."""
    _loop.set(loop)


def _blocking(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coroutine`` on the job's loop from a sync task's thread and wait for its outcome."""
    loop = _loop.get(None)
    if loop is None or asyncio._get_running_loop() is loop:
        coroutine.close()
        raise RuntimeError(
            "the *_sync forms of a job's writes are for sync tasks (a plain def, run in a thread); "
            "in async code await set_if_fresh()/progress()"
        )
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result()


def set_current(job: Job) -> None:
    """Bind ``job`` to the running context (the consumer runs each task in its own)."""
    _current.set(job)
