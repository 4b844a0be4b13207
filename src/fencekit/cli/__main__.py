"""``python -m fencekit.cli``: the ``fencekit`` console command (:func:`fencekit.cli.main`)."""

import sys

from fencekit.cli import main

sys.exit(main())
