"""What priorities and rate limits cost a job: ``python -m bench.flow_cost``.

Options: ``[--rounds 3] [--n 100000] [--procs 1]``.

Drains N no-op tasks (queue ``bench``) with a pool of ``--procs`` children at
concurrency 128, in alternating rounds, each on a fresh private Redis:

- ``plain``: none of the flow features (the path every job takes by default);
- ``rate limit``: the worker sets ``rate_limit = "1000000/s"`` (``bench.apps:rated``),
  so every claim runs the token bucket in ``ack_claim.lua`` but never waits;
- ``priorities``: the tasks alternate between priorities 0, 3 and -2, so every
  claim reads the priority marker and pops from several lists.

Prints every rate, the medians, their ratios to ``plain`` and the extra µs per
job. The plain path against the code before these features is an A/B of two
checkouts: ``python -m bench.ab``.
"""

from __future__ import annotations

from bench.cases import run

CASES = (
    ("plain", {"app": "bench.apps:noop"}),
    ("rate limit", {"app": "bench.apps:rated"}),
    ("priorities", {"app": "bench.apps:noop", "priorities": [0, 3, -2]}),
)


def main() -> None:
    run("python -m bench.flow_cost", __doc__.splitlines()[0], CASES)


if __name__ == "__main__":
    main()
