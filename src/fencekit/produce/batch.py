"""The ``Batch`` handle: many tasks, then callbacks that run exactly once.

``await client.batch(tasks, on_complete=..., on_success=..., on_failure=...)``
opens a batch, enqueues its children and arms it; ``async with
client.batch(...) as b:`` leaves it open for :meth:`Batch.add` (and nested
batches, :meth:`Batch.batch`) until the block ends. Each method drives one
steps function of :mod:`fencekit.produce._batch_steps` on the client's
connection; :class:`SyncBatch` drives the same ones for ``SyncClient``. The
guarantees and the protocol: ``docs/guides/batches.md``, ``docs/design/batches.md``.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from fencekit._redis.steps import drive
from fencekit.errors import ConfigError
from fencekit.jobs.batches import BatchInfo
from fencekit.jobs.task import Task
from fencekit.produce import _batch_steps as steps

if TYPE_CHECKING:
    from fencekit.produce.client import Client
    from fencekit.produce.sync_client import SyncClient

__all__ = ["Batch", "BatchInfo", "BatchOpening", "Chain", "SyncBatch"]


class Batch:
    """A batch of tasks (get one from ``client.batch``); ``bid`` is its id."""

    def __init__(self, client: Client, bid: str, jids: list[str], *, open: bool) -> None:
        self._client = client
        self.bid = bid
        self.jids = jids
        """The jids of the children enqueued through this handle, in order."""
        self._open = open

    def __repr__(self) -> str:
        return f"Batch(bid={self.bid!r}, children={len(self.jids)}, open={self._open})"

    async def add(self, *tasks: Task | Iterable[Task]) -> list[str]:
        """Enqueue more children (tasks, or iterables of them) into this open batch; their jids."""
        if not self._open:
            raise ConfigError(
                f"batch {self.bid} is armed: add children inside `async with client.batch(...)`"
            )
        flat = _flatten(tasks)
        jids = await self._client._drive_enqueuing(steps.add_steps(self._client, self.bid, flat))
        self.jids.extend(jids)
        return jids

    def batch(
        self,
        tasks: Iterable[Task] = (),
        *,
        on_complete: Task | None = None,
        on_success: Task | None = None,
        on_failure: Task | None = None,
        keep: float | None = None,
    ) -> BatchOpening:
        """A nested batch, a child of this open one: counted here once its own callbacks were
        enqueued (succeeded when all its children did, failed when any failed for good)."""
        if not self._open:
            raise ConfigError(
                f"batch {self.bid} is armed: nest batches inside `async with client.batch(...)`"
            )
        callbacks = {"complete": on_complete, "success": on_success, "failure": on_failure}
        return BatchOpening(self._client, list(tasks), callbacks, parent=self.bid, keep=keep)

    async def info(self) -> BatchInfo:
        """Where the batch is now (:class:`~fencekit.jobs.batches.BatchInfo`)."""
        info = await self._client.batch_info(self.bid)
        if info is None:
            raise ConfigError(f"batch {self.bid} does not exist (or it finished longer ago than it is kept)")
        return info

    async def wait(self, timeout: float | None = None) -> BatchInfo:
        """Wait until every child is final and the callbacks are enqueued; the final
        :class:`BatchInfo`. ``TimeoutError`` after ``timeout`` seconds."""
        return await self._client._drive(steps.wait_steps(self._client.keys, self.bid, timeout))

    async def cancel(self) -> int:
        """Cancel every child not final yet (running ones too), and arm the batch: it completes
        with them cancelled (``on_complete`` runs; ``on_success`` does not). Returns how many
        children this cancelled."""
        self._open = False
        keep = self._client.settings["keep_finished"]
        return await self._client._drive(steps.cancel_steps(self._client.keys, self.bid, keep))

    async def results(self) -> dict[str, Any]:
        """:meth:`Client.batch_results <fencekit.produce.client.Client.batch_results>` of this batch."""
        return await self._client.batch_results(self.bid)

    async def _arm(self) -> None:
        self._open = False
        await self._client._drive(steps.arm_steps(self._client.keys, self.bid))


class BatchOpening:
    """What ``client.batch(...)`` returns: await it for an armed :class:`Batch`, or use it as
    ``async with`` for an open one that is armed when the block ends."""

    def __init__(
        self,
        client: Client,
        tasks: list[Task],
        callbacks: Mapping[str, Task | None],
        *,
        parent: str | None = None,
        keep: float | None = None,
    ) -> None:
        self._client = client
        self._tasks = tasks
        self._callbacks = callbacks
        self._parent = parent
        self._keep = keep
        self._batch: Batch | None = None

    async def _open(self) -> Batch:
        client = self._client
        bid = await client._drive(
            steps.begin_steps(client, self._callbacks, parent=self._parent, keep=self._keep)
        )
        batch = Batch(client, bid, [], open=True)
        try:
            if self._tasks:
                await batch.add(self._tasks)
        except BaseException:
            await _quietly(client, batch.cancel())
            raise
        return batch

    async def _armed(self) -> Batch:
        batch = await self._open()
        await batch._arm()
        return batch

    def __await__(self) -> Generator[Any, None, Batch]:
        return self._armed().__await__()

    async def __aenter__(self) -> Batch:
        self._batch = await self._open()
        return self._batch

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._batch is not None
        if exc is not None:  # the block failed: what it added is cancelled, the batch completes
            await _quietly(self._client, self._batch.cancel())
            return
        await self._batch._arm()


class Chain:
    """Tasks that run one after the other (get one from ``client.chain``)."""

    def __init__(self, client: Client, jids: list[str], queues: list[str]) -> None:
        self._client = client
        self.jids = jids
        """The links' jids, first to last."""
        self._queues = queues

    def __repr__(self) -> str:
        return f"Chain(jids={self.jids!r})"

    async def result(self, timeout: float | None = None) -> Any:
        """The last link's result (its errors: ``JobFailed``, ``JobCancelled`` naming the parent)."""
        return await self._client.result(self.jids[-1], timeout=timeout, queue=self._queues[-1])

    async def cancel(self) -> int:
        """Cancel every link not finished yet; how many this cancelled."""
        cancelled = 0
        for jid, queue in zip(self.jids, self._queues, strict=True):
            cancelled += await self._client.cancel(jid, queue=queue)
        return cancelled


class SyncBatch:
    """:class:`Batch` for ``SyncClient``: the same steps, run synchronously."""

    def __init__(self, client: SyncClient, bid: str, jids: list[str]) -> None:
        self._client = client
        self.bid = bid
        self.jids = jids

    def __repr__(self) -> str:
        return f"SyncBatch(bid={self.bid!r}, children={len(self.jids)})"

    def info(self) -> BatchInfo:
        info = self._client.batch_info(self.bid)
        if info is None:
            raise ConfigError(f"batch {self.bid} does not exist (or it finished longer ago than it is kept)")
        return info

    def wait(self, timeout: float | None = None) -> BatchInfo:
        return drive(self._client.redis, steps.wait_steps(self._client.keys, self.bid, timeout))

    def cancel(self) -> int:
        keep = self._client.settings["keep_finished"]
        return drive(self._client.redis, steps.cancel_steps(self._client.keys, self.bid, keep))

    def results(self) -> dict[str, Any]:
        return self._client.batch_results(self.bid)


def _flatten(items: tuple[Task | Iterable[Task], ...]) -> list[Task]:
    out: list[Task] = []
    for item in items:
        if isinstance(item, Task):
            out.append(item)
        else:
            out.extend(item)
    return out


async def _quietly(client: Client, cancelling: Any) -> None:
    """Cancel a batch whose building failed; a failure here is logged (the first error is raised)."""
    try:
        await cancelling
    except Exception as exc:
        client.logger.warning("cancelling a batch whose building failed, failed too: %s", exc)
