"""The primitives' rules as steps, driven by hand: no Redis.

Each rule of :mod:`fencekit.primitives.lock`, ``fence`` and ``idempotency`` is
a steps generator (:mod:`fencekit._redis.steps`) that both the sync and the
asyncio class run. Here a test plays the driver: it takes the request a step
yields (a :class:`Batch` of one script call or command, or a :class:`Sleep`),
answers it (a reply, or an error thrown in as a driver throws a failed
batch's) and checks the outcome and the hooks told. The real servers run the
same rules in ``tests/integration/test_lock.py``, ``test_fence.py`` and
``test_idempotency.py``.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
import redis.asyncio

from fencekit._redis import steps as steps_module
from fencekit._redis.scripts import Call
from fencekit._redis.steps import Batch, Cmd, Sleep, Steps, adrive, drive
from fencekit.errors import (
    ConfigError,
    FencedOutError,
    FenceKitError,
    IdempotencyResultMissing,
    LockNotAcquired,
    LockNotOwned,
)
from fencekit.hooks import FenceKitHooks
from fencekit.primitives.fence import FenceRules
from fencekit.primitives.idempotency import MISSING, _IdemRules
from fencekit.primitives.lock import AsyncDistributedLock, DistributedLock, _LockRules
from fencekit.primitives.tokens import BeginOutcome, FenceToken, LockHandle

TTL = timedelta(seconds=10)


@pytest.fixture
def told() -> list[tuple[Any, ...]]:
    """The hook calls, in order, as ``(hook name, *args)``."""
    return []


@pytest.fixture
def hooks(told: list[tuple[Any, ...]]) -> FenceKitHooks:
    names = [
        "idempotency_begin",
        "idempotency_outcome",
        "idempotency_done",
        "lock_acquired",
        "lock_acquire_failed",
        "lock_released",
        "fence_rejected",
        "fence_advanced",
    ]
    return FenceKitHooks(
        **{f"on_{name}": (lambda *args, name=name: told.append((name, *args))) for name in names}
    )


def request(steps: Steps[Any], answer: Any = None) -> Any:
    """The next request of ``steps`` (``answer`` is the reply to the previous one)."""
    return next(steps) if answer is None else steps.send(answer)


def one_op(batch: Any) -> Any:
    """The single op of a batch the primitives send (each rule sends one op per round trip)."""
    assert isinstance(batch, Batch)
    assert len(batch.ops) == 1
    assert not batch.slots
    assert batch.wait is None
    return batch.ops[0]


def result(steps: Steps[Any], answer: Any) -> Any:
    """What ``steps`` returns once sent ``answer``."""
    with pytest.raises(StopIteration) as done:
        steps.send(answer)
    return done.value.value


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the lock ---------------------------------------------------------------------------


def acquire(rules: _LockRules, clock: Clock | None = None, **kwargs: Any) -> Steps[LockHandle]:
    args = {"ttl": TTL, "owner_id": "me", "blocking": False, "wait": None}
    args.update(kwargs)
    retry = args.pop("retry_interval", timedelta(milliseconds=50))
    return rules.acquire(
        "res", args["ttl"], args["owner_id"], args["blocking"], args["wait"], retry, clock or Clock()
    )


def test_acquire_sends_lock_acquire_and_a_token_reply_is_a_grant(
    hooks: FenceKitHooks, told: list[tuple[Any, ...]]
) -> None:
    steps = acquire(_LockRules("p", hooks))
    call = one_op(request(steps))
    assert isinstance(call, Call)
    assert call.script.name == "lock_acquire"
    assert call.keys == ("p:lock:{res}", "p:lock:{res}:seq")
    handle = result(steps, [17])
    assert handle == LockHandle("res", "me", FenceToken(17, "res"), TTL)
    assert told == [("lock_acquired", "res", 17)]


def test_a_held_lock_refuses_a_non_blocking_acquire_at_once(
    hooks: FenceKitHooks, told: list[tuple[Any, ...]]
) -> None:
    steps = acquire(_LockRules("p", hooks))
    one_op(request(steps))
    with pytest.raises(LockNotAcquired, match=r"^lock on 'res' is held by another owner$"):
        steps.send([None])
    assert told == [("lock_acquire_failed", "res")]


def test_a_blocking_acquire_sleeps_between_attempts_until_its_wait_runs_out(
    hooks: FenceKitHooks, told: list[tuple[Any, ...]]
) -> None:
    clock = Clock()
    steps = acquire(
        _LockRules("p", hooks),
        clock,
        blocking=True,
        wait=timedelta(milliseconds=1250),
        retry_interval=timedelta(milliseconds=500),
    )
    call = one_op(request(steps))
    assert request(steps, [None]) == Sleep(0.5)
    clock.now += 0.5
    assert one_op(steps.send(None)) == call  # the same call again: a new attempt
    clock.now += 0.5
    assert steps.send([None]) == Sleep(0.25)  # never past the deadline
    clock.now += 0.25
    one_op(steps.send(None))
    with pytest.raises(LockNotAcquired, match=re.escape("held by another owner within 0:00:01.250000")):
        steps.send([None])
    assert told == [("lock_acquire_failed", "res")]


def test_a_blocking_acquire_returns_the_grant_that_comes_while_it_waits() -> None:
    steps = acquire(_LockRules("p", None), blocking=True, wait=TTL)
    one_op(request(steps))
    assert isinstance(steps.send([None]), Sleep)
    one_op(steps.send(None))
    assert result(steps, [3]).token == FenceToken(3, "res")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"blocking": True}, ConfigError, "blocking=True needs wait="),
        ({"wait": TTL}, ConfigError, "wait only applies with blocking=True"),
        ({"blocking": 1}, TypeError, "blocking must be a bool"),
        ({"ttl": 5}, TypeError, "ttl must be a datetime.timedelta"),
        ({"blocking": True, "wait": -TTL}, ConfigError, "wait must not be negative"),
    ],
)
def test_acquire_checks_its_arguments_before_any_request(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        next(acquire(_LockRules("p", None), **kwargs))


def test_an_unexpected_acquire_reply_is_an_error() -> None:
    steps = acquire(_LockRules("p", None))
    one_op(request(steps))
    with pytest.raises(FenceKitError, match=re.escape("unexpected reply from lock_acquire.lua")):
        steps.send([True])


HANDLE = LockHandle("res", "me", FenceToken(7, "res"), TTL)


def test_release_tells_the_hooks_only_once_redis_accepted_it(
    hooks: FenceKitHooks, told: list[tuple[Any, ...]]
) -> None:
    rules = _LockRules("p", hooks)
    steps = rules.release(HANDLE)
    call = one_op(request(steps))
    assert (call.script.name, call.args[-1]) == ("lock_release", 7)
    assert result(steps, [1]) is None
    assert told == [("lock_released", "res")]

    refused = rules.release(HANDLE)
    next(refused)
    with pytest.raises(LockNotOwned):
        refused.throw(LockNotOwned("gone"))  # as a driver throws a failed batch's error
    assert told == [("lock_released", "res")]


def test_release_after_a_failed_body_notes_a_failed_release_on_the_body_error() -> None:
    body_error = RuntimeError("body")
    steps = _LockRules("p", None).release_after(HANDLE, body_error)
    next(steps)
    with pytest.raises(StopIteration):
        steps.throw(LockNotOwned("lease lost"))
    if sys.version_info >= (3, 11):
        assert body_error.__notes__ == [
            "fencekit: releasing the lock also failed: LockNotOwned('lease lost')"
        ]
    else:  # no add_note before 3.11: the body's error reaches the caller as it was
        assert not hasattr(body_error, "__notes__")


def test_extend_returns_the_same_grant_with_the_new_ttl() -> None:
    steps = _LockRules("p", None).extend(HANDLE, TTL * 3)
    call = one_op(request(steps))
    assert call.script.name == "lock_extend"
    assert result(steps, [1]) == LockHandle("res", "me", FenceToken(7, "res"), TTL * 3)
    with pytest.raises(TypeError, match="expected a LockHandle, got str"):
        next(_LockRules("p", None).extend("handle", TTL))


# -- the fence --------------------------------------------------------------------------

TOKEN = FenceToken(9, "res")


def test_a_fenced_write_tells_the_hooks_it_advanced_or_was_refused(
    hooks: FenceKitHooks, told: list[tuple[Any, ...]]
) -> None:
    rules = FenceRules("p", None, hooks)
    steps = rules.set_if_fresh(TOKEN, "{res}:status", "running")
    call = one_op(request(steps))
    assert (call.script.name, call.keys) == ("fence_set", ("p:fence:{res}", "{res}:status"))
    assert result(steps, [1]) is None
    assert told == [("fence_advanced", "res", 9)]

    refused = rules.check_and_advance(TOKEN)
    assert one_op(request(refused)).script.name == "fence_advance"
    with pytest.raises(FencedOutError):
        refused.throw(FencedOutError("stale"))
    assert told[-1] == ("fence_rejected", "res", 9)


def test_a_check_reads_the_fence_and_advances_nothing(
    hooks: FenceKitHooks, told: list[tuple[Any, ...]]
) -> None:
    steps = FenceRules("p", None, hooks).check(TOKEN)
    assert one_op(request(steps)).script.name == "fence_check"
    assert result(steps, [b"9"]) == 9
    assert told == []


def test_current_max_is_a_get_of_the_fence_key() -> None:
    rules = FenceRules("p", None)
    steps = rules.current_max("res")
    assert one_op(request(steps)) == Cmd("get", ("p:fence:{res}",))
    assert result(steps, [None]) == 0
    steps = rules.current_max("res")
    next(steps)
    with pytest.raises(FenceKitError, match="unexpected fence value in Redis"):
        steps.send([b"x"])


def test_a_fenced_write_checks_its_arguments_before_any_request() -> None:
    rules = FenceRules("p", None)
    with pytest.raises(TypeError, match="expected a FenceToken"):
        next(rules.check(7))
    with pytest.raises(ConfigError, match="the target key must not be the fence key itself"):
        next(rules.set_if_fresh(TOKEN, "p:fence:{res}", "x"))


# -- idempotency ------------------------------------------------------------------------


def test_try_begin_is_true_for_the_caller_that_begins(
    hooks: FenceKitHooks, told: list[tuple[Any, ...]]
) -> None:
    rules = _IdemRules("p", "me", hooks)
    steps = rules.try_begin("k", TTL)
    call = one_op(request(steps))
    assert (call.script.name, call.keys) == ("idem_begin", ("p:idem:{k}", "p:idem:{k}:result"))
    assert result(steps, [1]) is True
    steps = rules.try_begin("k", TTL)
    next(steps)
    assert result(steps, [0]) is False
    assert told == [("idempotency_begin", "k", True), ("idempotency_begin", "k", False)]
    with pytest.raises(ConfigError, match="at least 1 second"):
        next(rules.try_begin("k", timedelta(milliseconds=10)))


def test_mark_done_tells_the_hooks_whether_a_memo_was_stored(
    hooks: FenceKitHooks, told: list[tuple[Any, ...]]
) -> None:
    rules = _IdemRules("p", "me", hooks)
    for memo, stored in ((MISSING, False), ({"a": 1}, True)):
        steps = rules.mark_done("k", None, memo)
        assert one_op(request(steps)).script.name == "idem_done"
        assert result(steps, [1]) is None
        assert told[-1] == ("idempotency_done", "k", stored)


def test_reclaim_needs_a_lock_of_its_drivers_kind_and_reads_the_outcome(
    hooks: FenceKitHooks, told: list[tuple[Any, ...]]
) -> None:
    rules = _IdemRules("p", "me", hooks)
    sync_lock = DistributedLock(redis.Redis(), prefix="p")  # key building only: no I/O
    async_lock = AsyncDistributedLock(redis.asyncio.Redis())
    with pytest.raises(TypeError, match=r"^lock must be a DistributedLock, got AsyncDistributedLock$"):
        next(rules.try_begin_or_reclaim("k", async_lock, DistributedLock, "k", TTL, TTL))
    with pytest.raises(TypeError, match=r"^lock must be an AsyncDistributedLock, got DistributedLock$"):
        next(rules.try_begin_or_reclaim("k", sync_lock, AsyncDistributedLock, "k", TTL, TTL))
    steps = rules.try_begin_or_reclaim("k", sync_lock, DistributedLock, "k", TTL, TTL)
    call = one_op(request(steps))
    assert (call.script.name, call.keys[-1]) == ("idem_reclaim", "p:lock:{k}")
    assert result(steps, [b"reclaimed"]) is BeginOutcome.RECLAIMED
    assert told == [("idempotency_outcome", "k", BeginOutcome.RECLAIMED)]


def test_status_clear_and_the_memo_are_plain_commands() -> None:
    rules = _IdemRules("p", "me", None)
    for value, status in ((None, None), (b"done", "done"), ("pending:someone", "pending")):
        steps = rules.status("k")
        assert one_op(request(steps)) == Cmd("get", ("p:idem:{k}",))
        assert result(steps, [value]) == status
    steps = rules.clear("k")
    assert one_op(request(steps)) == Cmd("delete", ("p:idem:{k}", "p:idem:{k}:result"))
    assert result(steps, [2]) is None
    steps = rules.get_result("k")
    assert one_op(request(steps)) == Cmd("get", ("p:idem:{k}:result",))
    assert result(steps, [b'{"moves":42}']) == {"moves": 42}
    steps = rules.get_result("k")
    next(steps)
    with pytest.raises(IdempotencyResultMissing, match="no result stored for 'k'"):
        steps.send([None])


# -- the two drivers run the same steps ---------------------------------------------------


def sleeper() -> Iterator[Any]:
    yield Sleep(0)
    return "slept"


def test_both_drivers_answer_a_sleep_request() -> None:
    assert drive(redis.Redis(), sleeper()) == "slept"
    assert asyncio.run(adrive(redis.asyncio.Redis(), sleeper())) == "slept"


def test_both_lock_classes_run_a_blocking_acquire_through_the_same_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fake round trip answers "held" twice, then a token; each driver sleeps in between."""
    sent: list[Any] = []

    def answers() -> Iterator[list[Any]]:
        yield [None]
        yield [None]
        yield [5]

    replies = answers()

    def run_batch(client: Any, batch: Batch) -> list[Any]:
        sent.append(batch.ops[0].script.name)
        return next(replies)

    async def arun_batch(client: Any, batch: Batch) -> list[Any]:
        return run_batch(client, batch)

    monkeypatch.setattr(steps_module, "run_batch", run_batch)
    monkeypatch.setattr(steps_module, "arun_batch", arun_batch)
    kwargs: dict[str, Any] = {
        "ttl": TTL,
        "owner_id": "me",
        "blocking": True,
        "wait": TTL,
        "retry_interval": timedelta(milliseconds=1),
    }
    handle = DistributedLock(redis.Redis()).acquire("res", **kwargs)
    replies = answers()
    ahandle = asyncio.run(AsyncDistributedLock(redis.asyncio.Redis()).acquire("res", **kwargs))
    assert handle == ahandle == LockHandle("res", "me", FenceToken(5, "res"), TTL)
    assert sent == ["lock_acquire"] * 6
