"""What a task function costs a job: ``python -m bench.tasks_cost [--rounds 3] [--n 100000] [--procs 1]``.

Drains N no-op tasks (operation ``noop`` of queue ``bench``, params
``{"i": ...}``) with a pool of ``--procs`` children at concurrency 128,
alternately served by the class worker (``bench.apps:noop``), an async task
function (``bench.apps:task_fn``: the params bound back to the signature),
a sync task function (``bench.apps:sync_task_fn``: run in the consumer's
threads, ``sync_concurrency`` 16) and a class worker with a plain ``def
perform`` (``bench.apps:sync_class``), each round on a fresh private Redis;
prints every rate, the medians, their ratios to the class worker and the
extra µs per job. What the class worker's path costs against the code
before task functions existed is an A/B of two checkouts: ``python -m bench.ab``.
"""

from __future__ import annotations

from bench.cases import run

CASES = (
    ("class worker", {"app": "bench.apps:noop"}),
    ("async task fn", {"app": "bench.apps:task_fn"}),
    ("sync task fn", {"app": "bench.apps:sync_task_fn"}),
    ("sync class", {"app": "bench.apps:sync_class"}),
)


def main() -> None:
    run("python -m bench.tasks_cost", __doc__.splitlines()[0], CASES)


if __name__ == "__main__":
    main()
