"""The Coalescer's rule: at once when idle, else one batch after the send in flight -- and no call
is left behind when nothing else comes (the last writes of a drain must go out)."""

from __future__ import annotations

import asyncio

import pytest

from fencekit.produce._batching import Coalescer


class Gate:
    """A ``send`` whose every call waits until released; records what each call carried."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.release: list[asyncio.Event] = []

    async def send(self, items: list[int]) -> list[int | BaseException]:
        self.calls.append(list(items))
        event = asyncio.Event()
        self.release.append(event)
        await event.wait()
        return [ValueError(f"bad {i}") if i < 0 else i * 10 for i in items]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_calls_made_during_a_batch_go_out_after_it_with_nothing_else_coming() -> None:
    gate = Gate()
    c: Coalescer[int, int] = Coalescer(gate.send, "test")
    first = asyncio.ensure_future(c.submit(1))
    await settle()
    assert gate.calls == [[1]]  # alone, at once
    second = [asyncio.ensure_future(c.submit(i)) for i in (2, 3)]
    await settle()
    gate.release[0].set()
    await settle()
    assert gate.calls == [[1], [2, 3]]  # one batch after the first
    third = asyncio.ensure_future(c.submit(4))  # while the batch is in flight
    await settle()
    gate.release[1].set()
    await settle()
    assert gate.calls == [[1], [2, 3], [4]]  # sent although no call came after it
    gate.release[2].set()
    assert await asyncio.wait_for(asyncio.gather(first, *second, third), 2) == [10, 20, 30, 40]
    await c.aclose()


async def test_an_error_in_its_slot_fails_that_caller_only() -> None:
    gate = Gate()
    c: Coalescer[int, int] = Coalescer(gate.send, "test")
    first = asyncio.ensure_future(c.submit(1))
    await settle()
    rest = [asyncio.ensure_future(c.submit(i)) for i in (2, -3, 4)]
    await settle()
    gate.release[0].set()
    await settle()
    gate.release[1].set()
    results = await asyncio.wait_for(asyncio.gather(first, *rest, return_exceptions=True), 2)
    assert results[:2] == [10, 20]
    assert isinstance(results[2], ValueError)
    assert results[3] == 40


async def test_a_failing_send_fails_its_whole_batch_and_the_next_batch_still_goes() -> None:
    calls: list[list[int]] = []
    fail = asyncio.Event()

    async def send(items: list[int]) -> list[int | BaseException]:
        calls.append(items)
        await asyncio.sleep(0.01)
        if fail.is_set() and len(calls) == 2:
            raise ConnectionError("gone")
        return list(items)

    c: Coalescer[int, int] = Coalescer(send, "test")
    fail.set()
    first = asyncio.ensure_future(c.submit(1))
    await asyncio.sleep(0)
    batch = [asyncio.ensure_future(c.submit(i)) for i in (2, 3)]
    await asyncio.sleep(0.015)
    later = asyncio.ensure_future(c.submit(4))  # during the failing batch
    assert await first == 1
    for fut in batch:
        with pytest.raises(ConnectionError):
            await fut
    assert await asyncio.wait_for(later, 2) == 4


async def test_a_send_that_answers_the_wrong_number_of_calls_fails_them_instead_of_hanging() -> None:
    async def send(items: list[int]) -> list[int | BaseException]:
        await asyncio.sleep(0.01)
        return [1]  # one outcome whatever the batch

    c: Coalescer[int, int] = Coalescer(send, "broken")
    first = asyncio.ensure_future(c.submit(1))
    await asyncio.sleep(0)
    batch = [asyncio.ensure_future(c.submit(i)) for i in (2, 3)]
    results = await asyncio.wait_for(asyncio.gather(first, *batch, return_exceptions=True), 2)
    assert results[0] == 1
    assert all(isinstance(r, RuntimeError) and "1 outcomes for 2 calls" in str(r) for r in results[1:])
