"""``fencekit upgrade-keys --from 0.6``: carry the published fencekit 0.1-0.6's Redis state to ours.

The Redis URL and our prefix are the settings ``redis_url`` and ``prefix``
of :mod:`fencekit.settings` (a flag, else ``FENCEKIT_REDIS_URL`` /
``FENCEKIT_PREFIX``, else the default), so every URL form fencekit accepts
works. Progress goes to stderr (a bar on a terminal, else a plain line now
and then), the summary to stdout (``--json``: one JSON object).

Exit codes: 0 done (nothing failed), 1 the moves of some keys failed (they
are named; rerun once the cause is fixed), 2 bad usage, a bad URL or prefix,
or an unsupported ``--from``, 4 Redis unreachable (the code of every other
``fencekit`` command), 130 interrupted (rerun: every step is idempotent, so a
rerun from the start finishes the job).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TextIO

import redis

from fencekit._options import Option, resolve
from fencekit._redis.clients import connect
from fencekit._redis.keys import DEFAULT_PREFIX, validate_prefix
from fencekit._redis.url import parse_url, redact_url
from fencekit.errors import ConfigError
from fencekit.runtime.exits import ExitCode
from fencekit.settings import UrlOption
from fencekit.upgrade.migrate import Summary, migrate
from fencekit.upgrade.rules import KINDS, SUPPORTED_VERSIONS, Plan, supported_version

__all__ = ["build_parser", "main"]

PROG = "fencekit upgrade-keys"
_PLAIN_EVERY_S = 2.0
_PLAIN_EVERY_BATCHES = 50


class UpgradeSettings(UrlOption, total=False):
    """The settings the command shares with the rest of fencekit (flag, environment, default)."""

    prefix: Annotated[
        str,
        Option(
            DEFAULT_PREFIX, "our key prefix, the keys are written under '<prefix>:'", check=validate_prefix
        ),
    ]


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The parser of the command (``--help`` lists the exit codes)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Copy the idempotency markers and memos, locks, token counters and fences that the "
            "published fencekit 0.1-0.6 keeps in Redis into this fencekit's layout. Old keys are "
            "kept (so a rollback works) unless --delete-old. Safe to rerun; see docs/upgrading.md."
        ),
        epilog=(
            "Exit codes: 0 done, 1 some keys failed (named), 2 bad usage / bad URL / unsupported "
            "--from, 4 Redis unreachable, 130 interrupted (rerun to finish)."
        ),
    )
    parser.add_argument(
        "--from",
        dest="from_version",
        required=True,
        metavar="VERSION",
        help=f"the version whose keys to read: {', '.join(SUPPORTED_VERSIONS)}",
    )
    parser.add_argument("--dry-run", action="store_true", help="report what would change, write nothing")
    parser.add_argument(
        "--redis-url",
        metavar="URL",
        help="Redis URL: redis://, rediss://, unix:// or redis+sentinel:// (env FENCEKIT_REDIS_URL)",
    )
    parser.add_argument("--prefix", help=f"our key prefix (env FENCEKIT_PREFIX; default: {DEFAULT_PREFIX})")
    parser.add_argument(
        "--old-prefix", help="the prefix the old package used (default: the same as --prefix)"
    )
    parser.add_argument(
        "--batch", type=int, default=500, metavar="N", help="keys per SCAN and pipeline (default: 500)"
    )
    parser.add_argument(
        "--delete-old",
        action="store_true",
        help="delete each old key once carried (no rollback to the old package afterwards)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    return parser


class _Progress:
    """A Rich bar on a terminal; otherwise a plain line every few seconds or batches."""

    def __init__(self, stream: TextIO, total: int) -> None:
        self._stream = stream
        self._batches = 0
        self._last = time.monotonic()
        self._bar: Any = None
        self._task: Any = None
        if stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("scanning old keys"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[note]}"),
                TimeElapsedColumn(),
                console=Console(file=stream),
                transient=True,
            )
            self._task = self._bar.add_task("scan", total=max(total, 1), note="")
            self._bar.start()

    def __call__(self, summary: Summary) -> None:
        self._batches += 1
        if self._bar is not None:
            note = f"migrated {summary.changed}, up to date {summary.up_to_date}"
            self._bar.update(self._task, completed=summary.scanned, note=note)
            return
        now = time.monotonic()
        if self._batches % _PLAIN_EVERY_BATCHES == 0 or now - self._last >= _PLAIN_EVERY_S:
            self._last = now
            print(
                f"upgrade-keys: scanned {summary.scanned}, migrated {summary.changed}, "
                f"up to date {summary.up_to_date}, errors {summary.error_count}",
                file=self._stream,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _report(summary: Summary, *, as_json: bool, out: TextIO, source: str) -> None:
    if as_json:
        print(json.dumps(summary.as_dict(), sort_keys=True), file=out)
        return
    would = "would migrate" if summary.dry_run else "migrated"
    per_kind = ", ".join(f"{kind} {summary.migrated.get(kind, 0)}" for kind in KINDS)
    print(f"upgrade-keys from {source}{' (dry run: nothing written)' if summary.dry_run else ''}", file=out)
    print(f"  scanned            {summary.scanned}", file=out)
    print(f"  {would:<18} {summary.changed} ({per_kind})", file=out)
    print(
        f"  already up to date {summary.up_to_date} ({summary.current} same, {summary.kept} ours newer)",
        file=out,
    )
    print(
        f"  skipped            {summary.skipped_ours} ours or already at our name, "
        f"{summary.gone} expired meanwhile, {summary.foreign} not of the old layout",
        file=out,
    )
    if summary.delete_old and not summary.dry_run:
        print("  old keys           deleted once carried", file=out)
    if summary.error_count:
        print(f"  errors             {summary.error_count}:", file=out)
        for key, message in summary.errors:
            print(f"    {key}: {message}", file=out)
    elif summary.changed == 0:
        print("  nothing to change: every old key is carried already", file=out)


def main(
    argv: Sequence[str] | None = None,
    *,
    prog: str = PROG,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    connector: Callable[[str], redis.Redis] = connect,
) -> int:
    """Run the command; returns the exit code (see the module docstring)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    parser = build_parser(prog)
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return int(exc.code or 0)

    def fail(message: str, code: int = 2) -> int:
        print(f"{prog}: error: {message}", file=err)
        return code

    try:
        series = supported_version(args.from_version)
        explicit: dict[str, Any] = {}
        if args.redis_url is not None:
            explicit["redis_url"] = args.redis_url
        if args.prefix is not None:
            explicit["prefix"] = args.prefix
        settings = resolve(UpgradeSettings, explicit, owner=prog)
        url: str = settings["redis_url"]
        parse_url(url)
        prefix: str = settings["prefix"]
        plan = Plan(args.old_prefix if args.old_prefix is not None else prefix, prefix)
        if args.batch < 1:
            raise ConfigError(f"--batch must be at least 1, got {args.batch}")
    except ConfigError as exc:
        return fail(str(exc))

    client = connector(url)
    progress: _Progress | None = None
    try:
        try:
            total = int(client.dbsize())
        except redis.exceptions.RedisError as exc:
            return fail(f"cannot reach Redis at {redact_url(url)}: {exc}", ExitCode.REDIS)
        progress = _Progress(err, total)
        summary = migrate(
            client,
            plan,
            batch=args.batch,
            dry_run=args.dry_run,
            delete_old=args.delete_old,
            progress=progress,
        )
    except KeyboardInterrupt:
        if progress is not None:
            progress.close()
        print(f"{prog}: interrupted; run it again to finish (every step is idempotent)", file=err)
        return 130
    except redis.exceptions.RedisError as exc:
        if progress is not None:
            progress.close()
        print(f"{prog}: error: Redis failed mid-run ({exc}); run it again to finish", file=err)
        return 1
    finally:
        client.close()
    progress.close()
    _report(summary, as_json=args.json, out=out, source=f"{series} ({plan.old}:* -> {plan.new}:*)")
    return 1 if summary.error_count else 0


if __name__ == "__main__":
    sys.exit(main())
