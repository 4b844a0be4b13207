"""``fencekit relay``: the transactional outbox's relay alone, without a pool or a ``Server``.

::

    fencekit relay --sql-url postgresql+psycopg://app@db/shop --redis-url redis://cache:6379/0

Moves the tasks that committed transactions wrote with ``enqueue_in`` from
the database's outbox table to Redis (:mod:`fencekit.services.relay`) until
SIGTERM or Ctrl-C, then says what it moved (its lines on stderr; with
``--json`` a summary on stdout). Several relays (this command, pools and
Servers given ``outbox_url``) may run at once: they share the rows.
A database or Redis that fails is waited for, one line when it starts
failing and one when it answers again. Exit 0 after a stop, 2 for a bad URL
or a database that is not PostgreSQL or MariaDB/MySQL.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from fencekit._aio.scope import TaskScope
from fencekit._log import line_handler
from fencekit.cli.base import Context, Exit, UsageError, Verb

__all__ = ["VERBS"]


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sql-url",
        help="SQLAlchemy URL of the database whose outbox to relay (the same as --outbox-url; "
        "env FENCEKIT_OUTBOX_URL)",
    )


def _logger() -> logging.Logger:
    logger = logging.getLogger("fencekit.relay")
    if not logger.handlers:
        handler = line_handler()
        handler.setStream(sys.stderr)  # stdout holds what --json prints, alone
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


async def _relay(ctx: Context, args: argparse.Namespace) -> int:
    url = args.sql_url or ctx.settings["outbox_url"]
    if not url:
        raise UsageError("give the database: --sql-url URL (or --outbox-url, FENCEKIT_OUTBOX_URL)")
    from fencekit.services.relay import Relay  # SQLAlchemy: loaded by this verb only

    logger = _logger()
    relay = Relay(
        ctx.client.redis,
        ctx.client.keys,
        url,
        table=ctx.settings["outbox_table"],
        batch=ctx.settings["outbox_batch"],
        poll=ctx.settings["outbox_poll"],
        logger=logger,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    logger.info(
        "relaying the outbox %s of %s to Redis at %s",
        ctx.settings["outbox_table"],
        relay.db.url,
        ctx.client.target.redacted(),
    )
    scope = TaskScope("outbox relay", logger=logger)  # a lost cancel is cancelled again at the stop
    scope.start(relay.loop().run(), name="fencekit-outbox-relay")
    try:
        await stop.wait()
    finally:
        await scope.aclose()
        await relay.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    stats = relay.stats
    logger.info("outbox relay stopped: %d tasks enqueued, %d rows deduped", stats.relayed, stats.deduped)
    if ctx.out.as_json:
        ctx.out.json({"relayed": stats.relayed, "deduped": stats.deduped})
    return Exit.OK


VERBS = (
    Verb(
        "relay",
        "Relay the transactional outbox of a database (enqueue_in) to Redis until stopped.",
        _arguments,
        _relay,
        settings=("outbox_url", "outbox_table", "outbox_batch", "outbox_poll"),
        epilog="docs/guides/outbox.md.",
    ),
)
