"""Value types of the primitives: fencing tokens, lock handles, begin outcomes.

They validate themselves on construction, so a handle that exists is
well-formed: a token is a positive ``int`` of one resource, a handle's token
belongs to the handle's resource, and its lease is positive.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import Enum

from fencekit.errors import ConfigError

__all__ = ["BeginOutcome", "FenceToken", "LockHandle"]


@dataclass(frozen=True, slots=True)
class FenceToken:
    """A fencing token: a number that grows with every grant of ``resource``.

    A write presents it; a destination that remembers the largest token it
    accepted refuses smaller ones (:class:`~fencekit.FenceGate`). Tokens come
    from ``max(last + 1, Redis TIME in µs)``, so they are large integers, not
    1, 2, 3; only their order carries meaning.
    """

    value: int
    resource: str

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise ConfigError(f"token value must be an int, got {type(self.value).__name__}")
        if self.value < 1:
            raise ConfigError(f"token value must be >= 1, got {self.value}")
        if not isinstance(self.resource, str) or not self.resource:
            raise ConfigError(f"token resource must be a non-empty str, got {self.resource!r}")

    def __int__(self) -> int:
        return self.value


@dataclass(frozen=True, slots=True)
class LockHandle:
    """Proof of one lease grant: who holds ``resource``, with which token, for how long.

    ``release`` and ``extend`` act only while Redis still holds this very grant
    (owner *and* token), so a handle kept past its lease cannot touch a newer
    holder's lease, even one with the same ``owner_id``.
    """

    resource: str
    owner_id: str
    token: FenceToken
    ttl: timedelta

    def __post_init__(self) -> None:
        if not isinstance(self.resource, str) or not self.resource:
            raise ConfigError(f"resource must be a non-empty str, got {self.resource!r}")
        if not isinstance(self.owner_id, str) or not self.owner_id:
            raise ConfigError(f"owner_id must be a non-empty str, got {self.owner_id!r}")
        if not isinstance(self.token, FenceToken):
            raise ConfigError(f"token must be a FenceToken, got {type(self.token).__name__}")
        if self.token.resource != self.resource:
            raise ConfigError(
                f"token of resource {self.token.resource!r} cannot belong to a handle "
                f"of resource {self.resource!r}"
            )
        if not isinstance(self.ttl, timedelta) or self.ttl <= timedelta(0):
            raise ConfigError(f"ttl must be a positive timedelta, got {self.ttl!r}")


class BeginOutcome(str, Enum):
    """What :meth:`~fencekit.IdempotencyGuard.try_begin_or_reclaim` decided."""

    BEGUN = "begun"
    """The key was absent: this caller begins the work."""
    RECLAIMED = "reclaimed"
    """The key was pending but its lock was free (the worker died): this caller takes over."""
    ALREADY_DONE = "already_done"
    """The work is done; do nothing."""
    IN_PROGRESS = "in_progress"
    """A live worker holds the lock; do nothing now."""
