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
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import hiredis

from fencekit._redis.clients import resolve_address
from fencekit._redis.resp import RespArg, pack_command, pack_commands, pack_evalsha
from fencekit._redis.run import is_readonly, translate_reply
from fencekit._redis.scripts import Call, Script
from fencekit._redis.sentinel import Change, MasterWatch
from fencekit._redis.url import RedisTarget, parse_url
from fencekit.errors import ConfigError, FenceKitError, StoreError

__all__ = ["LeanConnection"]

_ReplyError = hiredis.ReplyError
_INF = math.inf
# A queued request: its future, how many replies it waits for (0: one reply,
# returned bare; n >= 1: a list of n replies) and its reply timeout.
_Waiter = tuple["asyncio.Future[Any]", int, float]


class LeanConnection(asyncio.Protocol):
    """One Redis connection for the hot path; open it with :meth:`open`.

    Not thread-safe; bound to the event loop that opened it. After it is
    :attr:`closed` (by the owner or by a failure) every request raises
    :class:`~fencekit.errors.StoreError`; open a new one.
    """

    __slots__ = (
        "_address",
        "_close_reason",
        "_closed",
        "_deadline",
        "_loop",
        "_lost",
        "_out",
        "_partial",
        "_reader",
        "_target",
        "_timeout",
        "_timer",
        "_timer_when",
        "_transport",
        "_waiters",
        "_watch",
    )

    def __init__(self, target: RedisTarget, loop: asyncio.AbstractEventLoop) -> None:
        """Internal: use :meth:`open`, which connects and sets the connection up."""
        self._target = target
        self._loop = loop
        self._address = ""
        self._transport: asyncio.Transport | None = None
        self._reader = hiredis.Reader()
        self._waiters: deque[_Waiter] = deque()
        self._out: list[bytes] = []  # bytes queued in this loop iteration, written by _flush
        self._partial: list[Any] = []
        self._timeout = _INF if target.socket_timeout is None else target.socket_timeout
        self._deadline = _INF
        self._timer: asyncio.TimerHandle | None = None
        self._timer_when = _INF
        self._closed = False
        self._close_reason = "not connected"
        self._lost: asyncio.Future[None] = loop.create_future()
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
                raise StoreError(f"Redis at {self._address} refused {label}: {reply}")
            if label == "ROLE" and not (isinstance(reply, list) and reply[:1] == [b"master"]):
                role = reply[0] if isinstance(reply, list) and reply else reply
                raise StoreError(
                    f"{self._address}, named by the sentinels as master "
                    f"{target.master_name!r}, says its role is {role!r} (failover in progress?)"
                )

    # -- asyncio.Protocol ------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._close_reason = ""

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        waiters = self._waiters
        while True:
            try:
                reply = reader.gets()
            except hiredis.ProtocolError as exc:
                self._abort(f"protocol error in a reply from Redis at {self._address}", exc)
                return
            if reply is False:
                break
            if not waiters:
                self._abort(f"Redis at {self._address} sent a reply nobody asked for")
                return
            fut, count, _ = waiters[0]
            if count:
                partial = self._partial
                partial.append(reply)
                if len(partial) < count:
                    continue
                reply = partial
                self._partial = []
            waiters.popleft()
            if not fut.done():
                fut.set_result(reply)
        if waiters:
            self._arm(waiters[0][2])

    def eof_received(self) -> bool | None:
        return None  # let the transport close; connection_lost fails the waiters

    def _forget_watch(self) -> None:
        if self._watch is not None:
            self._watch.forget(self._master_moved)
            self._watch = None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._closed:
            self._closed = True
            self._close_reason = f"connection to Redis at {self._address} lost"
            self._cancel_timer()
            self._fail_waiters(self._close_reason, exc)
        self._transport = None
        self._forget_watch()
        if not self._lost.done():
            self._lost.set_result(None)

    # -- requests --------------------------------------------------------

    def _send(self, payload: bytes, count: int, timeout: float) -> asyncio.Future[Any]:
        """Queue a future for ``count`` replies (0: one bare reply) and write ``payload``."""
        transport = self._transport
        if self._closed or transport is None:
            raise StoreError(f"lean connection is closed ({self._close_reason})")
        fut = self._loop.create_future()
        waiters = self._waiters
        if not waiters:
            self._arm(timeout)
            waiters.append((fut, count, timeout))
            transport.write(payload)  # an idle connection: no one to wait for
            return fut
        waiters.append((fut, count, timeout))
        out = self._out
        out.append(payload)
        if len(out) == 1:
            self._loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        """Write every request queued since the last flush, in one write."""
        out = self._out
        if not out:
            return
        self._out = []
        transport = self._transport
        if self._closed or transport is None:
            return  # their futures failed already
        transport.write(out[0] if len(out) == 1 else b"".join(out))

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

    # -- timeouts and failure --------------------------------------------

    def _arm(self, timeout: float) -> None:
        """Start the head request's timeout now; make sure the timer fires by then."""
        if timeout == _INF:
            self._deadline = _INF
            return
        deadline = self._loop.time() + timeout
        self._deadline = deadline
        timer = self._timer
        if timer is None or self._timer_when > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(deadline, self._on_timer)
            self._timer_when = deadline

    def _on_timer(self) -> None:
        # The timer is lazy: replies move the deadline without touching it,
        # so when it fires it checks the current deadline and re-arms if needed.
        self._timer = None
        self._timer_when = _INF
        if self._closed or not self._waiters or self._deadline == _INF:
            return
        if self._loop.time() >= self._deadline:
            timeout = self._waiters[0][2]
            self._abort(f"no reply from Redis at {self._address} within {timeout:g}s")
            return
        self._timer = self._loop.call_at(self._deadline, self._on_timer)
        self._timer_when = self._deadline

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_when = _INF

    def _abort(self, reason: str, cause: BaseException | None = None) -> None:
        """Close at once (unsent bytes dropped) and fail every waiting request."""
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        self._cancel_timer()
        if self._transport is not None:
            self._transport.abort()
        self._fail_waiters(reason, cause)

    def _fail_waiters(self, reason: str, cause: BaseException | None) -> None:
        waiters = self._waiters
        self._partial = []
        self._out = []  # never written: the callers are told they failed
        while waiters:
            fut = waiters.popleft()[0]
            if not fut.done():
                exc = StoreError(f"{reason}; the request may have run and is not re-sent")
                exc.__cause__ = cause
                fut.set_exception(exc)

    # -- closing ---------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once closed by :meth:`close` or by a failure; open a new connection then."""
        return self._closed

    @property
    def address(self) -> str:
        """``host:port`` or the socket path this connection went to."""
        return self._address

    def close(self) -> None:
        """Close now; requests still waiting fail with StoreError."""
        pending = bool(self._waiters)
        if not self._closed:
            self._closed = True
            self._close_reason = "closed by its owner"
            self._cancel_timer()
            self._fail_waiters(self._close_reason, None)
        transport = self._transport
        if transport is not None:
            if pending:
                transport.abort()  # do not flush requests whose callers were told they failed
            else:
                transport.close()

    async def aclose(self) -> None:
        """:meth:`close`, then wait until the transport has let go of the socket."""
        connected = self._transport is not None
        self.close()
        if connected:
            await self._lost

    async def __aenter__(self) -> LeanConnection:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _joined(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


_ASKING = pack_command(b"ASKING")


def _script_load(script: Script) -> bytes:
    return pack_command(b"SCRIPT", b"LOAD", script.source)
