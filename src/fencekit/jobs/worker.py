"""Workers: what runs a task, how it is found, and its retry policy.

A worker is a class or an instance with ``queue``, ``operation`` and a
``perform(payload)`` (a classmethod/staticmethod on a class, or a method on an
instance): an ``async def`` runs on the consumer's event loop, a plain
``def`` in its thread pool (:mod:`fencekit.consume._threads`). A task function
(``@app.task``, :mod:`fencekit.jobs.functions`) is a worker too, whose
``perform`` takes the function's own arguments through a
:class:`~fencekit.jobs._binding.Binder`.

The optional attributes are :class:`WorkerOptions`, with their defaults in
:data:`WORKER_DEFAULTS` -- one table, read by :func:`inspect_worker` and
offered as the keyword arguments of ``@app.task`` (so an option added here is
an option of the decorator too): ``retry`` (bool, default True),
``retry_count`` (int >= 0, default 1), ``timeout`` (seconds a run may take,
default None: no limit; ``Task(timeout=...)`` overrides it per task),
``keep_result`` (seconds its tasks' records outlive them, overriding the
producer's; default None) and ``keep_failed`` (bool, default True: a task
that fails for good is kept with its traceback), ``priority`` (-5..5,
default 0: the priority of the tasks a task function's ``build``/``enqueue``
makes; ``Task(priority=...)`` and ``.options(priority=...)`` set it per task,
docs/guides/flow.md), ``rate_limit`` (``"100/s"``, ``"/m"``, ``"/h"``; default
None: the operation's tasks start at most that often across every process
on the Redis, enforced when claiming, docs/guides/flow.md), ``max_concurrency``
(an int >= 1, default None) with ``concurrency_key`` (a function of the
params returning the key, e.g. ``lambda p: p["tenant"]``; a task function's
``build``/``enqueue`` applies it): at most that many tasks of one key run at
once across every process (docs/guides/flow.md), ``fair_key`` and ``rate_key``
(functions of the params: the task's fair-share key and rate key) and ``fair_weights``
(fair key -> turns, docs/guides/flow.md), ``checkpoint_every`` (an int
>= 1, default 100) and ``checkpoint_seconds`` (default 5): how often
``current_job().iterate`` checkpoints its cursor (docs/guides/long-jobs.md), and the periodic options
``cron``/``every``, ``cron_params``, ``cron_tz``, ``cron_catch_up``
(:mod:`fencekit.jobs.periodic`: a schedule whose ticks the ``Server`` or
the pool's supervisor enqueues, each once across every host). Workers are
resolved by their ``(queue, operation)`` pair.

The retry rule lives here once, for failures raised by ``perform`` and for
crashes found by the reaper alike: a task that has failed ``attempt`` times
runs again while ``retry`` is on and ``attempt < retry_count``, after
``1s * 1.5 ** attempt`` (crashes: at once).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from typing_extensions import TypedDict

from fencekit._redis.keys import validate_queue
from fencekit.errors import ConfigError, PayloadError
from fencekit.jobs._binding import Binder
from fencekit.jobs.codec import is_priority, is_timeout
from fencekit.jobs.flow import Debounce, FlowKeys, Rate, debounce_of, flow_keys, parse_rate
from fencekit.jobs.periodic import Schedule, schedule_of

if TYPE_CHECKING:
    from fencekit.consume._threads import SyncRunner

RETRY_BASE_DELAY = 1.0
RETRY_BACKOFF = 1.5


@runtime_checkable
class Performable(Protocol):
    """Anything with ``queue``, ``operation`` and an async ``perform(payload)``."""

    queue: str
    operation: str

    async def perform(self, payload: dict[str, Any]) -> object: ...


#: A worker as registered: a class (classmethod ``perform``) or an instance.
Worker = type | Performable


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``retry``/``retry_count`` of a worker, and the rule that applies them."""

    retry: bool = True
    retry_count: int = 1

    def next_attempt(self, attempt: int) -> int | None:
        """The attempt number of the next run after ``attempt`` failed runs, or None."""
        if self.retry and attempt < self.retry_count:
            return attempt + 1
        return None

    def runs(self) -> int:
        """The most runs a task gets: 1 + ``retry_count`` with retries on, else 1 (for log lines)."""
        return 1 + self.retry_count if self.retry else 1

    def delay(self, attempt: int) -> float:
        """Seconds to wait before re-running a task that failed ``attempt`` times before.

        The seed's fixed ``1s * 1.5 ** attempt``; the consumer computes it once
        per failure and hands it to the retry (:func:`fencekit.consume._settle.retry`).
        """
        return RETRY_BASE_DELAY * RETRY_BACKOFF**attempt


DEFAULT_POLICY = RetryPolicy()


class WorkerOptions(TypedDict, total=False):
    """The optional attributes of a worker, and the options of ``@app.task`` (see the module docstring)."""

    retry: bool
    retry_count: int
    timeout: float | timedelta | None
    keep_result: float | timedelta | None
    keep_failed: bool
    cron: str | None
    every: float | timedelta | None
    cron_params: dict[str, Any] | None
    cron_tz: str
    cron_catch_up: bool
    priority: int
    rate_limit: str | None
    concurrency_key: Callable[[dict[str, Any]], object] | None
    max_concurrency: int | None
    checkpoint_every: int
    checkpoint_seconds: float
    debounce: float | timedelta | None
    debounce_key: Callable[[dict[str, Any]], object] | None
    debounce_max: float | timedelta | None
    fair_key: Callable[[dict[str, Any]], object] | None
    fair_weights: dict[str, int] | None
    rate_key: Callable[[dict[str, Any]], object] | None


WORKER_DEFAULTS: dict[str, Any] = {
    "retry": True,
    "retry_count": 1,
    "timeout": None,
    "keep_result": None,
    "keep_failed": True,
    "cron": None,
    "every": None,
    "cron_params": None,
    "cron_tz": "UTC",
    "cron_catch_up": False,
    "priority": 0,
    "rate_limit": None,
    "concurrency_key": None,
    "max_concurrency": None,
    "checkpoint_every": 100,
    "checkpoint_seconds": 5.0,
    "debounce": None,
    "debounce_key": None,
    "debounce_max": None,
    "fair_key": None,
    "fair_weights": None,
    "rate_key": None,
}
"""The default of each of :class:`WorkerOptions` (a test checks the two name the same options)."""


def _option(worker: object, name: str) -> Any:
    """The worker's option ``name``, else its default (only options of the table are read)."""
    return getattr(worker, name, WORKER_DEFAULTS[name])


@dataclass(frozen=True, slots=True)
class Invocation:
    """How to call a ``perform`` that is not an async method of a payload dict.

    ``binder`` rebuilds a task function's arguments from the params (None: the
    payload dict is the one argument); ``sync`` runs it in the consumer's
    thread pool. Class workers with an async ``perform`` have none, and cost
    the performer one ``is None`` test.
    """

    function: Callable[..., Any]
    binder: Binder | None
    sync: bool

    def run(self, params: dict[str, Any], threads: SyncRunner) -> Awaitable[object]:
        """What to await to run the function for ``params`` (the function's own coroutine when async).

        Raises :class:`~fencekit.jobs._binding.Unbound` if the params do not bind.
        """
        if self.binder is not None:
            args, kwargs = self.binder.decode(params)
        else:
            args, kwargs = [params], {}
        if self.sync:
            return threads.run(self.function, args, kwargs)
        awaitable: Awaitable[object] = self.function(*args, **kwargs)
        return awaitable


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """A validated worker: its routing pair, policy and bound ``perform``."""

    queue: str
    operation: str
    policy: RetryPolicy
    perform: Callable[[dict[str, Any]], Awaitable[object]]
    name: str
    source: object
    timeout: float | None = None
    keep_ms: int | None = None
    keep_failed: bool = True
    priority: int = 0  # of the tasks a task function builds
    rate: Rate | None = None  # rate_limit: enforced by the claim script (queue.flow)
    key_of: Callable[[dict[str, Any]], object] | None = None  # concurrency_key: applied by producers
    max_concurrency: int | None = None  # per concurrency key: slots taken by the claim script
    plain: bool = True  # sets neither a timeout nor its own record retention (the hot path's test)
    call: Invocation | None = None  # None: ``await perform(params)`` (an async class worker)
    periodic: Schedule | None = None  # its schedule (``cron``/``every``), run by the Server or supervisor
    pace: tuple[int, float] = (100, 5.0)  # current_job().iterate checkpoints every N items or S seconds
    debounce: Debounce | None = None  # debounce_key, debounce, debounce_max: applied by producers
    keys: FlowKeys | None = None  # fair_key, rate_key (applied by producers), fair_weights


def _name(worker: object) -> str:
    if isinstance(worker, type):
        return worker.__qualname__
    qualname = getattr(worker, "__qualname__", None)  # a task function carries its function's
    if isinstance(qualname, str):
        return f"task {qualname}"
    return f"{type(worker).__qualname__} instance"


def _takes_self(function: object) -> bool:
    """True for a plain function whose first parameter would receive the instance."""
    try:
        parameters = list(inspect.signature(function).parameters.values())  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2


def inspect_worker(worker: object) -> WorkerSpec:
    """Validate ``worker``; :class:`ConfigError` names the worker and the attribute."""
    name = _name(worker)
    for attr in ("queue", "operation"):
        value = getattr(worker, attr, None)
        if not isinstance(value, str) or not value:
            raise ConfigError(f"worker {name}: attribute {attr!r} must be a non-empty str, got {value!r}")
    if '"' in worker.operation or "\\" in worker.operation:  # type: ignore[attr-defined]
        # the scripts read the operation out of the envelope, where JSON escapes these two
        raise ConfigError(
            f"worker {name}: attribute 'operation' must not contain '\"' or '\\\\', got {worker.operation!r}"  # type: ignore[attr-defined]
        )
    try:
        queue = validate_queue(worker.queue)  # type: ignore[attr-defined]
    except ConfigError as exc:
        raise ConfigError(f"worker {name}: attribute 'queue': {exc}") from None
    perform = getattr(worker, "perform", None)
    if perform is None or not callable(perform):
        raise ConfigError(f"worker {name}: attribute 'perform' must be a method ('async def' or 'def')")
    binder = getattr(worker, "fencekit_binder", None)  # set by a task function
    if binder is not None and not isinstance(binder, Binder):
        raise ConfigError(f"worker {name}: attribute 'fencekit_binder' must be a Binder, got {binder!r}")
    if inspect.isasyncgenfunction(perform) or inspect.isgeneratorfunction(perform):
        raise ConfigError(f"worker {name}: attribute 'perform' must return a value, not be a generator")
    sync = not inspect.iscoroutinefunction(perform)
    if binder is None and isinstance(worker, type) and not inspect.ismethod(perform) and _takes_self(perform):
        raise ConfigError(
            f"worker {name}: attribute 'perform' must be a classmethod when the class is registered; "
            "register an instance to use an instance method"
        )
    retry = _option(worker, "retry")
    if type(retry) is not bool:
        raise ConfigError(f"worker {name}: attribute 'retry' must be a bool, got {retry!r}")
    retry_count = _option(worker, "retry_count")
    if type(retry_count) is not int or retry_count < 0:
        raise ConfigError(f"worker {name}: attribute 'retry_count' must be an int >= 0, got {retry_count!r}")
    timeout = _option(worker, "timeout")
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if timeout is not None and not is_timeout(timeout):
        raise ConfigError(
            f"worker {name}: attribute 'timeout' must be None or a positive number of seconds, "
            f"got {getattr(worker, 'timeout', None)!r}"
        )
    keep = _option(worker, "keep_result")
    if isinstance(keep, timedelta):
        keep = keep.total_seconds()
    if keep is not None and (type(keep) not in (int, float) or not 0 <= keep < 1e10):
        raise ConfigError(
            f"worker {name}: attribute 'keep_result' must be None or a number of seconds >= 0, "
            f"got {getattr(worker, 'keep_result', None)!r}"
        )
    keep_failed = _option(worker, "keep_failed")
    if type(keep_failed) is not bool:
        raise ConfigError(f"worker {name}: attribute 'keep_failed' must be a bool, got {keep_failed!r}")
    keep_ms = round(keep * 1000) if keep is not None else None
    options = {o: _option(worker, o) for o in ("cron", "every", "cron_params", "cron_tz", "cron_catch_up")}
    periodic = schedule_of(f"worker {name}", queue, worker.operation, options, keep_ms)  # type: ignore[attr-defined]
    if periodic is not None and binder is not None:
        try:
            binder.decode(periodic.params)
        except PayloadError as exc:
            raise ConfigError(
                f"worker {name}: attribute 'cron_params' must bind every required parameter "
                f"of the function: {exc}"
            ) from None
    priority = _option(worker, "priority")
    if not is_priority(priority):
        raise ConfigError(
            f"worker {name}: attribute 'priority' must be an int from -5 to 5, got {priority!r}"
        )
    rate_limit = _option(worker, "rate_limit")
    try:
        rate = parse_rate(rate_limit) if rate_limit is not None else None
    except ValueError as exc:
        raise ConfigError(f"worker {name}: attribute 'rate_limit' {exc}") from None
    key_of = _option(worker, "concurrency_key")
    if key_of is not None and not callable(key_of):
        raise ConfigError(f"worker {name}: attribute 'concurrency_key' must be a function of the params")
    max_concurrency = _option(worker, "max_concurrency")
    if max_concurrency is not None and (type(max_concurrency) is not int or max_concurrency < 1):
        raise ConfigError(
            f"worker {name}: attribute 'max_concurrency' must be None or an int >= 1, got {max_concurrency!r}"
        )
    if key_of is not None and max_concurrency is None:
        raise ConfigError(f"worker {name}: attribute 'concurrency_key' needs 'max_concurrency' (an int >= 1)")
    if periodic is not None and (priority or key_of is not None):
        try:
            key = key_of(periodic.params) if key_of is not None else None
        except Exception as exc:
            raise ConfigError(
                f"worker {name}: attribute 'concurrency_key' failed on the 'cron_params': "
                f"{type(exc).__name__}: {exc}"
            ) from None
        ckey = key if key is None or isinstance(key, str) else str(key)
        periodic = replace(periodic, priority=priority, concurrency_key=ckey)
    debounce = debounce_of(
        _option(worker, "debounce_key"), _option(worker, "debounce"), _option(worker, "debounce_max"), name
    )
    fair_key, rate_key = _option(worker, "fair_key"), _option(worker, "rate_key")
    keys = flow_keys(fair_key, rate_key, _option(worker, "fair_weights"), rate is not None, name)
    every, seconds = _option(worker, "checkpoint_every"), _option(worker, "checkpoint_seconds")
    if type(every) is not int or every < 1:
        raise ConfigError(f"worker {name}: attribute 'checkpoint_every' must be an int >= 1, got {every!r}")
    if type(seconds) not in (int, float) or not 0 < seconds < 1e10:
        raise ConfigError(
            f"worker {name}: attribute 'checkpoint_seconds' must be seconds > 0, got {seconds!r}"
        )
    return WorkerSpec(
        queue=queue,
        operation=worker.operation,  # type: ignore[attr-defined]
        policy=RetryPolicy(retry, retry_count),
        perform=perform,
        name=name,
        source=worker,
        timeout=float(timeout) if timeout is not None else None,
        keep_ms=keep_ms,
        keep_failed=keep_failed,
        priority=priority,
        rate=rate,
        key_of=key_of,
        max_concurrency=max_concurrency,
        plain=timeout is None and keep is None,
        call=Invocation(perform, binder, sync) if binder is not None or sync else None,
        periodic=periodic,
        pace=(every, float(seconds)),
        debounce=debounce,
        keys=keys,
    )


class WorkerRegistry:
    """Workers by ``(queue, operation)``; queues in registration order."""

    def __init__(self) -> None:
        self._specs: dict[tuple[str, str], WorkerSpec] = {}
        self._queues: dict[str, None] = {}

    def add(self, workers: Iterable[object]) -> None:
        """Validate every worker first, then register them all (all or nothing)."""
        specs = [inspect_worker(w) for w in workers]
        seen: dict[tuple[str, str], WorkerSpec] = {}
        for spec in specs:
            pair = (spec.queue, spec.operation)
            other = seen.get(pair) or self._specs.get(pair)
            if other is not None and other.source is not spec.source:
                raise ConfigError(
                    f"worker {spec.name}: ({spec.queue!r}, {spec.operation!r}) is already "
                    f"handled by {other.name}"
                )
            seen[pair] = spec
        for pair, spec in seen.items():
            self._specs[pair] = spec
            self._queues.setdefault(spec.queue, None)

    def schedules(self) -> list[Schedule]:
        """The schedules of the registered workers (``cron``/``every``), in registration order."""
        return [spec.periodic for spec in self._specs.values() if spec.periodic is not None]

    def get(self, queue: str, operation: str) -> WorkerSpec | None:
        return self._specs.get((queue, operation))

    def policy(self, queue: str, operation: str) -> RetryPolicy:
        """The worker's policy, or the default one for a worker this registry lacks."""
        spec = self._specs.get((queue, operation))
        return spec.policy if spec is not None else DEFAULT_POLICY

    @property
    def queues(self) -> list[str]:
        return list(self._queues)

    def __len__(self) -> int:
        return len(self._specs)

    def __iter__(self) -> Iterator[WorkerSpec]:
        return iter(self._specs.values())
