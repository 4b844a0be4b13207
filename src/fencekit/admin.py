"""Deprecated path of :mod:`fencekit.web.source` (kept until fencekit 0.3)."""

from fencekit._compat import moved

moved(__name__, "fencekit.web.source")

from fencekit.web.source import *  # noqa: E402, F403
from fencekit.web.source import __all__  # noqa: E402, F401
