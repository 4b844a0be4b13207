"""``python -m fencekit.pool.exec_child``: the entry of an exec'd child (config as JSON on stdin).

A module of its own, imported by nothing, so running it with ``-m`` does not
execute a module that the package has already imported.
"""

from fencekit.pool.child import main

main()
