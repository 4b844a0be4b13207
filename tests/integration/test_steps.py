"""The two drivers of ``fencekit._redis.steps`` run one batch alike: ``NOSCRIPT`` reruns only the
missing script calls (nothing else is sent twice), errors are translated, in their slots or raised."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio

from fencekit._redis import scripts
from fencekit._redis.run import TryAgain
from fencekit._redis.steps import Batch, Steps, adrive, batch_steps, cmd, drive, execute_ops
from fencekit.errors import StoreError


def counted_lock(counter: str) -> Steps[list[Any]]:
    """One round trip: a counter bumped, a script call, the counter read; then the counter again."""
    call = scripts.lock_acquire(lock="L:{r}", seq="L:{r}:seq", owner="me", ttl_ms=10_000)
    replies = yield Batch((cmd("incr", counter), call, cmd("get", counter)))
    (after,) = yield Batch((cmd("get", counter),))
    return [*replies, after]


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_missing_script_runs_again_alone_and_the_rest_of_its_batch_once(
    kind: str, redis_url: str
) -> None:
    with redis.Redis.from_url(redis_url) as r:
        r.script_flush()
        if kind == "sync":
            bumped, token, seen, after = drive(r, counted_lock("n"))
        else:
            client = redis.asyncio.Redis.from_url(redis_url)
            bumped, token, seen, after = await adrive(client, counted_lock("n"))
            await client.aclose()
        assert (bumped, seen, after) == (1, b"1", b"1")  # the INCR ran once
        assert int(token) > 0
        assert r.script_exists(scripts.SCRIPTS.lock_acquire.sha) == [True]


def errors_of(slots: bool) -> Steps[list[Any]]:
    return (yield Batch((cmd("set", "s", "x"), cmd("incr", "s"), cmd("get", "s")), slots=slots))


def test_an_error_reply_comes_back_in_its_slot_or_is_raised_translated(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as r:
        ok, error, value = drive(r, errors_of(slots=True))
        assert (ok, value) == (True, b"x")
        assert isinstance(error, StoreError)
        assert "not an integer" in str(error)
        with pytest.raises(StoreError, match="not an integer"):
            drive(r, errors_of(slots=False))


def test_a_script_still_missing_right_after_its_load_is_a_transient_try_again(redis_url: str) -> None:
    """As after a failover: the load reached a node, the call the new primary, which lacks it.
    The call did not run; its slot says TryAgain (a WARNING for the loops, not an outage)."""
    call = scripts.lock_acquire(lock="L:{r}", seq="L:{r}:seq", owner="me", ttl_ms=10_000)
    with redis.Redis.from_url(redis_url) as r:
        r.script_flush()
        steps = batch_steps(Batch((call,), slots=True))
        first = execute_ops(r, next(steps))
        again = steps.send(first)
        loaded = execute_ops(r, again[:-1])
        r.script_flush()  # the node the call reaches has not loaded it
        with pytest.raises(StopIteration) as done:
            steps.send(loaded + execute_ops(r, again[-1:]))
        (reply,) = done.value.value
        assert isinstance(reply, TryAgain)
        assert reply.transient
        assert not r.exists("L:{r}")  # it did not run
