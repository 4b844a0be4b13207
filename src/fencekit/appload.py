"""Deprecated path of :mod:`fencekit.runtime.app` (kept until fencekit 0.3)."""

from fencekit._compat import moved

moved(__name__, "fencekit.runtime.app")

from fencekit.runtime.app import *  # noqa: E402, F403
from fencekit.runtime.app import __all__  # noqa: E402, F401
