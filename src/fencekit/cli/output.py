"""What the operator commands print: Rich tables or one JSON object on stdout, notes and bars on stderr.

Every verb prints its result through an :class:`Output`: a human table
(Rich) by default, or exactly one JSON object with ``--json`` (the shapes are
documented in ``docs/reference/cli.md`` and stable). Errors and notes go to stderr as
``<prog>: error: ...`` lines, so stdout stays parseable. Bulk operations show
a :class:`Bar` on stderr: a Rich progress bar on a terminal, else a plain
line every few seconds (a log file gets a trace, not a bar's escape codes).

Text that came from Redis or from a user (queue names, reasons, payloads) is
handed to Rich as :class:`rich.text.Text`, never as markup, so a ``[bold]``
in a dead letter's reason prints as it is.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, TextIO

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["Bar", "Output", "age", "when"]

_PLAIN_EVERY_S = 2.0
_WIDTH_OFF_TERMINAL = 240  # a pipe or a file: wide enough that no number is cut


def when(seconds: float | None) -> str:
    """A Unix time as ``2026-12-02 01:40:47Z`` (UTC), or ``-``."""
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def age(seconds: float | None) -> str:
    """A duration as ``0.4s``, ``12s``, ``5m03s``, ``2h10m``, or ``-``."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


class Output:
    """Where one run of a verb prints (see the module docstring)."""

    def __init__(
        self, prog: str, *, as_json: bool, stdout: TextIO | None = None, stderr: TextIO | None = None
    ):
        self.prog = prog
        self.as_json = as_json
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        tty = self.stdout.isatty()
        self._console = Console(file=self.stdout, highlight=False, width=None if tty else _WIDTH_OFF_TERMINAL)

    def json(self, data: dict[str, Any]) -> None:
        """Print ``data`` as one JSON object on one line."""
        print(json.dumps(data), file=self.stdout, flush=True)  # ASCII: any locale, any parser

    def line(self, text: str) -> None:
        """One line of the human result on stdout (no markup)."""
        print(text, file=self.stdout, flush=True)

    def note(self, text: str) -> None:
        """One line for the operator on stderr (not part of the result)."""
        print(text, file=self.stderr, flush=True)

    def error(self, text: str) -> None:
        """``<prog>: error: <text>`` on stderr."""
        print(f"{self.prog}: error: {text}", file=self.stderr, flush=True)

    def table(
        self,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        *,
        title: str | None = None,
        numeric: Sequence[str] = (),
    ) -> None:
        """A Rich table on stdout; ``numeric`` columns are right-aligned. Cells print as plain text."""
        table = Table(
            box=box.SIMPLE_HEAD,
            title=Text(title) if title is not None else None,  # a queue name is text, not markup
            title_justify="left",
            pad_edge=False,
        )
        for k, name in enumerate(columns):
            widest = max(len(word) for word in name.split())  # a header breaks between words only
            if k == 0:  # the first column names the row: kept whole up to 40 characters
                widest = max([widest, *(min(40, len(str(row[0]))) for row in rows)])
            table.add_column(
                name, justify="right" if name in numeric else "left", overflow="fold", min_width=widest
            )
        for row in rows:
            table.add_row(*(Text("-" if cell is None else str(cell)) for cell in row))
        self._console.print(table)

    @contextmanager
    def bar(self, label: str, total: int | None) -> Iterator[Bar]:
        """A :class:`Bar` on stderr for the duration of the block (removed at its end)."""
        bar = Bar(self.stderr, label, total)
        try:
            yield bar
        finally:
            bar.close()


class Bar:
    """Progress of a bulk operation: a Rich bar on a terminal, else a plain line every 2 s."""

    def __init__(self, stream: TextIO, label: str, total: int | None) -> None:
        self._stream = stream
        self._label = label
        self._total = total
        self._last = time.monotonic()
        self._rich: Any = None
        self._task: Any = None
        if stream.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._rich = Progress(
                TextColumn(Text(label).markup),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[note]}"),
                TimeElapsedColumn(),
                console=Console(file=stream),
                transient=True,
            )
            self._task = self._rich.add_task(label, total=total, note="")
            self._rich.start()

    def update(self, completed: int, note: str = "") -> None:
        """``completed`` of the total are handled; ``note`` says what that means so far."""
        if self._rich is not None:
            self._rich.update(self._task, completed=completed, note=Text(note).markup)
            return
        now = time.monotonic()
        if now - self._last >= _PLAIN_EVERY_S:
            self._last = now
            of = f" of {self._total}" if self._total is not None else ""
            print(f"{self._label}: {completed}{of} {note}".rstrip(), file=self._stream, flush=True)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
