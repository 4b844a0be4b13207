"""``python -m fencekit.pool APP ...``: run the pool from the command line."""

import sys

from fencekit.pool import main

sys.exit(main())
