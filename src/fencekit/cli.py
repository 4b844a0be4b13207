"""The ``fencekit`` console command.

``fencekit pool APP ...`` (same flags as ``python -m fencekit.pool``) and
``fencekit upgrade-keys --from 0.6 ...`` (:mod:`fencekit.upgrade.command`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``fencekit <command>``; returns the exit code (2: bad usage)."""
    args = list(sys.argv[1:] if argv is None else argv)
    usage = (
        "usage: fencekit pool APP [options]   (fencekit pool --help for the options)\n"
        "       fencekit upgrade-keys --from 0.6 [options]   (fencekit upgrade-keys --help)"
    )
    if not args:
        print(usage, file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help"):
        print(usage)
        return 0
    command, rest = args[0], args[1:]
    if command == "pool":
        from fencekit.pool.cli import main as pool_main

        return pool_main(rest, prog="fencekit pool")
    if command == "upgrade-keys":
        from fencekit.upgrade.command import main as upgrade_main

        return upgrade_main(rest, prog="fencekit upgrade-keys")
    print(f"fencekit: error: unknown command {command!r} (known: pool, upgrade-keys)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
