"""Deprecated path of :mod:`fencekit.testing.cluster` (kept until fencekit 0.3)."""

from fencekit._compat import moved

moved(__name__, "fencekit.testing.cluster")

from fencekit.testing.cluster import *  # noqa: E402, F403
from fencekit.testing.cluster import __all__  # noqa: E402, F401
