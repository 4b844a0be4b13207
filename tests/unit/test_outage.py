"""A process's outage (``fencekit._aio.outage``): a line when it starts, one a minute, one when it ends.

The loops' own back-off lines (the seed's schedule) still happen, at DEBUG;
the pool-level behaviour is ``test_outages.py::test_redis_stopped_past_the_heartbeat_ttl_and_back``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import pytest

from fencekit._aio.loops import Backoff, Loop
from fencekit._aio.outage import OUTAGE, Outage
from fencekit._redis.run import TryAgain
from fencekit.errors import StoreError


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def loud(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= logging.WARNING]

    def quiet(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == logging.DEBUG]


@pytest.fixture
def log() -> Capture:
    logger = logging.getLogger("fencekit.test_outage")
    logger.setLevel(logging.DEBUG)
    capture = Capture()
    logger.addHandler(capture)
    yield capture
    logger.removeHandler(capture)


class Member:
    def __init__(self, what: str) -> None:
        self.what = what
        self.logger = logging.getLogger("fencekit.test_outage")


def test_an_outage_is_one_line_when_it_starts_one_a_minute_and_one_when_it_ends(log: Capture) -> None:
    outage = Outage(repeat_every=0.2)
    a, b = Member("heartbeat"), Member("claiming")
    outage.failed(a, StoreError("refused"))
    for _ in range(50):
        outage.failed(a, StoreError("refused"))
        outage.failed(b, StoreError("refused"))
    assert log.loud() == [
        "Redis is not answering (heartbeat: refused); retrying quietly, a line a minute until it answers"
    ]
    time.sleep(0.25)
    outage.failed(b, StoreError("still"))
    outage.failed(a, StoreError("still"))
    assert log.loud()[1:] == ["Redis still not answering after 0s (2 loop(s) waiting): still"]
    outage.answered(a)  # b still fails: not over
    assert outage.open
    assert len(log.loud()) == 2
    outage.answered(b)
    assert not outage.open
    assert outage.ended == 1
    assert log.loud()[2].startswith("Redis answers again (claiming), after an outage of 0.")
    outage.answered(a)  # a success with nothing failing says nothing
    assert len(log.loud()) == 3


def test_loops_that_stop_trying_end_the_outage_without_a_line(log: Capture) -> None:
    outage = Outage()
    a = Member("waiting for work")
    outage.failed(a, StoreError("refused"))
    outage.forget(a)
    assert not outage.open
    assert outage.ended == 0
    outage.failed(a, StoreError("refused again"))  # a new outage, a new first line
    assert [m.split(";")[0] for m in log.loud()] == [
        "Redis is not answering (waiting for work: refused)",
        "Redis is not answering (waiting for work: refused again)",
    ]


async def test_a_loop_that_reaches_redis_wakes_the_others_from_their_back_off(log: Capture) -> None:
    logger = logging.getLogger("fencekit.test_outage")
    slow = Backoff(logger, "reaper", base=30.0, cap=30.0)
    fast = Backoff(logger, "heartbeat", base=0.01, cap=0.01)
    fast.failed(StoreError("refused"))
    pausing = asyncio.create_task(slow.pause(StoreError("refused")))
    await asyncio.sleep(0.05)
    assert not pausing.done()
    fast.succeeded()  # Redis answered the heartbeat: the reaper retries now, not in 30 s
    await asyncio.wait_for(pausing, 5)
    slow.succeeded()
    assert not OUTAGE.open
    assert log.quiet() == [
        "heartbeat failed, retrying in 0.0s: refused",
        "reaper failed, retrying in 30.0s: refused",
        "heartbeat recovered after 1 failed attempts",
        "reaper recovered after 1 failed attempts",
    ]
    assert [m.split(" (")[0] for m in log.loud()] == ["Redis is not answering", "Redis answers again"]


async def test_failures_that_are_not_redis_away_keep_their_own_lines(log: Capture) -> None:
    logger = logging.getLogger("fencekit.test_outage")
    migrating = Backoff(logger, "claiming")
    migrating.failed(TryAgain("TRYAGAIN a slot is moving"))  # transient: not an outage
    bug = Backoff(logger, "hang watch")
    bug.failed(ValueError("bad data"))
    assert not OUTAGE.open
    assert [(r.levelno, r.getMessage()) for r in log.records] == [
        (logging.WARNING, "claiming failed, retrying in 0.1s: TRYAGAIN a slot is moving"),
        (logging.ERROR, "hang watch failed, retrying in 0.1s: bad data"),
    ]
    migrating.succeeded()
    assert log.records[-1].levelno == logging.INFO


async def test_a_stopped_loop_leaves_the_outage(log: Capture) -> None:
    async def step() -> None:
        raise StoreError("refused")

    loop = Loop(
        "scheduler", step, lambda: 1.0, Backoff(logging.getLogger("fencekit.test_outage"), "scheduler")
    )
    task = asyncio.create_task(loop.run())
    await asyncio.sleep(0.05)
    assert OUTAGE.open
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not OUTAGE.open  # a Server stopped during an outage leaves none behind in the process


def test_a_forked_child_starts_with_no_outage() -> None:
    member = Member("heartbeat")
    OUTAGE.failed(member, StoreError("refused"))
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, b"1" if OUTAGE.open else b"0")
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(read, 1) == b"0"
        os.close(read)
        os.close(write)
    finally:
        OUTAGE.forget(member)


@pytest.mark.parametrize(("ttl", "retry"), [(30.0, 1.0), (300.0, 1.0), (1.0, 0.1)])
def test_a_failed_heartbeat_is_retried_within_a_second_whatever_the_ttl(ttl: float, retry: float) -> None:
    """Claims wait for a heartbeat after an outage past half the TTL: its back-off must not grow to
    a third of the TTL (10 s by default) as it did."""
    import redis.asyncio

    from fencekit._redis.keys import KeySpace
    from fencekit.services._heartbeat import Heartbeat

    beat = Heartbeat(redis.asyncio.Redis(), KeySpace(), ttl, logging.getLogger("fencekit.test_outage"), dict)
    backoff = beat.loop().backoff
    delays = [backoff.failed(StoreError("refused")) for _ in range(8)]
    assert delays == [retry] * 8
