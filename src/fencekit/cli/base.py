"""What every operator verb shares: its parser's common flags, the settings, the run and its exit code.

A verb is a :class:`Verb`: a name, a one-line summary, a function that adds
its own arguments, the settings it takes beyond ``redis_url`` and ``prefix``,
and an async ``run(ctx, args)`` returning an exit code. :func:`execute`
parses, resolves the settings from the table of :mod:`fencekit.settings`
(flag, else ``FENCEKIT_<NAME>``, else the default -- the flags and their
help are derived from that table, as ``fencekit pool`` does), opens one
:class:`~fencekit.Client` and runs the verb under ``asyncio.run``.

It is also the one place that turns failures into exit codes
(:class:`Exit`), each with one line on stderr and never a traceback: bad
usage, a bad URL, bad JSON or params are 2; Redis unreachable (or failing
mid-run) is 4, the pool's :attr:`~fencekit.runtime.exits.ExitCode.REDIS`;
Ctrl-C is 130.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import redis.exceptions

from fencekit._options import table
from fencekit._redis import address
from fencekit.cli.output import Output
from fencekit.errors import ConfigError, PayloadError, StoreError
from fencekit.produce.client import Client
from fencekit.runtime.exits import ExitCode
from fencekit.settings import ClientSettings, ServerSettings, given, resolve

__all__ = ["COMMON_SETTINGS", "Context", "Exit", "UsageError", "Verb", "build_parser", "execute"]

COMMON_SETTINGS = ("redis_url", "prefix")
"""The settings every verb takes: ``--redis-url`` and ``--prefix`` (or their FENCEKIT_ variables)."""


class Exit(IntEnum):
    """The exit codes of the operator verbs (``docs/reference/cli.md`` has the table of every command's)."""

    OK = 0
    """Done."""
    NOT_DONE = 1
    """Nothing found or nothing done: an unknown job or queue, a cancel of a finished task, a
    revive of a letter that is gone, an answer "no", bad lines skipped in an enqueue file."""
    USAGE = ExitCode.USAGE
    """Bad usage or configuration: a flag, a URL, a prefix, JSON, params, a queue name."""
    REDIS = ExitCode.REDIS
    """Redis unreachable, or failed mid-run (what was done before is reported)."""
    INTERRUPTED = 130
    """Ctrl-C (SIGINT)."""


class UsageError(ConfigError):
    """A verb refused its arguments (exit 2), with the line to print."""


@dataclass
class Context:
    """What a verb's ``run`` gets: the client, the resolved settings, where to print."""

    client: Client
    settings: dict[str, Any]
    out: Output
    prog: str

    def confirm(self, question: str, yes: bool) -> bool:
        """True if ``yes`` (``--yes``) or the operator answers y on a terminal.

        Off a terminal without ``--yes`` it refuses (:class:`UsageError`): a
        script must say what it means.
        """
        if yes:
            return True
        if not sys.stdin.isatty():
            raise UsageError(f"{question.rstrip('?')}: stdin is not a terminal, pass --yes to confirm")
        print(f"{question} [y/N] ", end="", file=self.out.stderr, flush=True)  # stdout stays the result
        answer = sys.stdin.readline()
        return answer.strip().lower() in ("y", "yes")


@dataclass(frozen=True)
class Verb:
    """One operator verb (see the module docstring)."""

    name: str
    summary: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Context, argparse.Namespace], Awaitable[int]]
    settings: tuple[str, ...] = ()
    """Settings of the table it takes beyond :data:`COMMON_SETTINGS` (e.g. ``keep_result``)."""
    epilog: str = ""


_EXITS = (
    "Exit codes: 0 done, 1 nothing found or not done, 2 bad usage or configuration, "
    "4 Redis unreachable, 130 interrupted."
)


def build_parser(verb: Verb, prog: str) -> argparse.ArgumentParser:
    """The verb's parser: its arguments, ``--json``, and one flag per setting, from the settings table."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=verb.summary,
        epilog=f"{verb.epilog} {_EXITS}".strip(),
    )
    verb.arguments(parser)
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (shapes: docs/reference/cli.md)"
    )
    rows = table(ServerSettings)
    for name in (*COMMON_SETTINGS, *verb.settings):
        setting = rows[name]
        parser.add_argument(
            setting.flag,
            dest=f"setting_{name}",
            default=argparse.SUPPRESS,
            metavar=setting.option.metavar or name.upper(),
            help=setting.help_text(),
        )
    return parser


def _settings(verb: Verb, args: argparse.Namespace, prog: str) -> dict[str, Any]:
    """The client's settings (the verb's flags, else the environment, else defaults), checked."""
    rows = table(ServerSettings)
    explicit = {
        name: rows[name].from_text(text, rows[name].flag)
        for key, text in vars(args).items()
        if key.startswith("setting_") and (name := key[len("setting_") :]) in rows
    }
    client_names = table(ClientSettings)
    given_client = {k: v for k, v in explicit.items() if k in client_names}
    settings: dict[str, Any] = resolve(ClientSettings, given_client, owner=prog)
    if not given(ClientSettings, "redis_url", given_client) and address.read(address.data_home()) is None:
        raise ConfigError(
            f"no Redis URL given (--redis-url, FENCEKIT_REDIS_URL) and no embedded Redis runs in "
            f"{address.data_home()}: give the URL of your Redis (a server on the default port is not "
            "used unless named), or start the pool, which starts the embedded one"
        )
    extra = [name for name in verb.settings if name not in client_names]
    if extra:  # a Server setting a verb reads (heartbeat_ttl): resolved the same way, and only it
        variables = {rows[name].env for name in extra} | {rows[name].env + "_FILE" for name in extra}
        environ = {k: v for k, v in os.environ.items() if k in variables}
        server: dict[str, Any] = resolve(ServerSettings, explicit, environ=environ, owner=prog)
        settings.update({name: server[name] for name in extra})
    return settings


def execute(
    verb: Verb,
    argv: Sequence[str],
    prog: str,
    *,
    stdout: Any = None,
    stderr: Any = None,
) -> int:
    """Parse ``argv``, run ``verb`` and return its exit code (see :class:`Exit`)."""
    parser = build_parser(verb, prog)
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:  # argparse: 0 after --help, 2 after a usage error
        return int(exc.code or 0)
    out = Output(prog, as_json=args.json, stdout=stdout, stderr=stderr)
    try:
        settings = _settings(verb, args, prog)
    except ConfigError as exc:
        out.error(str(exc))
        return Exit.USAGE
    try:
        return asyncio.run(_run(verb, args, settings, out, prog))
    except KeyboardInterrupt:
        out.error("interrupted")
        return Exit.INTERRUPTED


async def _run(verb: Verb, args: argparse.Namespace, settings: dict[str, Any], out: Output, prog: str) -> int:
    client_options = {k: v for k, v in settings.items() if k in table(ClientSettings) and k != "redis_url"}
    try:
        client = Client(settings["redis_url"], **client_options)
    except ConfigError as exc:
        out.error(str(exc))
        return Exit.USAGE
    client.logger = _logger(out)
    try:
        return await verb.run(Context(client, settings, out, prog), args)
    except (ConfigError, PayloadError) as exc:  # UsageError is a ConfigError
        out.error(str(exc))
        return Exit.USAGE
    except (StoreError, redis.exceptions.RedisError, OSError) as exc:
        out.error(f"cannot use Redis at {client.target.redacted()}: {_one_line(exc)}")
        return Exit.REDIS
    finally:
        with contextlib.suppress(Exception):
            await client.close()


def _logger(out: Output) -> logging.Logger:
    """Warnings and errors of the client on stderr; its per-task INFO lines would bury the result."""
    logger = logging.getLogger("fencekit.cli")
    if not logger.handlers:
        handler = logging.StreamHandler(out.stderr)
        handler.setFormatter(logging.Formatter(f"{out.prog}: %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)
        logger.propagate = False
    return logger


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def known_queue_or_none(name: str, known: Sequence[str]) -> str | None:
    """The line to print when ``name`` is not a known queue (with the known ones), else None."""
    if name in known:
        return None
    listed = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "")
    return f"no queue named {name!r} (known: {listed or 'none'})"
