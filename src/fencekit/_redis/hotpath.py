"""The lean connection: the hot path's own Redis client (claim, ack, ack+claim).

redis-py spends ~150-230 µs of client CPU per round trip on command packing,
pooling, timeouts and hooks (docs/design/measurements.md). The consumer's
script calls do not need any of that, so they run over this small
:class:`asyncio.Protocol`: requests are framed by the RESP encoder
(:mod:`fencekit._redis.resp`, compiled when built) and replies parsed by
``hiredis.Reader``. Everything else (Sentinel discovery, admin, scheduler,
reaper) stays on redis-py.

Protocol
    RESP2 without ``HELLO``. Connection set-up sends ``AUTH``, ``SELECT``,
    ``CLIENT SETNAME`` and, behind Sentinel, ``ROLE`` in one write and checks
    every reply.

Concurrency
    Any number of tasks may use one connection at once. Each request appends a
    future to a FIFO deque in the same synchronous step as it queues its bytes,
    and replies, which Redis sends in request order, resolve the futures in
    turn. A caller that is cancelled leaves its future in the queue; its reply
    is read and dropped, so the stream stays in step.

Coalescing (auto-pipelining)
    A request on an idle connection (no reply awaited) is written at once.
    A request made while others are in flight is not written by itself: the
    bytes of every such request of one event-loop iteration go out in one
    write at the start of the next iteration (``call_soon``). Fifty jobs that
    each make a fenced write in one iteration cost one ``send`` here and one
    read in Redis instead of fifty, and each still gets its own reply or
    error.

Failure (I4 of docs/design.md: nothing is ever re-sent)
    A timeout, a lost connection, a protocol error or a ``READONLY`` reply
    (the master was demoted by a failover) closes the connection and fails
    every waiting request with :class:`~fencekit.errors.StoreError`. A failed
    request may or may not have run on the server; the owner decides what to
    do and opens a new connection (:attr:`LeanConnection.closed` tells).
    ``NOSCRIPT`` is not a failure: the script did not run, so it is loaded and
    the call made again.

Timeouts
    ``socket_timeout`` of the target bounds the wait for the reply at the head
    of the queue, counted from when it became the head or from the last bytes
    received, whichever is later (the same "no progress for that long"
    meaning as a socket read timeout). One timer per connection serves every
    request, so the hot path does not create a timer per call.
    :meth:`LeanConnection.execute` takes a per-call ``timeout`` for blocking
    commands such as ``BLPOP``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import hiredis

from fencekit._redis.clients import resolve_address
from fencekit._redis.resp import RespArg, pack_command, pack_commands, pack_evalsha
from fencekit._redis.run import is_bad_database, is_readonly, translate_reply
from fencekit._redis.scripts import Call, Script
from fencekit._redis.sentinel import Change, MasterWatch
from fencekit._redis.url import RedisTarget, parse_url
from fencekit._redis.wire import Wire
from fencekit.errors import ConfigError, FenceKitError, StoreError

__all__ = ["LeanConnection"]

_ReplyError = hiredis.ReplyError
_INF = math.inf


class LeanConnection(Wire):
    """One Redis connection for the hot path; open it with :meth:`open`.

    Not thread-safe; bound to the event loop that opened it. After it is
    :attr:`closed` (by the owner or by a failure) every request raises
    :class:`~fencekit.errors.StoreError`; open a new one.
    """

    __slots__ = ("_target", "_watch")

    def __init__(self, target: RedisTarget, loop: asyncio.AbstractEventLoop) -> None:
        """Internal: use :meth:`open`, which connects and sets the connection up."""
        super().__init__(loop, target.socket_timeout)
        self._target = target
        self._watch: MasterWatch | None = None

    # -- opening ---------------------------------------------------------

    @classmethod
    async def open(
        cls, target: RedisTarget | str, *, name: str | None = None, watch: MasterWatch | None = None
    ) -> LeanConnection:
        """Connect to ``target`` (asking the sentinels where the master is) and set up.

        ``name`` becomes the ``CLIENT SETNAME`` of the connection. Behind
        Sentinel, ``watch`` (the owner's :class:`~fencekit._redis.sentinel.MasterWatch`)
        names the master, and the connection closes itself the moment the
        watch reports that the master is moving. Raises
        :class:`~fencekit.errors.StoreError` when Redis cannot be reached, refuses
        the credentials or database, or (behind Sentinel) is not the master,
        or a failover is under way.
        """
        if isinstance(target, str):
            target = parse_url(target)
        if watch is not None:
            await watch.start()
            address: tuple[str, int] | str = watch.writable()
        else:
            address = await resolve_address(target)
        loop = asyncio.get_running_loop()
        conn = cls(target, loop)
        try:
            if isinstance(address, str):
                conn._address = address
                connecting = loop.create_unix_connection(lambda: conn, address)
            else:
                host, port = address
                conn._address = _joined(address)
                context = target.tls.context(target.redacted()) if target.tls is not None else None
                connecting = loop.create_connection(
                    lambda: conn,
                    host,
                    port,
                    ssl=context,
                    server_hostname=target.host if context is not None else None,
                )
            await asyncio.wait_for(connecting, target.socket_connect_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            conn.close()
            raise StoreError(
                f"cannot connect to Redis at {conn._address or target.redacted()}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        except BaseException:
            # Python < 3.12: a wait_for cancelled as the connection completes drops the transport it made.
            conn.close()
            raise
        try:
            await conn._set_up(name)
        except BaseException:
            conn.close()
            raise
        if watch is not None:
            conn._watch = watch
            watch.listen(conn._master_moved)
        return conn

    def _master_moved(self, change: Change) -> None:
        """The watch says the master is moving: leave this one now (its writes could be discarded)."""
        if change.kind == "resume":
            return
        if change.kind == "switch" and change.new is not None and self._address == _joined(change.new):
            return  # already on the new master
        self._abort(f"the sentinels are moving the master away from {self._address} ({change.kind})")

    async def _set_up(self, name: str | None) -> None:
        """AUTH, SELECT, CLIENT SETNAME and (Sentinel) ROLE in one round trip."""
        target = self._target
        steps = target.handshake(name)
        labels = [label for label, _ in steps]
        commands = [command for _, command in steps]
        if not commands:
            return
        timeout = self._timeout
        if timeout == _INF and target.socket_connect_timeout is not None:
            timeout = target.socket_connect_timeout
        replies = await self._send(pack_commands(commands), len(commands), timeout)
        for label, reply in zip(labels, replies, strict=True):
            if isinstance(reply, _ReplyError):
                if is_bad_database(str(reply)):  # configuration, not an outage: exit 2, not 4
                    raise ConfigError(f"Redis at {self._address} has no database {target.db}: {reply}")
                raise StoreError(f"Redis at {self._address} refused {label}: {reply}")
            if label == "ROLE" and not (isinstance(reply, list) and reply[:1] == [b"master"]):
                role = reply[0] if isinstance(reply, list) and reply else reply
                raise StoreError(
                    f"{self._address}, named by the sentinels as master "
                    f"{target.master_name!r}, says its role is {role!r} (failover in progress?)"
                )

    def _detach(self) -> None:
        if self._watch is not None:
            self._watch.forget(self._master_moved)
            self._watch = None

    # -- requests --------------------------------------------------------

    async def call(self, call: Call) -> Any:
        """Run one script by SHA and return its reply.

        ``NOSCRIPT`` loads the script and calls again in one more round trip.
        A refusal reported by the script is raised as the exception
        :func:`fencekit._redis.run.translate_reply` maps it to; any other error reply
        as :class:`~fencekit.errors.StoreError`.
        """
        script = call.script
        reply = await self._send(pack_evalsha(script.sha, call.keys, call.args), 0, self._timeout)
        if reply.__class__ is _ReplyError:
            return await self._recover(call, reply)
        return reply

    async def call_asking(self, call: Call) -> Any:
        """:meth:`call` preceded by ``ASKING`` in the same write (a cluster's ``ASK`` redirect).

        ``ASKING`` holds for the next command of the connection only, so both
        go in one payload that no other request can come between.
        """
        script = call.script
        evalsha = pack_evalsha(script.sha, call.keys, call.args)
        _, reply = await self._send(_ASKING + evalsha, 2, self._timeout)
        if reply.__class__ is _ReplyError and str(reply).startswith("NOSCRIPT"):
            loaded, _, reply = await self._send(_script_load(script) + _ASKING + evalsha, 3, self._timeout)
            if loaded.__class__ is _ReplyError:
                raise self._translate(loaded)
        if reply.__class__ is _ReplyError:
            raise self._translate(reply)
        return reply

    async def execute_asking(self, *args: RespArg, timeout: float | None = None) -> Any:
        """:meth:`execute` preceded by ``ASKING`` in the same write (see :meth:`call_asking`)."""
        _, reply = await self._send(
            _ASKING + pack_command(*args), 2, self._timeout if timeout is None else timeout
        )
        if reply.__class__ is _ReplyError:
            raise self._translate(reply)
        return reply

    async def _recover(self, call: Call, error: Any) -> Any:
        if str(error).startswith("NOSCRIPT"):
            script = call.script
            payload = _script_load(script) + pack_evalsha(script.sha, call.keys, call.args)
            loaded, reply = await self._send(payload, 2, self._timeout)
            if loaded.__class__ is _ReplyError:
                raise self._translate(loaded)
            if reply.__class__ is not _ReplyError:
                return reply
            error = reply
        raise self._translate(error)

    async def pipeline(self, calls: Sequence[Call]) -> list[Any]:
        """Run several scripts in one write and one round trip; replies in order.

        A call that failed has its exception instance (already translated, as
        :meth:`call` would raise it) in its place in the list; only failures of
        the connection itself raise. Calls that got ``NOSCRIPT`` are run again,
        after their scripts are loaded, in one more round trip — so they run
        after the other calls of the batch, not in their original position.
        """
        if not calls:
            return []
        payload = b"".join([pack_evalsha(c.script.sha, c.keys, c.args) for c in calls])
        replies: list[Any] = await self._send(payload, len(calls), self._timeout)
        missing: list[int] = []
        for i, reply in enumerate(replies):
            if reply.__class__ is _ReplyError:
                if str(reply).startswith("NOSCRIPT"):
                    missing.append(i)
                else:
                    replies[i] = self._translate(reply, raise_readonly=True)
        if missing:
            await self._rerun(calls, missing, replies)
        return replies

    async def _rerun(self, calls: Sequence[Call], missing: list[int], replies: list[Any]) -> None:
        """Load the scripts the calls at ``missing`` lacked and run those calls again."""
        scripts: dict[str, Script] = {}
        for i in missing:
            scripts.setdefault(calls[i].script.sha, calls[i].script)
        parts = [_script_load(script) for script in scripts.values()]
        parts += [pack_evalsha(calls[i].script.sha, calls[i].keys, calls[i].args) for i in missing]
        again: list[Any] = await self._send(b"".join(parts), len(parts), self._timeout)
        loads = dict(zip(scripts, again[: len(scripts)], strict=True))
        for i, reply in zip(missing, again[len(scripts) :], strict=True):
            load = loads[calls[i].script.sha]
            if load.__class__ is _ReplyError:
                reply = load
            if reply.__class__ is _ReplyError:
                reply = self._translate(reply, raise_readonly=True)
            replies[i] = reply

    async def execute(self, *args: RespArg, timeout: float | None = None) -> Any:
        """Send one command and return its reply (error replies raise, translated).

        ``timeout`` (seconds, ``math.inf`` for none) replaces the connection's
        ``socket_timeout`` for this reply: a ``BLPOP key 5`` needs more than 5 s.
        """
        if timeout is None:
            timeout = self._timeout
        elif not timeout > 0:
            raise ConfigError(f"timeout must be positive, got {timeout!r}")
        reply = await self._send(pack_command(*args), 0, timeout)
        if reply.__class__ is _ReplyError:
            raise self._translate(reply)
        return reply

    async def block_then(
        self, command: Sequence[RespArg], calls: Sequence[Call], timeout: float
    ) -> tuple[Any, list[Any]]:
        """A blocking command and, in the same write, script calls Redis runs the moment it returns.

        Redis keeps a blocked client's next commands until the blocking one
        returns (served or timed out), then runs them at once: an idle
        consumer's ``BLPOP`` on its wake keys followed by its claims gets the
        claimed tasks in the round trip of the wake-up. Returns the blocking
        command's reply (an error reply raises) and each call's reply, or its
        error (translated) in its place; a call that met ``NOSCRIPT`` did not
        run and is not run again here (its slot holds the error).
        """
        if not timeout > 0:
            raise ConfigError(f"timeout must be positive, got {timeout!r}")
        payload = pack_command(*command) + b"".join(
            [pack_evalsha(c.script.sha, c.keys, c.args) for c in calls]
        )
        first, *replies = await self._send(payload, 1 + len(calls), timeout)
        if first.__class__ is _ReplyError:
            raise self._translate(first)
        for i, reply in enumerate(replies):
            if reply.__class__ is _ReplyError:
                replies[i] = self._translate(reply, raise_readonly=True)
        return first, replies

    def _translate(self, error: Any, *, raise_readonly: bool = False) -> FenceKitError:
        """Our exception for an error reply; ``READONLY`` also closes the connection."""
        message = str(error)
        exc = translate_reply(message)
        if is_readonly(message):
            self._abort(f"Redis at {self._address} is a read-only replica now (failover?)")
            if raise_readonly:
                raise exc
        return exc

    async def __aenter__(self) -> LeanConnection:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _joined(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


_ASKING = pack_command(b"ASKING")


def _script_load(script: Script) -> bytes:
    return pack_command(b"SCRIPT", b"LOAD", script.source)
