"""What hooks cost a job: ``python -m bench.hooks_cost [--rounds 3] [--n 100000] [--procs 1]``.

Drains N no-op tasks with a pool of ``--procs`` children, alternately with no
hooks (``bench.apps:noop``), with every job callback set to a no-op
(``bench.apps:hooked``: the events built and the calls made) and traced by
``fencekit.integrations.otel`` into an SDK provider without exporter (``bench.apps:traced``:
four spans per job), each round on a fresh private Redis; prints every rate,
the medians and their ratios to no hooks. What "no hooks" costs against the
code before hooks existed is an A/B of two checkouts: ``python -m bench.ab``.
"""

from __future__ import annotations

from bench.cases import run

CASES = (
    ("no hooks", {"app": "bench.apps:noop"}),
    ("no-op hooks", {"app": "bench.apps:hooked"}),
    ("otel spans", {"app": "bench.apps:traced"}),
)


def main() -> None:
    run("python -m bench.hooks_cost", __doc__.splitlines()[0], CASES)


if __name__ == "__main__":
    main()
