"""The lean connection's wire (private): request futures in order, one timer, failing as one.

:class:`Wire` is the :class:`asyncio.Protocol` half of
:class:`~fencekit._redis.hotpath.LeanConnection`: it queues a future per request
in the same synchronous step as its bytes, coalesces the bytes of one loop
iteration into one write, feeds replies to ``hiredis.Reader`` and resolves the
futures in request order, bounds the wait for the head reply with one lazy
timer, and on any failure closes and fails every waiting request (nothing is
re-sent: I4 of docs/design.md). What is sent -- scripts by SHA, ``NOSCRIPT``
recovery, ``ASKING``, set-up -- is the connection's (``hotpath.py``).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from typing import Any, cast

import hiredis

from fencekit._redis.run import NotSent
from fencekit.errors import StoreError

__all__ = ["Wire"]

_INF = math.inf
# A queued request: its future, how many replies it waits for (0: one reply,
# returned bare; n >= 1: a list of n replies) and its reply timeout.
_Waiter = tuple["asyncio.Future[Any]", int, float]


class Wire(asyncio.Protocol):
    """Requests and replies in order on one transport (see the module docstring)."""

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
        "_timeout",
        "_timer",
        "_timer_when",
        "_transport",
        "_waiters",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float | None) -> None:
        """``timeout``: seconds without progress before the head request fails (None: none)."""
        self._loop = loop
        self._address = ""
        self._transport: asyncio.Transport | None = None
        self._reader = hiredis.Reader()
        self._waiters: deque[_Waiter] = deque()
        self._out: list[bytes] = []  # bytes queued in this loop iteration, written by _flush
        self._partial: list[Any] = []
        self._timeout = _INF if timeout is None else timeout
        self._deadline = _INF
        self._timer: asyncio.TimerHandle | None = None
        self._timer_when = _INF
        self._closed = False
        self._close_reason = "not connected"
        self._lost: asyncio.Future[None] = loop.create_future()

    def _detach(self) -> None:
        """Called once the transport is gone; the connection lets go of what it listens to."""

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

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._closed:
            self._closed = True
            self._close_reason = f"connection to Redis at {self._address} lost"
            self._cancel_timer()
            self._fail_waiters(self._close_reason, exc)
        self._transport = None
        self._detach()
        if not self._lost.done():
            self._lost.set_result(None)

    # -- requests --------------------------------------------------------

    def _send(self, payload: bytes, count: int, timeout: float) -> asyncio.Future[Any]:
        """Queue a future for ``count`` replies (0: one bare reply) and write ``payload``."""
        transport = self._transport
        if not self._closed and transport is not None and transport.is_closing():
            self._abort(f"connection to Redis at {self._address} closed by its transport")
        if self._closed or transport is None:
            raise NotSent(f"lean connection is closed ({self._close_reason})")
        fut = self._loop.create_future()
        waiters = self._waiters
        if not waiters:
            try:
                transport.write(payload)  # an idle connection: no one to wait for
            except Exception as exc:  # e.g. uvloop's RuntimeError: the socket closed under the write
                self._abort(f"connection to Redis at {self._address} failed at a write", exc)
                raise NotSent(f"{self._close_reason}: {exc!r}") from exc
            self._arm(timeout)
            waiters.append((fut, count, timeout))
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
        try:
            transport.write(out[0] if len(out) == 1 else b"".join(out))
        except Exception as exc:  # the socket closed under the write: every waiter fails (StoreError)
            self._abort(f"connection to Redis at {self._address} failed at a write", exc)

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
