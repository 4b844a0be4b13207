"""RESP request encoder: the compiled ``fencekit._redis._resp`` when built, else the pure one.

Both implementations have the same API and produce the same bytes
(``fencekit._redis._resp_py`` is the specification). The choice is made once, at
import time: ``FENCEKIT_NO_EXT=1`` in the environment forces the pure-Python
encoder (CI runs the whole suite that way without reinstalling);
otherwise the compiled module is used when it imports.
:mod:`fencekit.compiled` reports which one is in use.
"""

from __future__ import annotations

import os

from fencekit._redis._resp_py import RespArg

__all__ = [
    "IMPLEMENTATION",
    "UNAVAILABLE_REASON",
    "RespArg",
    "pack_command",
    "pack_commands",
    "pack_evalsha",
]

#: Why the compiled encoder is not in use ("" when it is).
UNAVAILABLE_REASON: str = ""

if os.environ.get("FENCEKIT_NO_EXT", "") not in ("", "0"):
    from fencekit._redis._resp_py import pack_command, pack_commands, pack_evalsha

    UNAVAILABLE_REASON = "disabled by FENCEKIT_NO_EXT"
else:
    try:
        from fencekit._redis._resp import pack_command, pack_commands, pack_evalsha
    except ImportError as exc:
        from fencekit._redis._resp_py import pack_command, pack_commands, pack_evalsha

        UNAVAILABLE_REASON = f"not importable ({exc})"

#: ``"compiled"`` or ``"python"``.
IMPLEMENTATION: str = "python" if UNAVAILABLE_REASON else "compiled"
