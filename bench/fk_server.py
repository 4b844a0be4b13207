"""Run a fencekit ``Server`` (one process, one loop) on the bench workers.

python -m bench.fk_server REDIS_URL CONCURRENCY [LEVEL]

LEVEL (default WARNING) is the root logging level; at INFO the Server's
default logging applies (each job's start and end lines on stdout).
"""

from __future__ import annotations

import asyncio
import logging
import sys


def main() -> None:
    level = sys.argv[3] if len(sys.argv) > 3 else "WARNING"
    if level != "INFO":  # INFO: leave logging unconfigured, as a user's Server would
        logging.basicConfig(level=level)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    from bench import apps
    from fencekit import Server

    server = Server(sys.argv[1], concurrency=int(sys.argv[2]), web_port=None)
    server.add_workers(*apps.noop)
    asyncio.run(server.run())


if __name__ == "__main__":
    main()
