"""The SCAN and copy driver of ``fencekit upgrade-keys``: walks the old keys, runs the moves.

For each kind of :data:`~fencekit.upgrade.rules.KINDS` in order, ``SCAN
MATCH`` (never ``KEYS``) yields batches of names; the names that need their
value to be classified (idempotency names ending in ``:result``) are read in
one pipeline, then every move of the batch runs ``upgrade_move.lua`` in one
more pipeline. Each move is atomic on the server and idempotent, so the
driver keeps no state: a run that is interrupted (SIGINT, SIGKILL, a lost
connection) is finished by running the command again from the start, and a
run over an up-to-date database changes nothing (every move replies
``current`` or ``kept``).

A single Redis (or a Sentinel-watched primary) only: the published 0.1-0.6
could not run its locks on Cluster (their scripts span two hash slots), and
an old key and ours sit in different slots, which no one script may touch.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis

from fencekit._redis import scripts
from fencekit.upgrade.rules import KINDS, Kind, Move, Plan, scan_pattern

__all__ = ["Summary", "migrate"]

#: Outcomes a move may report (``upgrade_move.lua``'s replies).
OUTCOMES = ("migrated", "current", "kept", "gone", "foreign")
_MAX_ERRORS_KEPT = 100


@dataclass
class Summary:
    """What a run saw and did; ``errors`` names the old keys whose move failed."""

    dry_run: bool
    delete_old: bool
    scanned: int = 0
    migrated: Counter[str] = field(default_factory=Counter)
    current: int = 0
    kept: int = 0
    skipped_ours: int = 0
    gone: int = 0
    foreign: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)
    error_count: int = 0

    @property
    def up_to_date(self) -> int:
        """Moves that found ours already holding the state (or newer)."""
        return self.current + self.kept

    @property
    def changed(self) -> int:
        """Keys of ours written (or that would be, in a dry run)."""
        return sum(self.migrated.values())

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready data (``--json``)."""
        data = dataclasses.asdict(self)
        data["migrated"] = {kind: self.migrated.get(kind, 0) for kind in KINDS}
        data["errors"] = [{"key": key, "error": message} for key, message in self.errors]
        data["up_to_date"] = self.up_to_date
        data["changed"] = self.changed
        return data


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return str(value)


def _scan(client: redis.Redis, pattern: str, batch: int) -> Iterator[list[object]]:
    cursor: int = 0
    while True:
        cursor, names = client.scan(cursor=cursor, match=pattern, count=batch)
        if names:
            yield list(names)
        if cursor == 0:
            return


def _plan_batch(
    client: redis.Redis, plan: Plan, kind: Kind, raw_names: list[object], summary: Summary
) -> list[Move]:
    names: list[str] = []
    for raw in raw_names:
        name = _text(raw)
        if name is None:
            summary.foreign += 1  # not UTF-8: never written by the old package (decode_responses)
        else:
            names.append(name)
    values: dict[str, str | None] = {}
    wanted = [name for name in names if plan.needs_value(kind, name)]
    if wanted:
        pipe = client.pipeline(transaction=False)
        for name in wanted:
            pipe.get(name)
        for name, value in zip(wanted, pipe.execute(raise_on_error=False), strict=True):
            values[name] = None if isinstance(value, Exception) else _text(value)
    moves: dict[str, Move] = {}
    for name in names:
        outcome = plan.move(kind, name, values.get(name))
        if isinstance(outcome, Move):
            moves.setdefault(outcome.source, outcome)
        elif outcome == "ours":
            summary.skipped_ours += 1
        elif outcome == "gone":
            summary.gone += 1
        else:
            summary.foreign += 1
    return list(moves.values())


def _run_moves(
    client: redis.Redis, moves: list[Move], summary: Summary, *, dry_run: bool, delete_old: bool
) -> None:
    calls = [
        scripts.upgrade_move(
            kind=move.script_kind, keys=move.keys, delete=delete_old and move.deletable, dry_run=dry_run
        )
        for move in moves
    ]
    if not calls:
        return
    script = calls[0].script
    for attempt in (1, 2):
        pipe = client.pipeline(transaction=False)
        for call in calls:
            pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
        replies = pipe.execute(raise_on_error=False)
        if attempt == 1 and any(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
            client.script_load(script.source)  # flushed meanwhile; every move is idempotent: redo all
            continue
        break
    for move, reply in zip(moves, replies, strict=True):
        if isinstance(reply, Exception):
            summary.error_count += 1
            if len(summary.errors) < _MAX_ERRORS_KEPT:
                summary.errors.append((move.source, str(reply)))
            continue
        outcome = _text(reply)
        if outcome == "migrated":
            summary.migrated[move.kind] += 1
        elif outcome == "current":
            summary.current += 1
        elif outcome == "kept":
            summary.kept += 1
        elif outcome == "gone":
            summary.gone += 1
        elif outcome == "foreign":
            summary.foreign += 1
        else:
            summary.error_count += 1
            if len(summary.errors) < _MAX_ERRORS_KEPT:
                summary.errors.append((move.source, f"unexpected reply {reply!r}"))


def migrate(
    client: redis.Redis,
    plan: Plan,
    *,
    batch: int = 500,
    dry_run: bool = False,
    delete_old: bool = False,
    progress: Callable[[Summary], None] | None = None,
) -> Summary:
    """Carry every old key of ``plan`` to ours; the :class:`Summary` of what happened.

    ``batch`` is the SCAN COUNT hint and so about the size of each pipeline.
    ``progress`` is called after each batch. Redis errors of the connection
    itself propagate (the run is then simply repeated); an error of one key's
    script is recorded in ``Summary.errors`` and the run goes on.
    """
    summary = Summary(dry_run=dry_run, delete_old=delete_old)
    client.script_load(scripts.SCRIPTS.upgrade_move.source)
    for kind in KINDS:
        for names in _scan(client, scan_pattern(plan.old, kind), batch):
            summary.scanned += len(names)
            moves = _plan_batch(client, plan, kind, names, summary)
            _run_moves(client, moves, summary, dry_run=dry_run, delete_old=delete_old)
            if progress is not None:
                progress(summary)
    return summary
