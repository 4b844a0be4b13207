"""Following a Sentinel-managed master: leave a demoted master at once.

A connection asks the sentinels where the master is when it is opened, and
nothing more: when ``SENTINEL FAILOVER`` promotes a replica, the old master
keeps accepting writes until the sentinels reconfigure it as a replica --
about ten seconds later, their INFO period -- and then discards everything
written in that window. A process that trusted its existing connections lost
ten seconds of acknowledged work that way.

So every process that talks to a Sentinel-managed master runs a
:class:`MasterWatch`: it subscribes to every sentinel's announcements and
re-reads the master from all of them every :data:`POLL_INTERVAL` (at once
after a subscription drops, and every :data:`DEGRADED_POLL_INTERVAL` for
:data:`DEGRADED_FOR` seconds after: an announcement missed while connections
drop is then seen within that; a sentinel that is down, whose subscription
never comes up, announces nothing and changes nothing), and tells its
listeners:

- **suspend** when a sentinel starts promoting a replica
  (``+failover-state-send-slaveof-noone``, or a poll that sees
  ``failover_in_progress``): from then on a write to the old master may be
  thrown away, so every connection to it is dropped and new ones are refused
  (:class:`~fencekit.errors.StoreError`, as during any outage) until
- **switch** (``+switch-master``, or a poll that finds a newer config epoch
  naming another address): connections to anything but the new master are
  dropped, and new ones go to it; or
- **resume** when the failover was aborted (``-failover-abort-*``) or its
  ``failover-timeout`` ran out without a switch.

The master is the address named with the highest config epoch among the
sentinels that answer, so one sentinel that lags behind cannot send a new
connection back to the old master. :class:`MasterView` holds those rules
without I/O; the watch only feeds it. A command in flight on a dropped
connection fails with :class:`~fencekit.errors.StoreError` and is never sent
again (invariant I4).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from fencekit._aio.closing import aclose_all
from fencekit._aio.scope import TaskScope
from fencekit._redis.url import RedisTarget
from fencekit.errors import StoreError

__all__ = [
    "DEGRADED_FOR",
    "DEGRADED_POLL_INTERVAL",
    "POLL_INTERVAL",
    "Address",
    "Change",
    "MasterView",
    "MasterWatch",
    "ask_sentinels",
]

POLL_INTERVAL = 1.0
DEGRADED_POLL_INTERVAL = 0.1  # after a subscription that was up dropped ...
DEGRADED_FOR = 5.0  # ... for this many seconds
DEFAULT_FAILOVER_TIMEOUT = 180.0  # Sentinel's own default, in seconds
_CHANNELS = ("+switch-master", "+failover-state-send-slaveof-noone", "-failover-abort-*")

Address = tuple[str, int]

log = logging.getLogger("fencekit.sentinel")


@dataclass(frozen=True, slots=True)
class Change:
    """What a listener is told: ``kind`` is ``"suspend"``, ``"switch"`` or ``"resume"``."""

    kind: str
    old: Address | None
    new: Address | None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _fields(reply: Any) -> dict[str, str]:
    """A ``SENTINEL MASTER`` reply (a dict, or a flat list of pairs) as text fields."""
    if isinstance(reply, Mapping):
        return {_text(k): _text(v) for k, v in reply.items()}
    items = list(reply or ())
    return {_text(items[i]): _text(items[i + 1]) for i in range(0, len(items) - 1, 2)}


class MasterView:
    """Where the master is and whether writing to it is safe, from announcements and polls (no I/O)."""

    def __init__(self, master_name: str) -> None:
        self.master_name = master_name
        self.address: Address | None = None
        self.epoch = -1
        self._suspended_at: float | None = None
        self._failover_timeout = DEFAULT_FAILOVER_TIMEOUT

    def suspended(self, now: float | None = None) -> bool:
        """True while a failover is under way (and has not outlived its timeout)."""
        if self._suspended_at is None:
            return False
        if (time.monotonic() if now is None else now) - self._suspended_at > self._failover_timeout:
            self._suspended_at = None
            return False
        return True

    def event(self, channel: str, data: str, now: float) -> Change | None:
        """A sentinel's announcement on ``channel``; the change it makes, if any."""
        words = data.split()
        if channel == "+switch-master":
            # "<name> <old ip> <old port> <new ip> <new port>"
            if len(words) == 5 and words[0] == self.master_name and words[4].isdigit():
                return self._switch((words[3], int(words[4])), None)
            return None
        if words[-3:-2] == [self.master_name] or (len(words) > 1 and words[1] == self.master_name):
            if channel == "+failover-state-send-slaveof-noone":
                return self._suspend(now)
            if channel.startswith("-failover-abort"):
                return self._resume()
        return None

    def poll(self, replies: Iterable[Any], now: float, *, everyone: bool = False) -> Change | None:
        """The ``SENTINEL MASTER`` replies of the sentinels that answered; the change they make.

        ``everyone``: every sentinel answered, so a failover none of them
        reports is over (the leader is among them): a suspension ends.
        """
        best: tuple[int, Address] | None = None
        in_progress = False
        for reply in replies:
            fields = _fields(reply)
            try:
                epoch = int(fields.get("config-epoch", "0"))
                address = (fields["ip"], int(fields["port"]))
            except (KeyError, ValueError):
                continue
            if "failover-timeout" in fields and fields["failover-timeout"].isdigit():
                self._failover_timeout = max(1.0, int(fields["failover-timeout"]) / 1000)
            in_progress = in_progress or "failover_in_progress" in fields.get("flags", "")
            if best is None or epoch > best[0]:
                best = (epoch, address)
        if best is None:
            return None
        change = self._switch(best[1], best[0])
        if change is not None:
            return change
        if in_progress:
            return self._suspend(now)
        if everyone:
            return self._resume()
        return None

    def _switch(self, address: Address, epoch: int | None) -> Change | None:
        if epoch is not None:
            if epoch < self.epoch:
                return None
            self.epoch = epoch
        old = self.address
        self.address = address
        if old is None or old == address:
            return None  # the first reading, or the same master: nothing to tell
        self._suspended_at = None
        return Change("switch", old, address)

    def _suspend(self, now: float) -> Change | None:
        if self._suspended_at is not None:
            return None
        self._suspended_at = now
        return Change("suspend", self.address, None)

    def _resume(self) -> Change | None:
        if self._suspended_at is None:
            return None
        self._suspended_at = None
        return Change("resume", self.address, self.address)


def _sentinel_client(target: RedisTarget, host: str, port: int) -> redis.asyncio.Redis:
    return redis.asyncio.Redis(host=host, port=port, **target.sentinel_kwargs(aio=True))


async def ask_sentinels(target: RedisTarget, clients: Iterable[redis.asyncio.Redis]) -> list[Any]:
    """``SENTINEL MASTER <name>`` of every sentinel that answers (one round trip to each, in parallel)."""
    assert target.master_name is not None

    command = ("SENTINEL", "MASTER", target.master_name)

    async def ask(client: redis.asyncio.Redis) -> Any:
        try:
            return await client.execute_command(*command)  # type: ignore[no-untyped-call]
        except (RedisConnectionError, ConnectionError):
            # the sentinel dropped an idle connection: a read, so asked again on a new one
            return await client.execute_command(*command)  # type: ignore[no-untyped-call]

    replies = await asyncio.gather(*(ask(c) for c in clients), return_exceptions=True)
    return [r for r in replies if not isinstance(r, BaseException)]


async def newest_master(target: RedisTarget) -> Address:
    """The master named with the highest config epoch by the sentinels that answer; StoreError if none."""
    clients = [_sentinel_client(target, h, p) for h, p in target.sentinels]
    try:
        replies = await ask_sentinels(target, clients)
    finally:
        await aclose_all(*clients)
    view = MasterView(target.master_name or "")
    view.poll(replies, time.monotonic())
    if view.address is None:
        raise StoreError(f"no sentinel of {target.redacted()} knows master {target.master_name!r}")
    return view.address


Listener = Callable[[Change], None]


class MasterWatch:
    """Keeps a :class:`MasterView` current for one process (see the module docstring).

    :meth:`start` reads the master once (StoreError when no sentinel knows
    it), then subscriptions and polls run, as tasks of the watch's
    :class:`~fencekit._aio.scope.TaskScope`, until :meth:`aclose`. Listeners
    are called in the event loop, synchronously, for every change.
    """

    def __init__(self, target: RedisTarget, *, poll_interval: float = POLL_INTERVAL) -> None:
        if not target.is_sentinel or target.master_name is None:
            raise ValueError("MasterWatch needs a redis+sentinel:// target")
        self.target = target
        self.view = MasterView(target.master_name)
        self.poll_interval = poll_interval
        self._listeners: list[Listener] = []
        self._scope = TaskScope(f"sentinel watch of {target.master_name!r}", logger=log)
        self._tasks: list[asyncio.Task[None]] = []
        self._poll_now = asyncio.Event()
        self._starting = asyncio.Lock()
        self._pollers: list[redis.asyncio.Redis] = []
        self._dropped_at = float("-inf")  # when a subscription that was up last dropped
        self.polls = 0  # polls made (a figure for tests and diagnostics)

    def degraded(self) -> bool:
        """True for :data:`DEGRADED_FOR` s after a subscription that was up dropped (it polls faster)."""
        return time.monotonic() - self._dropped_at < DEGRADED_FOR

    @property
    def address(self) -> Address | None:
        return self.view.address

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def forget(self, listener: Listener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def writable(self) -> Address:
        """The master to connect to now; StoreError while a failover is under way."""
        if self.view.suspended():
            raise StoreError(
                f"a failover of master {self.target.master_name!r} is under way: "
                "not writing to the old master (its writes would be discarded)"
            )
        if self.view.address is None:
            raise StoreError(f"no sentinel has named master {self.target.master_name!r} yet")
        return self.view.address

    async def start(self) -> None:
        """Read the master once, then follow it; idempotent (StoreError when no sentinel knows it)."""
        async with self._starting:
            if not self._tasks:
                await self._start()

    async def _start(self) -> None:
        self._pollers = [_sentinel_client(self.target, h, p) for h, p in self.target.sentinels]
        await self._poll_once()
        if self.view.address is None:
            await self._close_pollers()
            raise StoreError(
                f"no sentinel of {self.target.redacted()} knows master {self.target.master_name!r}"
            )
        self._tasks = [self._scope.start(self._poll_loop(), name="fencekit-sentinel-poll")]
        for host, port in self.target.sentinels:
            self._tasks.append(
                self._scope.start(self._subscribe(host, port), name=f"fencekit-sentinel-{host}:{port}")
            )

    async def aclose(self) -> None:
        try:
            await self._scope.aclose()
        finally:
            self._tasks = []
            await self._close_pollers()

    async def _close_pollers(self) -> None:
        pollers, self._pollers = self._pollers, []
        await aclose_all(*pollers)

    def _tell(self, change: Change | None) -> None:
        if change is None:
            return
        log.warning(
            "sentinel master %r: %s (%s -> %s)", self.target.master_name, change.kind, change.old, change.new
        )
        for listener in list(self._listeners):
            try:
                listener(change)
            except Exception:
                log.exception("a listener of master %r failed", self.target.master_name)

    async def _poll_once(self) -> None:
        replies = await ask_sentinels(self.target, self._pollers)
        self.polls += 1
        everyone = len(replies) == len(self._pollers)
        self._tell(self.view.poll(replies, time.monotonic(), everyone=everyone))

    async def _poll_loop(self) -> None:
        while True:
            interval = self.poll_interval
            if self.degraded():
                interval = min(interval, DEGRADED_POLL_INTERVAL)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._poll_now.wait(), interval)
            self._poll_now.clear()
            try:
                await self._poll_once()
            except Exception:
                log.exception("polling the sentinels of %r failed", self.target.master_name)

    async def _subscribe(self, host: str, port: int) -> None:
        """Follow one sentinel's announcements; after a dropped subscription, poll at once."""
        delay = 0.1
        while True:
            client = _sentinel_client(self.target, host, port)
            pubsub = client.pubsub()
            up = False
            try:
                await pubsub.psubscribe(*_CHANNELS)
                up = True
                delay = 0.1
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
                    if message is not None and message.get("type") == "pmessage":
                        channel, data = _text(message["channel"]), _text(message["data"])
                        self._tell(self.view.event(channel, data, time.monotonic()))
            except (RedisError, OSError):
                self._poll_now.set()  # announcements may have been missed while it was down
            except Exception as exc:  # e.g. a RuntimeError of a transport closed under the call
                log.warning("sentinel %s:%s: subscription failed, again in %.1fs: %r", host, port, delay, exc)
                self._poll_now.set()
            finally:
                if up:
                    self._dropped_at = time.monotonic()
                await aclose_all(pubsub, client)
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)
