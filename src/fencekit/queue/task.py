"""``Task``: what a producer asks to run, and its validation at enqueue."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from fencekit._redis.keys import MAX_JID, is_jid, validate_queue
from fencekit.errors import PayloadError
from fencekit.queue import codec
from fencekit.queue.ids import uuid7


@dataclass(slots=True)
class Task:
    """A task to enqueue: which queue, which operation, with which params.

    ``jid`` is generated (a time-sortable UUIDv7) when left ``None``;
    ``attempt`` counts the runs that already failed, and is normally left 0.
    """

    queue: str
    operation: str
    params: dict[str, Any] = field(default_factory=dict)
    jid: str | None = None
    attempt: int = 0

    def envelope(self, max_payload: int = codec.DEFAULT_MAX_PAYLOAD) -> bytes:
        """Validate the task, fill in ``jid``, and return its encoded envelope."""
        validate_queue(self.queue)
        if not isinstance(self.operation, str) or not self.operation:
            raise PayloadError(f"operation must be a non-empty str, got {self.operation!r}")
        if not isinstance(self.params, dict):
            raise PayloadError(f"params must be a dict, got {type(self.params).__name__}")
        if type(self.attempt) is not int or self.attempt < 0:
            raise PayloadError(f"attempt must be a non-negative int, got {self.attempt!r}")
        if self.jid is None:
            self.jid = uuid7()
        elif not is_jid(self.jid):
            raise PayloadError(
                f"jid must be 1 to {MAX_JID} printable characters without whitespace, got {self.jid!r}"
            )
        codec.check_params(self.params)
        raw = codec.encode(
            self.jid, self.queue, self.operation, self.params, self.attempt, time.time_ns() // 1_000_000
        )
        if len(raw) > max_payload:
            raise PayloadError(
                f"task {self.jid} is {len(raw)} bytes encoded, above max_payload={max_payload}"
            )
        return raw

    @classmethod
    def from_envelope(cls, envelope: codec.Envelope) -> Task:
        return cls(envelope.queue, envelope.operation, envelope.params, envelope.jid, envelope.attempt)
