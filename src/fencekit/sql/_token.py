"""The token a fenced SQL write presents: a :class:`~fencekit.FenceToken` or a positive int.

A token is compared with the ``fence_token`` column of the row, a signed BIGINT,
so it must fit in 63 bits (fencekit's tokens are Redis TIME in microseconds,
about 1.8e15: far below the bound).
"""

from __future__ import annotations

from fencekit.errors import ConfigError
from fencekit.primitives.tokens import FenceToken

BIGINT_MAX = 2**63 - 1


def token_value(token: FenceToken | int) -> int:
    """The integer of ``token``; a clear error for a bool, a non-int, ``<= 0`` or past BIGINT."""
    if isinstance(token, FenceToken):
        return token.value
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"token must be a fencekit.FenceToken or a positive int, got {type(token).__name__}")
    if token < 1:
        raise ConfigError(f"token must be >= 1, got {token}")
    if token > BIGINT_MAX:
        raise ConfigError(f"token {token} does not fit in a BIGINT fence column (max {BIGINT_MAX})")
    return token
