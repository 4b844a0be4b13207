"""The pool's embedded default: which Redis a pool with no URL uses, said in one line.

With no ``--redis-url``, no ``$FENCEKIT_REDIS_URL`` and no ``App(redis_url=...)``,
the pool takes, in this order:

1. the embedded Redis recorded in the data directory while it runs
   (:mod:`fencekit._redis.address`) -- another pool's, shared, or one whose
   process is gone (a ``Client`` that started it, a killed pool), adopted:
   this pool stops it at exit;
2. a new embedded server (:func:`fencekit._redis.embedded.start`) in the data
   directory (``--data-dir``), which this pool stops at exit.

A Redis answering on the default port is not used unless its URL is given.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from fencekit._redis import address
from fencekit._redis.embedded import Embedded, answers, start

__all__ = ["Embedded", "answers", "default_redis"]


def default_redis(data_dir: Path | None, logger: logging.Logger) -> tuple[str, Embedded | None]:
    """The URL a pool with no ``redis_url`` uses, and the server it must stop (see the module docstring)."""
    directory = data_dir or address.data_home()
    record = address.read(directory)
    if record is not None:
        if record.owner_alive:
            logger.info(
                "using the embedded Redis at %s (pid %d) that the process with pid %d runs "
                "(no Redis URL given; its record is in %s)",
                record.url,
                record.server,
                record.owner,
                directory,
            )
            return record.url, None
        address.write(directory, address.Record(record.url, record.server, os.getpid()))
        logger.warning(
            "adopting the embedded Redis at %s (pid %d) whose process is gone: this pool stops it at exit",
            record.url,
            record.server,
        )
        return record.url, Embedded(directory, None, record.server)
    return start(directory, logger, "no Redis URL given (--redis-url, FENCEKIT_REDIS_URL, App(redis_url=))")
