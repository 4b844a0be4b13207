"""``python -m fencekit.pool APP`` (and ``fencekit pool APP``): the pool from the command line.

Every flag is a setting of :mod:`fencekit.settings` -- the parser is built
from that table, so ``--help`` lists each with its default and its
``FENCEKIT_<NAME>`` variable -- and ``APP`` may come from ``FENCEKIT_APP``.
With no Redis URL given (flag, environment or the APP's ``redis_url``), the
pool uses the embedded Redis of ``--data-dir``, starting it when none runs
there (:mod:`fencekit.pool._embedded`), and says so; a Redis that merely
answers on the default port is never used unless its URL is given.

The command installs the supervisor's signal methods (SIGTERM/SIGINT stop
gracefully, a second one at once; SIGQUIT at once; SIGHUP restarts the
children one by one) and exits with a code of
:class:`~fencekit.runtime.exits.ExitCode`: 0 stopped (or, with ``--burst``,
every queue drained), 2 bad usage or configuration, 3 a child could not
boot, 4 Redis unreachable, 5 ``--burst-timeout`` passed with tasks left.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fencekit._log import line_handler
from fencekit._redis.url import parse_url
from fencekit.errors import ConfigError, StoreError
from fencekit.jobs.worker import WorkerRegistry
from fencekit.runtime.app import App, load_app, pool_url
from fencekit.runtime.exits import ExitCode
from fencekit.settings import PoolSettings, given, resolve, table

__all__ = ["build_parser", "main"]

PROG = "python -m fencekit.pool"
_SIGNALS = ("TERM", "INT", "QUIT", "HUP")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The parser: ``APP`` and one flag per setting, all derived from the settings table."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run fencekit workers in a supervised pool of processes.",
        epilog=(
            "Every option can also be set in the environment (FENCEKIT_<NAME>, shown with each); "
            "a flag wins over the environment. Exit codes: 0 stopped (or drained, with --burst), "
            "2 bad usage or configuration, 3 a child could not boot, 4 Redis unreachable, "
            "5 --burst-timeout passed with tasks left."
        ),
    )
    parser.add_argument(
        "app",
        metavar="APP",
        nargs="?",
        help="module:attribute naming an App or a list of workers (env FENCEKIT_APP)",
    )
    for setting in table(PoolSettings).values():
        option = setting.option
        shown = setting.help_text() if option.flag else argparse.SUPPRESS
        if setting.is_switch:  # --burst: no value; read as the text "true", like FENCEKIT_BURST=true
            parser.add_argument(
                setting.flag, dest=setting.name, default=argparse.SUPPRESS, action="store_const",
                const="true", help=shown,
            )  # fmt: skip
            continue
        parser.add_argument(
            setting.flag,
            dest=setting.name,
            default=argparse.SUPPRESS,
            metavar=option.metavar or setting.name.upper(),
            help=shown,
        )
    return parser


def _explicit(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags, read and checked like the environment's."""
    settings = table(PoolSettings)
    return {
        name: settings[name].from_text(text, settings[name].flag)
        for name, text in vars(args).items()
        if name in settings
    }


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Run the pool from the command line; returns the exit code."""
    args = build_parser(prog).parse_args(argv)
    embedded = None
    try:
        explicit = _explicit(args)
        settings: PoolSettings = resolve(PoolSettings, explicit, owner=prog)
        logging.basicConfig(level=settings["log_level"], handlers=[line_handler(settings["log_format"])])
        logger = logging.getLogger("fencekit.pool")
        spec = args.app or os.environ.get("FENCEKIT_APP")
        if not spec:
            raise ConfigError("APP is missing: pass module:attribute, or set FENCEKIT_APP")
        app = load_app(spec)
        WorkerRegistry().add(app.workers)
        by = "--redis-url" if "redis_url" in explicit else "FENCEKIT_REDIS_URL"
        own = settings["redis_url"] if given(PoolSettings, "redis_url", explicit) else None
        url, source, warning = pool_url(app, own, by)
        if warning is not None:
            logger.warning("%s", warning)
        if url is None:
            from fencekit.pool._embedded import default_redis

            data_dir = Path(settings["data_dir"]) if settings["data_dir"] else None
            settings["redis_url"], embedded = default_redis(data_dir, logger)
        else:
            settings["redis_url"] = url
            logger.info("Redis: %s (from %s)", parse_url(url).redacted(), source)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    from fencekit.pool._child import new_loop

    loop = new_loop()
    try:
        return loop.run_until_complete(_serve(settings, app, spec, logger, prog))
    finally:
        loop.close()
        if embedded is not None:
            embedded.stop()
            logger.info("embedded Redis stopped (data kept in %s)", embedded.directory)


async def _serve(settings: PoolSettings, app: App, spec: str, logger: logging.Logger, prog: str) -> int:
    from fencekit.pool._supervisor import Supervisor

    try:
        supervisor = Supervisor(settings, app, spawn="fork", app_spec=spec, logger=logger)
    except ConfigError as exc:  # settings that only make sense together (max_procs below procs)
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    loop = asyncio.get_running_loop()
    for name in _SIGNALS:
        loop.add_signal_handler(getattr(signal, f"SIG{name}"), getattr(supervisor, f"handle_{name.lower()}"))
    try:
        await supervisor.start()
    except StoreError as exc:
        print(f"{prog}: error: cannot reach Redis at {supervisor.target.redacted()}: {exc}", file=sys.stderr)
        await supervisor.stop(fast=True)
        return ExitCode.REDIS
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        await supervisor.stop(fast=True)
        return ExitCode.USAGE
    await supervisor.stopped.wait()
    await supervisor.wait_control()
    return supervisor.exit_code
