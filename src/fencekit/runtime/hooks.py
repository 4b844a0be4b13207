"""The one contract of startup and shutdown hooks, for ``Server`` and the pool alike.

A hook is an ``async def`` taking no argument (the seed's form) or one: the
process's :class:`~fencekit.Client`, on the same connection as its jobs, so
a hook can enqueue or inspect queues without opening a client of its own::

    @server.on_startup
    async def init_db() -> None: ...

    async def seed(client: fencekit.Client) -> None:
        await client.enqueue(Task("demo", "produce"))

Where they run:

- ``on_startup`` / ``on_shutdown`` run in every process that runs jobs -- the
  ``Server``, each pool child -- after Redis is verified and before its
  consumer claims, and after the consumer stopped and before Redis is
  closed. Resources the jobs share (a database pool) belong here.
- ``App(on_pool_startup=..., on_pool_shutdown=...)`` run once per pool, in
  the supervisor, before the children start and after they stopped (a
  ``Server`` is its own pool: it runs them around its ``on_startup`` hooks).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from fencekit.errors import ConfigError

if TYPE_CHECKING:
    from fencekit.produce.client import Client

__all__ = ["Hook", "check_hook", "run_hooks"]

Hook = Callable[[], Awaitable[Any]] | Callable[["Client"], Awaitable[Any]]
H = TypeVar("H", bound=Callable[..., Awaitable[Any]])


def _required(hook: Callable[..., Any]) -> list[inspect.Parameter]:
    """The parameters of ``hook`` that a call must fill."""
    try:
        parameters = inspect.signature(hook).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: call it bare
        return []
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p for p in parameters if p.default is p.empty and p.kind not in variadic]


def check_hook(hook: H, what: str) -> H:
    """``hook`` if it is an async function of no argument or of the client, else ConfigError."""
    checked = hook
    if not callable(hook) or not inspect.iscoroutinefunction(hook):
        raise ConfigError(f"{what} takes an async function, got {hook!r}")
    required = _required(hook)
    if len(required) > 1 or any(p.kind is p.KEYWORD_ONLY for p in required):
        name = getattr(hook, "__qualname__", repr(hook))
        raise ConfigError(f"{what} hook {name} must take no argument, or one: the Client")
    return checked


async def run_hooks(hooks: Iterable[Hook], client: Client) -> None:
    """Run ``hooks`` in order, each given ``client`` if it takes an argument."""
    for hook in hooks:
        if _required(hook):
            await cast(Callable[["Client"], Awaitable[Any]], hook)(client)
        else:
            await cast(Callable[[], Awaitable[Any]], hook)()
