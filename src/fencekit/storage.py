"""fencekit 0.6.1's ``fencekit.storage`` import path, kept for code written against it.

``from fencekit.storage import fenced_update, SupportsFencedUpdate`` gives the
Django helpers of :mod:`fencekit.django`.
"""

from fencekit.django import SupportsFencedUpdate, fenced_update

__all__ = ["SupportsFencedUpdate", "fenced_update"]
