"""Deprecated path of :mod:`fencekit.testing.sentinel` (kept until fencekit 0.3)."""

from fencekit._compat import moved

moved(__name__, "fencekit.testing.sentinel")

from fencekit.testing.sentinel import *  # noqa: E402, F403
from fencekit.testing.sentinel import __all__  # noqa: E402, F401
