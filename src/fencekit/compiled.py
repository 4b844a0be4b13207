"""What the hot path runs on: compiled or pure encoder, hiredis, uvloop.

For a start-up log line (``log.info("fencekit %s", compiled.describe())``) and
for ``/metrics``-style introspection. Importing this module decides nothing on
its own; it reports the choice :mod:`fencekit._redis.resp` made at import time.
"""

from __future__ import annotations

from importlib import metadata

from fencekit._redis import resp

__all__ = ["ACCELERATED", "RESP_IMPLEMENTATION", "describe"]

#: ``"compiled"`` (``fencekit._redis._resp``) or ``"python"`` (``fencekit._redis._resp_py``).
RESP_IMPLEMENTATION: str = resp.IMPLEMENTATION

#: True when the request encoder is the compiled extension.
ACCELERATED: bool = RESP_IMPLEMENTATION == "compiled"


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def describe() -> dict[str, str]:
    """Implementation of each hot-path component, as short strings.

    Keys: ``resp_encoder`` (``compiled`` or ``python (<why>)``),
    ``reply_parser`` (``hiredis <version>``) and ``event_loop``
    (``uvloop <version>`` when installed, else ``asyncio``; the loop a
    process actually runs is chosen by whoever starts it).
    """
    encoder = "compiled" if ACCELERATED else f"python ({resp.UNAVAILABLE_REASON})"
    hiredis_version = _version("hiredis")
    uvloop_version = _version("uvloop")
    return {
        "resp_encoder": encoder,
        "reply_parser": f"hiredis {hiredis_version}" if hiredis_version else "hiredis (unknown version)",
        "event_loop": f"uvloop {uvloop_version} available" if uvloop_version else "asyncio",
    }
