"""The hot-path connection interface, and its redis-py implementation.

A consumer speaks to Redis through a :class:`Link`: script calls, pipelines of
script calls, and single commands (``BLPOP`` for wake-ups). The production
link is :class:`fencekit._redis.hotpath.LeanConnection` (Cython-compiled RESP encoder +
hiredis parser); :class:`RedisPyLink` does the same over redis-py, for the
benchmarks that compare the two and as a reference in tests.

Both follow one contract: a connection-level failure raises
:class:`~fencekit.errors.StoreError` and closes the link (nothing is re-sent);
in a pipeline, a script's own error reply is returned in its slot as an
exception (already translated), not raised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import redis.asyncio
from redis.exceptions import RedisError

from fencekit._redis.clients import aclose_client, async_client
from fencekit._redis.run import Durability, translate_error
from fencekit._redis.scripts import Call
from fencekit._redis.sentinel import MasterWatch
from fencekit._redis.steps import apipeline
from fencekit._redis.url import RedisTarget
from fencekit.errors import ConfigError, StoreError


class Link(Protocol):
    """What the consumer needs from a connection (see the module docstring)."""

    @property
    def closed(self) -> bool: ...

    async def call(self, call: Call) -> Any: ...

    async def pipeline(self, calls: Sequence[Call]) -> list[Any]: ...

    async def execute(self, *args: Any, timeout: float | None = None) -> Any: ...

    async def block_then(
        self, command: Sequence[Any], calls: Sequence[Call], timeout: float
    ) -> tuple[Any, list[Any]]: ...

    async def aclose(self) -> None: ...


async def open_link(
    target: RedisTarget, *, name: str | None = None, kind: str = "lean", watch: MasterWatch | None = None
) -> Link:
    """Open a link of ``kind`` ``"lean"`` (default) or ``"redis-py"``.

    On a ``redis+cluster://`` target the lean kind is a
    :class:`~fencekit._redis.cluster.link.ClusterLink` (a lean connection per
    primary, routed by slot); the redis-py kind is redis-py's cluster client.

    ``watch``: the owner's master watch (Sentinel), so the link leaves a
    demoted master at once (a redis-py link follows its own client's watch).
    """
    if kind == "lean" and target.is_cluster:
        from fencekit._redis.cluster.link import ClusterLink

        return await ClusterLink.open(target, name=name)
    if kind == "lean":
        from fencekit._redis.hotpath import LeanConnection

        return await LeanConnection.open(target, name=name, watch=watch)
    if kind == "redis-py":
        return await RedisPyLink.open(target, name=name)
    raise ConfigError(f"unknown link kind {kind!r} (lean or redis-py)")


class RedisPyLink:
    """A :class:`Link` over one redis-py asyncio connection pool of size 1."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._client = client
        self._closed = False

    @classmethod
    async def open(cls, target: RedisTarget, *, name: str | None = None) -> RedisPyLink:
        client = async_client(target, client_name=name, max_connections=4)
        link = cls(client)
        await link.execute("PING")
        return link

    @property
    def closed(self) -> bool:
        return self._closed

    def _broken(self, exc: BaseException) -> StoreError:
        self._closed = True
        mapped = translate_error(exc)
        return mapped if isinstance(mapped, StoreError) else StoreError(str(exc))

    async def call(self, call: Call) -> Any:
        (result,) = await self.pipeline((call,))
        if isinstance(result, BaseException):
            raise result
        return result

    async def pipeline(self, calls: Sequence[Call]) -> list[Any]:
        try:
            return await apipeline(self._client, calls)
        except StoreError:
            self._closed = True
            raise

    async def execute(self, *args: Any, timeout: float | None = None) -> Any:
        try:
            return await self._client.execute_command(*args)  # type: ignore[no-untyped-call]
        except (RedisError, OSError) as exc:
            raise self._broken(exc) from exc

    async def block_then(
        self, command: Sequence[Any], calls: Sequence[Call], timeout: float
    ) -> tuple[Any, list[Any]]:
        """The blocking command, then the calls: the same replies as the lean link's, in two round trips."""
        first = await self.execute(*command, timeout=timeout)
        return first, await self.pipeline(calls)

    async def aclose(self) -> None:
        self._closed = True
        await aclose_client(self._client)


async def wait_replicas(link: Link, durability: Durability) -> int:
    """``WAIT`` on ``link`` after its writes; how many replicas confirmed them."""
    return int(await link.execute(*durability.command(), timeout=durability.reply_timeout))
