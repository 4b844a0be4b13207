"""Deprecated path of :mod:`fencekit.queue.codec` (kept until fencekit 0.3)."""

from fencekit._compat import moved

moved(__name__, "fencekit.queue.codec")

from fencekit.queue.codec import *  # noqa: E402, F403
from fencekit.queue.codec import __all__  # noqa: E402, F401
