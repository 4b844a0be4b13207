"""``python -m fencekit.pool._exec_child``: the entry of an exec'd child (config as JSON on stdin).

A module of its own, imported by nothing, so running it with ``-m`` does not
execute a module that the package has already imported.
"""

from fencekit.pool._child import main

main()
