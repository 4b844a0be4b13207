"""The ``fencekit`` console command (also ``python -m fencekit``): running workers and operating queues.

::

    fencekit --version
    fencekit pool APP [options]                 the supervised pool (fencekit.pool.cli)
    fencekit upgrade-keys --from 0.6 [options]  carry 0.1-0.6 state (fencekit.upgrade.command)
    fencekit enqueue QUEUE OPERATION --params JSON | --file tasks.jsonl
    fencekit queues | consumers | schedules | job JID | batch BID | cancel JID
    fencekit purge QUEUE [--yes]
    fencekit dead-letters QUEUE [--revive ID | --revive-all | --purge]
    fencekit failed QUEUE [--retry JID | --retry-all | --show JID]
    fencekit relay --sql-url URL [options]     the SQL outbox's relay alone (fencekit.cli.relay)

The operator verbs are one module per group -- :mod:`~fencekit.cli.enqueue`,
:mod:`~fencekit.cli.inspect` (reading: queues, consumers, schedules, job, batch) and
:mod:`~fencekit.cli.manage` (changing: cancel, purge, dead letters,
failures) -- over :mod:`~fencekit.cli.base` (settings flags derived from
:mod:`fencekit.settings`, one ``Client``, ``asyncio.run``, exit codes) and
:mod:`~fencekit.cli.output` (Rich tables, ``--json``, progress bars on
stderr). ``docs/reference/cli.md`` documents every verb, its JSON and the exit codes
of every command in one table; the verbs' own are :class:`~fencekit.cli.base.Exit`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from fencekit.cli.base import Verb, execute

__all__ = ["main", "verbs"]


def verbs() -> dict[str, Verb]:
    """The operator verbs by name (imported on use: ``fencekit pool`` loads none of them)."""
    from fencekit.cli import enqueue, inspect, manage, relay

    groups = (enqueue.VERBS, inspect.VERBS, manage.VERBS, relay.VERBS)
    return {verb.name: verb for group in groups for verb in group}


def _usage(known: dict[str, Verb]) -> str:
    lines = [
        "usage: fencekit [--version] COMMAND [options]   (fencekit COMMAND --help for its options)",
        "",
        "commands:",
        f"  {'pool':<14} run workers in a supervised pool of processes",
        f"  {'upgrade-keys':<14} carry the Redis state of fencekit 0.1-0.6 to this layout",
    ]
    lines += [f"  {name:<14} {verb.summary}" for name, verb in known.items()]
    lines += [
        "",
        "Every command takes --redis-url (env FENCEKIT_REDIS_URL) and --prefix (env FENCEKIT_PREFIX);",
        "the operator commands print tables, or one JSON object with --json (docs/reference/cli.md).",
        "Exit codes: 0 done, 1 nothing found or not done, 2 bad usage or configuration,",
        "4 Redis unreachable, 130 interrupted (pool: 3 a child could not boot).",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``fencekit <command>``; returns the exit code (2: bad usage)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--version":
        from fencekit import __version__

        print(f"fencekit {__version__}")
        return 0
    if not args or args[0] in ("-h", "--help"):
        print(_usage(verbs()), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "pool":
        from fencekit.pool.cli import main as pool_main

        return pool_main(rest, prog="fencekit pool")
    if command == "upgrade-keys":
        from fencekit.upgrade.command import main as upgrade_main

        return upgrade_main(rest, prog="fencekit upgrade-keys")
    known = verbs()
    verb = known.get(command)
    if verb is None:
        names = ", ".join(["pool", "upgrade-keys", *known])
        print(f"fencekit: error: unknown command {command!r} (known: {names})", file=sys.stderr)
        return 2
    return execute(verb, rest, f"fencekit {command}")


if __name__ == "__main__":
    sys.exit(main())
