"""The scripts of dependencies (``Task(depends_on=...)``): a task held until its parents are
final, in its own queue's slot (docs/design/batches.md, "Dependencies")."""

from __future__ import annotations

from fencekit._redis.scripts._load import Call, call


def dep_wait(
    *, waiting: str, stats: str, record: str, jid: str, entry: bytes, envelope: bytes, keep_ms: int
) -> Call:
    """Hold task ``jid`` for its parents; reply 1, or 0 when it waits already (``dep_wait.lua``)."""
    return call("dep_wait", (waiting, stats, record), (jid, entry, envelope, keep_ms))


def dep_release(*, waiting: str, pending: str, wake: str, record: str, jid: str, envelope: bytes) -> Call:
    """Queue a waiting task whose parents succeeded; reply 1 when this call did (``dep_release.lua``)."""
    return call("dep_release", (waiting, pending, wake, record), (jid, envelope))


def dep_cancel(
    *,
    waiting: str,
    stats: str,
    record: str,
    finished: str,
    jid: str,
    reason: bytes,
    keep_finished: int,
    done: str,
) -> Call:
    """Cancel a waiting task whose parent will not succeed; reply 1 when this call did
    (``dep_cancel.lua``)."""
    return call("dep_cancel", (waiting, stats, record, finished), (jid, reason, keep_finished, done))
