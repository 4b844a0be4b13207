"""The task scope (``fencekit._aio.scope``): every task it started is cancelled and awaited at its
close, a swallowed cancellation is not waited for forever, a failure is logged, scopes nest.

Real tasks on a real event loop, no mocks; each close is bounded (``close_wait``), and a
test that fails does so with an assertion, not a hang.
"""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from fencekit._aio.scope import TaskScope

LOGGER = "test.fencekit.scope"


def scope(name: str = "test", **kwargs: float) -> TaskScope:
    kwargs.setdefault("recancel", 0.05)
    kwargs.setdefault("close_wait", 2.0)
    return TaskScope(name, logger=logging.getLogger(LOGGER), **kwargs)


async def test_a_close_cancels_every_task_and_waits_for_its_cleanup() -> None:
    cleaned: list[int] = []

    async def forever(n: int) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.01)  # a cleanup that awaits: the close waits for it
            cleaned.append(n)

    s = scope()
    tasks = [s.start(forever(n), name=f"t{n}") for n in range(5)]
    await asyncio.sleep(0)
    assert s.running == 5
    assert await s.aclose() is True
    assert sorted(cleaned) == [0, 1, 2, 3, 4]
    assert all(task.cancelled() for task in tasks)
    assert s.running == 0


async def test_async_with_closes_the_scope_on_the_way_out() -> None:
    async with scope() as s:
        task = s.start(asyncio.sleep(3600))
    assert task.cancelled()


async def test_a_task_that_swallows_its_cancel_once_is_cancelled_again_and_the_close_ends() -> None:
    swallowed: list[int] = []

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(1)  # goes on as if nothing happened: a lost cancel

    s = scope()
    task = s.start(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    assert await asyncio.wait_for(s.aclose(), 5) is True
    assert swallowed == [1]
    assert task.cancelled()


async def test_a_cancel_lost_in_wait_for_does_not_hang_the_close() -> None:
    """The real thing: on Python < 3.12, ``asyncio.wait_for`` returns the item that arrives in the
    same step as the cancellation and drops the cancellation (the listener loop goes on)."""
    inbox: asyncio.Queue[int] = asyncio.Queue()
    got: list[int] = []

    async def listener() -> None:
        while True:
            try:
                got.append(await asyncio.wait_for(inbox.get(), 10))
            except asyncio.TimeoutError:
                pass

    s = scope()
    task = s.start(listener(), name="listener")
    for _ in range(3):
        await asyncio.sleep(0)
    inbox.put_nowait(1)  # the item and the close's first cancel meet
    assert await asyncio.wait_for(s.aclose(), 5) is True
    assert task.done()
    if sys.version_info < (3, 12):
        assert got == [1]  # the item won: the first cancel was lost, a second one ended it


async def test_a_task_that_never_ends_is_named_and_left_behind_after_close_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def deaf() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    s = scope(close_wait=0.3)
    task = s.start(deaf(), name="deaf-listener")
    await asyncio.sleep(0)
    try:
        with caplog.at_level(logging.ERROR, LOGGER):
            assert await asyncio.wait_for(s.aclose(), 5) is False
        assert not task.done()
    finally:
        release.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    [record] = [r for r in caplog.records if "did not end" in r.getMessage()]
    text = record.getMessage()
    assert "deaf-listener (" in text
    assert "deaf" in text
    assert "test_scope.py" in text  # the line it is stuck at


async def test_a_failing_task_is_logged_with_its_traceback_and_its_siblings_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken() -> None:
        await asyncio.sleep(0)
        raise KeyError("the bug")

    s = scope("owner")
    with caplog.at_level(logging.ERROR, LOGGER):
        sibling = s.start(asyncio.sleep(3600), name="sibling")
        failing = s.start(broken(), name="broken-loop")
        await asyncio.wait([failing])
        await asyncio.sleep(0)
    [record] = [r for r in caplog.records if "failed" in r.getMessage()]
    assert "owner: task broken-loop (" in record.getMessage()
    assert "KeyError" in record.getMessage()
    assert record.exc_info is not None
    assert record.exc_info[1] is failing.exception()
    assert not sibling.done()  # a failure does not cancel the others
    await s.aclose()
    assert sibling.cancelled()


async def test_an_awaited_task_leaves_its_failure_to_its_starter(caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        raise ValueError("read by the starter")

    s = scope()
    with caplog.at_level(logging.ERROR, LOGGER):
        task = s.start(broken(), awaited=True)
        with pytest.raises(ValueError, match="read by the starter"):
            await task
        await s.aclose()
    assert not [r for r in caplog.records if "failed" in r.getMessage()]


async def test_nested_scopes_the_child_is_closed_by_its_owner_first_and_by_the_parent_anyway() -> None:
    order: list[str] = []

    async def helper(name: str) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            order.append(name)

    parent = scope("server")

    async def consumer() -> None:  # owns a child scope, closes it in its own order
        async with parent.child("consumer") as mine:
            mine.start(helper("waker"))
            mine.start(helper("listener"))
            try:
                await asyncio.sleep(3600)
            finally:
                order.append("consumer cleanup")

    parent.start(consumer(), name="consumer")
    await asyncio.sleep(0.01)
    assert await parent.aclose() is True
    assert order[0] == "consumer cleanup"
    assert sorted(order[1:]) == ["listener", "waker"]

    # an owner that swallows its cancel: the parent's later rounds reach the child's tasks anyway
    parent = scope("server")
    child = parent.child("consumer")
    orphan = child.start(asyncio.sleep(3600), name="orphaned helper")
    assert child.path == "server / consumer"

    async def deaf_owner() -> None:
        for _ in range(3):
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    owner = parent.start(deaf_owner())
    await asyncio.sleep(0)
    assert await asyncio.wait_for(parent.aclose(), 5) is True
    assert orphan.cancelled()
    assert owner.done()


async def test_a_cancel_of_the_closer_does_not_cut_the_close_short() -> None:
    """The owner's own task is cancelled again while it closes: the tasks still end, then it is cancelled."""
    cleaned = asyncio.Event()

    async def slow_cleanup() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.2)
            cleaned.set()

    s = scope(recancel=1.0)
    s.start(slow_cleanup())
    await asyncio.sleep(0)
    closer = asyncio.ensure_future(s.aclose())
    await asyncio.sleep(0.05)
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer
    assert cleaned.is_set()
    assert s.running == 0


async def test_a_task_started_while_the_scope_closes_is_cancelled_and_the_scope_is_reusable() -> None:
    s = scope()
    late: list[asyncio.Task[None]] = []

    async def starts_another_on_its_way_out() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            late.append(s.start(asyncio.sleep(3600), name="late"))

    s.start(starts_another_on_its_way_out())
    await asyncio.sleep(0)
    assert await s.aclose() is True
    assert late[0].cancelled()
    again = s.start(asyncio.sleep(0, result=7), awaited=True)
    assert await again == 7
    await s.aclose()


async def test_wait_lets_the_tasks_finish_without_cancelling() -> None:
    s = scope()
    task = s.start(asyncio.sleep(0.05, result="done"), awaited=True)
    assert await s.wait(timeout=0.001) is False
    assert await s.wait() is True
    assert task.result() == "done"


async def test_a_task_closing_its_own_scope_ends_the_others_and_not_itself() -> None:
    s = scope()
    other = s.start(asyncio.sleep(3600))

    async def stopper() -> str:
        await s.aclose()
        return "still here"

    assert await s.start(stopper(), awaited=True) == "still here"
    assert other.cancelled()


async def test_a_task_left_behind_is_named_once_and_not_waited_for_again_by_an_outer_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def deaf() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    parent = scope("server", close_wait=0.3)
    child = parent.child("consumer")
    task = child.start(deaf(), name="deaf-job")
    await asyncio.sleep(0)
    try:
        with caplog.at_level(logging.ERROR, LOGGER):
            assert await child.aclose() is False
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert await parent.aclose() is True  # nothing of its own, the child's straggler given up on
            assert loop.time() - started < 0.2
        assert len([r for r in caplog.records if "did not end" in r.getMessage()]) == 1
        assert parent.tasks() == []
    finally:
        release.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_wait_for_gives_up_at_once_and_leaves_the_cancelled_task_to_the_scope() -> None:
    s = scope(recancel=1.0)
    assert await s.wait_for(asyncio.sleep(0, result="quick"), 1.0) == "quick"
    ended = asyncio.Event()

    async def slow_to_end() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.1)  # its cancellation takes a while: wait_for does not wait for it
            ended.set()

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(asyncio.TimeoutError):
        await s.wait_for(slow_to_end(), 0.05, name="slow")
    assert loop.time() - started < 0.1
    assert not ended.is_set()
    assert [t.get_name() for t in s.tasks()] == ["slow"]
    assert await s.aclose() is True  # the scope awaits it
    assert ended.is_set()

    with pytest.raises(KeyError):
        await s.wait_for(_raises(KeyError("x")), 1.0)


async def _raises(exc: BaseException) -> None:
    raise exc


async def test_then_runs_when_the_task_ends_from_the_scopes_one_callback() -> None:
    s = scope()
    seen: list[object] = []
    task = s.start(asyncio.sleep(0, result=3), then=lambda t: seen.append(t.result()))
    await task
    await asyncio.sleep(0)
    assert seen == [3]
