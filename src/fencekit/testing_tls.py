"""Deprecated path of :mod:`fencekit.testing.tls` (kept until fencekit 0.3)."""

from fencekit._compat import moved

moved(__name__, "fencekit.testing.tls")

from fencekit.testing.tls import *  # noqa: E402, F403
from fencekit.testing.tls import __all__  # noqa: E402, F401
