"""``fencekit upgrade-keys``: move the Redis state of the published fencekit 0.1-0.6 to ours.

:mod:`~fencekit.upgrade.rules` maps old key names to ours (no I/O),
:mod:`~fencekit.upgrade.migrate` walks the keys with SCAN and runs the atomic
moves (``upgrade_move.lua``), :mod:`~fencekit.upgrade.command` is the
command line. See ``docs/upgrading.md``.
"""
