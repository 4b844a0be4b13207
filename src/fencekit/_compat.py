"""Old import paths kept for one release after the move into subpackages (0.2)."""

from __future__ import annotations

import warnings


def moved(old: str, new: str) -> None:
    """Warn once per import that module ``old`` is now ``new``."""
    warnings.warn(
        f"{old} has moved to {new}; the old path works until fencekit 0.3",
        DeprecationWarning,
        stacklevel=3,
    )
