"""Run a fencekit ``Server`` (one process, one loop) on the bench workers.

python -m bench.fk_server REDIS_URL CONCURRENCY
"""

from __future__ import annotations

import asyncio
import logging
import sys


def main() -> None:
    logging.basicConfig(level=logging.WARNING)  # no per-task INFO lines
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
