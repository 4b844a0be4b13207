"""A Celery task decorator: one run per idempotency key, under a fenced lock.

``idempotent_task`` is the decorator of the published fencekit 0.6.1 (same
name, same signature, same outcomes), rebuilt on this package's primitives.
Stack it under ``app.task``::

    @app.task(bind=True, acks_late=True, max_retries=20)
    @idempotent_task(guard, lock, key=lambda order: f"charge:{order}",
                     lock_resource=lambda order: f"order:{order}",
                     idempotency_ttl=timedelta(hours=1), lock_ttl=timedelta(seconds=30),
                     retry_on_in_progress=True)
    def charge(self, order):
        gate.set_if_fresh(current_token(), f"order:{order}:charged", "yes")
        return "charged"

Each delivery asks :meth:`~fencekit.IdempotencyGuard.try_begin_or_reclaim`:

- ``ALREADY_DONE``: the body does not run; the delivery returns the memo the
  run that finished stored (``None`` when it stored none).
- ``IN_PROGRESS`` (a live delivery holds the lock): ``self.retry(countdown=
  retry_countdown)`` for a bound task when ``retry_on_in_progress``, else
  ``None``.
- ``BEGUN`` / ``RECLAIMED`` (the key was new, or its worker died and its lease
  ended): acquire the lock, run the body, mark the key done (with the result
  as memo when ``store_result``), release the lock.

What it does beyond 0.6.1, because a lease is not mutual exclusion (the
time-line in :mod:`fencekit.primitives.lock`):

- The body can fence its writes: :func:`current_token` is this delivery's
  :class:`~fencekit.FenceToken` (:func:`current_lock` its lock handle), for
  :meth:`FenceGate.set_if_fresh <fencekit.FenceGate.set_if_fresh>` or a SQL
  ``UPDATE ... WHERE fence_token <= :token``. A delivery paused past its lease
  then finds its writes refused instead of overwriting the newer delivery's.
- Each delivery begins the key under an owner id of its own
  (``<guard.owner_id>/<uuid4 hex>``), not the guard's shared one: prefork
  children inherit one guard, and under a shared owner a stale delivery's
  ``mark_done`` would pass the owner check of a key its successor reclaimed.
- After the body returns, the lease is checked (``extend``) before the key is
  marked done. A delivery whose lease ended while the body ran raises
  :class:`~fencekit.LockNotOwned` and marks nothing: a newer delivery may own
  the key, and its result must not be overwritten by a run that was not
  exclusive. Should the stale run reach ``mark_done`` anyway (paused again
  between the check and the mark), its per-delivery owner makes
  ``mark_done`` raise :class:`~fencekit.IdempotencyNotOwned`.
- A body that raises releases the lock and leaves the key ``pending``, so a
  retry (or redelivery) reclaims it at once; the body's exception propagates
  (a failed release is attached as a note, never in its place).
- The wrapper carries the body's name, docstring *and* signature
  (``__signature__``), so Celery checks the arguments of ``delay`` against the
  real parameters; ``bind=True`` works (the task is recognised as a
  ``celery.Task`` instance, not by duck typing).

The module imports without Celery; calling :func:`idempotent_task` without it
raises ``ImportError`` naming the extra to install.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import math
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import Any, TypeVar, cast

from fencekit.errors import (
    ConfigError,
    FenceKitError,
    IdempotencyResultMissing,
    LockNotOwned,
    NoCurrentJob,
)
from fencekit.primitives._common import ttl_ms, ttl_seconds
from fencekit.primitives.idempotency import IdempotencyGuard
from fencekit.primitives.lock import DistributedLock
from fencekit.primitives.tokens import BeginOutcome, FenceToken, LockHandle

__all__ = ["current_lock", "current_token", "idempotent_task"]

F = TypeVar("F", bound=Callable[..., Any])

EXTRA_HINT = "pip install 'fencekit-jobs[celery]'"

_current: ContextVar[LockHandle] = ContextVar("fencekit_celery_lock")


def current_lock() -> LockHandle:
    """The lock handle of the :func:`idempotent_task` body running in this context.

    Pass it to ``lock.extend(current_lock(), ttl=...)`` to lengthen the lease
    of a long body. Raises :class:`~fencekit.errors.NoCurrentJob` outside a body.
    """
    try:
        return _current.get()
    except LookupError:
        raise NoCurrentJob("current_lock() is only set inside the body of an idempotent_task") from None


def current_token() -> FenceToken:
    """The fencing token of the delivery whose body runs in this context.

    Present it with every write the body makes (``FenceGate.set_if_fresh``,
    ``UPDATE ... WHERE fence_token <= :token``): a newer delivery of the same
    key always holds a larger token, so a stale delivery's write is refused.
    Raises :class:`~fencekit.errors.NoCurrentJob` outside a body.
    """
    try:
        return _current.get().token
    except LookupError:
        raise NoCurrentJob("current_token() is only set inside the body of an idempotent_task") from None


def _require_celery() -> type[Any]:
    """``celery.Task``, or ImportError naming the extra when Celery is not installed."""
    if importlib.util.find_spec("celery") is None:
        raise ImportError(f"fencekit.integrations.celery needs Celery: {EXTRA_HINT}") from None
    task: type[Any] = importlib.import_module("celery").Task  # no stubs: imported by name
    return task


def _note(error: BaseException, text: str) -> None:
    if sys.version_info >= (3, 11):
        error.add_note(text)


def _check_countdown(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"retry_countdown must be a number of seconds, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"retry_countdown must be a finite number >= 0, got {value!r}")
    return float(value)


def _check_bool(value: object, label: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{label} must be a bool, got {value!r}")
    return value


def idempotent_task(
    guard: IdempotencyGuard,
    lock: DistributedLock,
    *,
    key: Callable[..., str],
    lock_resource: Callable[..., str],
    idempotency_ttl: timedelta,
    lock_ttl: timedelta,
    store_result: bool = True,
    retry_on_in_progress: bool = False,
    retry_countdown: float = 5.0,
) -> Callable[[F], F]:
    """Wrap a Celery task body: one run per idempotency key, under a fenced lock.

    ``key`` and ``lock_resource`` receive the task's arguments (after a bound
    task's ``self``) and return the idempotency key and the lock resource
    (on Redis Cluster they must share a hash tag; the key itself is a safe
    resource). ``idempotency_ttl`` (at least 1 s) bounds how long a pending
    key blocks other deliveries and how long a done key and its memo are
    remembered; ``lock_ttl`` is the lease: a crashed delivery's key is
    reclaimed once it ends, so make it longer than the body runs (or extend
    ``current_lock()`` from the body).

    Outcomes: a done key returns its memo (``None`` without one); a key in
    progress returns ``None``, or raises ``self.retry(countdown=retry_countdown)``
    for a bound task when ``retry_on_in_progress``; otherwise the body runs
    with :func:`current_token` set, and the key is marked done with the body's
    result as memo when ``store_result`` (it must be JSON). A body exception
    releases the lock, leaves the key for a retry to reclaim, and propagates.
    A lease lost while the body ran raises :class:`~fencekit.LockNotOwned`
    and leaves the key to the newer delivery.

    Needs Celery (``pip install 'fencekit-jobs[celery]'``): ImportError otherwise.
    Bad arguments raise ``TypeError`` (wrong type) or
    :class:`~fencekit.ConfigError` (wrong value) here, not at the first delivery.
    """
    task_class = _require_celery()
    if not isinstance(guard, IdempotencyGuard):
        raise TypeError(f"guard must be an IdempotencyGuard, got {type(guard).__name__}")
    if not isinstance(lock, DistributedLock):
        raise TypeError(f"lock must be a DistributedLock, got {type(lock).__name__}")
    if not callable(key):
        raise TypeError(f"key must be a callable of the task's arguments, got {key!r}")
    if not callable(lock_resource):
        raise TypeError(f"lock_resource must be a callable of the task's arguments, got {lock_resource!r}")
    ttl_seconds(idempotency_ttl, "idempotency_ttl")
    ttl_ms(lock_ttl, "lock_ttl")
    _check_bool(store_result, "store_result")
    _check_bool(retry_on_in_progress, "retry_on_in_progress")
    countdown = _check_countdown(retry_countdown)

    def names(call_args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str]:
        idem_key, resource = key(*call_args, **kwargs), lock_resource(*call_args, **kwargs)
        for label, value in (("key", idem_key), ("lock_resource", resource)):
            if not isinstance(value, str):
                raise TypeError(f"{label}(...) must return a str, got {type(value).__name__} {value!r}")
        return idem_key, resource

    def decorator(func: F) -> F:
        if not callable(func):
            raise TypeError(f"idempotent_task decorates a function, got {func!r}")

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            task_self = args[0] if args and isinstance(args[0], task_class) else None
            idem_key, resource = names(args[1:] if task_self is not None else args, kwargs)
            # An owner of this delivery alone (see the module docstring).
            delivery = IdempotencyGuard(
                guard._redis, prefix=guard.prefix, owner_id=f"{guard.owner_id}/{uuid.uuid4().hex}"
            )
            outcome = delivery.try_begin_or_reclaim(
                idem_key, lock=lock, lock_resource=resource, ttl=idempotency_ttl
            )
            if outcome is BeginOutcome.ALREADY_DONE:
                try:
                    return delivery.get_result(idem_key)
                except IdempotencyResultMissing:
                    return None
            if outcome is BeginOutcome.IN_PROGRESS:
                if retry_on_in_progress and task_self is not None:
                    raise task_self.retry(countdown=countdown)
                return None
            handle = lock.acquire(resource, ttl=lock_ttl, owner_id=delivery.owner_id)
            with _running(lock, handle):
                result = func(*args, **kwargs)
            try:
                _still_held(lock, handle, lock_ttl, idem_key)
                if store_result:
                    delivery.mark_done(idem_key, ttl=idempotency_ttl, result=result)
                else:
                    delivery.mark_done(idem_key, ttl=idempotency_ttl)
            finally:
                try:
                    lock.release(handle)
                except LockNotOwned:
                    pass  # the lease check above reported it, or it ended just now
            return result

        # Celery checks call arguments against the signature it reads without
        # following __wrapped__; give it the body's own.
        wrapper.__signature__ = inspect.signature(func)  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorator


@contextmanager
def _running(lock: DistributedLock, handle: LockHandle) -> Iterator[None]:
    """Expose ``handle`` to the body; on a body exception release the lock and re-raise."""
    context = _current.set(handle)
    try:
        yield
    except BaseException as body_error:
        try:
            lock.release(handle)
        except FenceKitError as release_error:
            _note(body_error, f"fencekit: releasing the lock also failed: {release_error!r}")
        raise
    finally:
        _current.reset(context)


def _still_held(lock: DistributedLock, handle: LockHandle, lock_ttl: timedelta, idem_key: str) -> None:
    """LockNotOwned unless this delivery's lease is still the live one (renewed for the mark)."""
    try:
        lock.extend(handle, ttl=lock_ttl)
    except LockNotOwned as exc:
        raise LockNotOwned(
            f"the lease on {handle.resource!r} (token {handle.token.value}) ended while the task ran; "
            f"a newer delivery may hold it, so {idem_key!r} was not marked done by this one"
        ) from exc
