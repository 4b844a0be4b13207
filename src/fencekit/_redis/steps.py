"""Redis work written once as I/O-free *steps*, driven by a synchronous or an asyncio client.

A steps generator yields a :class:`Batch` -- the commands (:class:`Cmd`) and
script calls (:class:`~fencekit._redis.scripts.Call`) to send in one round
trip -- and is sent their replies; its return value is the outcome. When a
batch fails (a connection error, or an error reply when the batch does not
want errors in their slots) the exception is thrown into the generator at
its ``yield``, so a ``finally`` there sees it. :func:`drive` runs steps on a
``redis.Redis``, :func:`adrive` on a ``redis.asyncio.Redis``: the queue's
rules (``fencekit.queue.inspect``, ``results``, ``registry``, ``enqueue``)
are written once for ``Client`` and ``SyncClient``, as ``fencekit.integrations.sql._run``
does for SQL.

One batch is run by :func:`batch_steps` over a raw executor (one pipeline,
or the bare command when the batch holds one op; on a Redis Cluster client,
one per node: :mod:`fencekit._redis.cluster.batches`): a script missing on the
server (``NOSCRIPT``, so it did not run) is loaded and only the missing calls
run again, in one more round trip (after the rest of their batch); errors are
translated (:func:`~fencekit._redis.run.translate_error`); nothing is re-sent
otherwise (invariant I4). A :class:`Cmd` names a redis-py method, the same on
both clients, so replies get redis-py's usual parsing on either side.

A steps generator may also yield a :class:`Sleep` (a pause between attempts,
as a blocking lock acquire makes), which :func:`drive` answers with
``time.sleep`` and :func:`adrive` with ``asyncio.sleep``, or requests of its
own (a caller's enqueue batch, a wait for a result): :func:`drive` and
:func:`adrive` take a ``runner`` for those.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from typing import Any, NamedTuple, TypeAlias, TypeVar, cast

import redis
import redis.asyncio
from redis.exceptions import NoScriptError, ResponseError

from fencekit._redis.run import Durability, TryAgain, translate_error, translated
from fencekit._redis.scripts import Call

__all__ = [
    "Batch",
    "Cmd",
    "Op",
    "Sleep",
    "Steps",
    "adrive",
    "aexecute_ops",
    "apipeline",
    "arun_batch",
    "batch_steps",
    "cmd",
    "drive",
    "execute_ops",
    "register_executors",
    "run_batch",
]

T = TypeVar("T")

_NO_KWARGS: Mapping[str, Any] = {}


class Cmd(NamedTuple):
    """One command: a redis-py method name (of ``Redis`` and of its pipeline), its arguments."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = _NO_KWARGS


def cmd(method: str, *args: Any, **kwargs: Any) -> Cmd:
    """``Cmd(method, args, kwargs)``, spelled as the call it stands for."""
    return Cmd(method, args, kwargs or _NO_KWARGS)


Op: TypeAlias = Cmd | Call


class Batch(NamedTuple):
    """Ops sent in one round trip.

    ``slots``: each op's error reply comes back (translated) in its slot;
    otherwise the first one is raised. ``wait``: a ``WAIT`` follows the ops
    and its reply is appended.
    """

    ops: Sequence[Op]
    slots: bool = False
    wait: Durability | None = None


class Sleep(NamedTuple):
    """A request: pause ``seconds``; answered ``None``.

    :func:`drive` sleeps with ``time.sleep``, :func:`adrive` with ``asyncio.sleep``,
    so a rule that waits between attempts is written once for both.
    """

    seconds: float


Steps: TypeAlias = Generator[Any, Any, T]
"""Yields :class:`Batch` or :class:`Sleep` (or a request its runner knows), is sent the answers, returns T."""


def batch_steps(batch: Batch) -> Generator[list[Op], list[Any], list[Any]]:
    """Run ``batch``: the raw executor is sent op lists and answers raw replies (errors in slots)."""
    ops = list(batch.ops)
    extra: list[Op] = [Cmd("execute_command", batch.wait.command())] if batch.wait is not None else []
    raw = list((yield ops + extra))
    missing = [i for i, op in enumerate(ops) if isinstance(op, Call) and isinstance(raw[i], NoScriptError)]
    if missing:
        sources = {c.script.sha: c.script.source for c in (cast(Call, ops[i]) for i in missing)}
        loads: list[Op] = [cmd("script_load", source) for source in sources.values()]
        again = list((yield loads + [ops[i] for i in missing] + extra))
        for reply in again[: len(loads)]:
            if isinstance(reply, BaseException):
                raise translate_error(reply)
        again = again[len(loads) :]
        for i, reply in zip(missing, again):
            # still missing right after its load: a failover moved the slot to a node that had
            # not loaded it (the load went to the old primary); it did not run, try again later
            raw[i] = (
                TryAgain("script not loaded on the node yet (a failover?)")
                if isinstance(reply, NoScriptError)
                else reply
            )
        if extra:
            raw[-1] = again[-1]
    replies = [translate_error(r) if isinstance(r, BaseException) else r for r in raw]
    if not batch.slots:
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
    return replies


def _queue(target: Any, op: Op) -> Any:
    """Issue ``op`` on a client or pipeline (either kind): what its method returns."""
    if isinstance(op, Call):
        return target.evalsha(op.script.sha, len(op.keys), *op.keys, *op.args)
    return getattr(target, op.method)(*op.args, **op.kwargs)


def execute_ops(client: redis.Redis, ops: list[Op]) -> list[Any]:
    """The raw executor on one plain client: one pipeline (the bare command for one op), errors in slots."""
    if len(ops) == 1:
        try:
            return [_queue(client, ops[0])]
        except ResponseError as exc:
            return [exc]
    pipe = client.pipeline(transaction=False)
    for op in ops:
        _queue(pipe, op)
    return list(pipe.execute(raise_on_error=False))


async def aexecute_ops(client: redis.asyncio.Redis, ops: list[Op]) -> list[Any]:
    """:func:`execute_ops` on an asyncio client."""
    if len(ops) == 1:
        try:
            return [await _queue(client, ops[0])]
        except ResponseError as exc:
            return [exc]
    pipe = client.pipeline(transaction=False)
    for op in ops:
        _queue(pipe, op)
    return list(await pipe.execute(raise_on_error=False))


Execute: TypeAlias = Callable[[Any, list[Op]], list[Any]]
AsyncExecute: TypeAlias = Callable[[Any, list[Op]], Awaitable[list[Any]]]

_EXECUTORS: dict[type, Execute] = {}
_ASYNC_EXECUTORS: dict[type, AsyncExecute] = {}
"""Executors of client classes that a plain pipeline does not serve (redis-py's cluster clients).

A specialisation registers itself here (:func:`register_executors`, called by
``fencekit._redis.cluster.batches`` when it is imported, which ``fencekit._redis.clients``
does), so this generic layer never imports the layer built on it.
"""


def register_executors(sync_type: type, execute: Execute, async_type: type, aexecute: AsyncExecute) -> None:
    """Run the batches of clients of ``sync_type``/``async_type`` with ``execute``/``aexecute``."""
    _EXECUTORS[sync_type] = execute
    _ASYNC_EXECUTORS[async_type] = aexecute


def _executor(table: dict[type, Any], client: object, default: Any) -> Any:
    if table:
        for cls in type(client).__mro__:
            found = table.get(cls)
            if found is not None:
                return found
    return default


def run_batch(client: redis.Redis | redis.RedisCluster, batch: Batch) -> list[Any]:
    """The replies of ``batch`` run on a synchronous client (see :func:`batch_steps`)."""
    execute: Execute = _executor(_EXECUTORS, client, execute_ops)
    steps = batch_steps(batch)
    with translated():
        try:
            ops = next(steps)
            while True:
                ops = steps.send(execute(client, ops))
        except StopIteration as done:
            return cast("list[Any]", done.value)


async def arun_batch(client: redis.asyncio.Redis | redis.asyncio.RedisCluster, batch: Batch) -> list[Any]:
    """The replies of ``batch`` run on an asyncio client (see :func:`batch_steps`)."""
    execute: AsyncExecute = _executor(_ASYNC_EXECUTORS, client, aexecute_ops)
    steps = batch_steps(batch)
    with translated():
        try:
            ops = next(steps)
            while True:
                ops = steps.send(await execute(client, ops))
        except StopIteration as done:
            return cast("list[Any]", done.value)


async def apipeline(
    client: redis.asyncio.Redis, calls: Sequence[Call], *, wait: Durability | None = None
) -> list[Any]:
    """Run script ``calls`` in one round trip on an asyncio client.

    Scripts missing on the server are loaded once and only their calls run
    again (they did not run). A call's own error reply comes back translated
    in its slot; a connection failure raises :class:`StoreError`. With
    ``wait`` a ``WAIT`` follows the calls in the same round trip and its reply
    -- how many replicas confirmed -- is appended to the results. The rule is
    :func:`fencekit._redis.steps.batch_steps`.
    """
    return await arun_batch(client, Batch(calls, slots=True, wait=wait))


def drive(
    client: redis.Redis | redis.RedisCluster, steps: Steps[T], runner: Callable[[Any], Any] | None = None
) -> T:
    """Run ``steps`` on a synchronous client (``runner``, when given, answers every request)."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            request = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as done:
            return cast(T, done.value)
        error = None
        try:
            if runner is not None:
                reply = runner(request)
            elif isinstance(request, Batch):
                reply = run_batch(client, request)
            elif isinstance(request, Sleep):
                time.sleep(request.seconds)
                reply = None
            else:
                raise TypeError(f"no runner for {request!r}")
        except BaseException as exc:  # thrown into the steps, whose finally sees it
            error, reply = exc, None


async def adrive(
    client: redis.asyncio.Redis | redis.asyncio.RedisCluster,
    steps: Steps[T],
    runner: Callable[[Any], Awaitable[Any]] | None = None,
) -> T:
    """Run ``steps`` on an asyncio client (``runner``, when given, answers every request)."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            request = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as done:
            return cast(T, done.value)
        error = None
        try:
            if runner is not None:
                reply = await runner(request)
            elif isinstance(request, Batch):
                reply = await arun_batch(client, request)
            elif isinstance(request, Sleep):
                await asyncio.sleep(request.seconds)
                reply = None
            else:
                raise TypeError(f"no runner for {request!r}")
        except BaseException as exc:
            error, reply = exc, None
