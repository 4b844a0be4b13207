"""``python -m bench``: the end-to-end tables (see :mod:`bench.run`)."""

import sys

from bench.run import main

sys.exit(main())
