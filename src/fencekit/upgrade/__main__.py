"""``python -m fencekit.upgrade --from 0.6 ...``: the same as ``fencekit upgrade-keys``."""

import sys

from fencekit.upgrade.command import main

sys.exit(main(prog="python -m fencekit.upgrade"))
