"""``python -m fencekit``: the ``fencekit`` console command (:mod:`fencekit.cli`)."""

import sys

from fencekit.cli import main

sys.exit(main())
