"""What priorities, rate limits and fair share cost a job: ``python -m bench.flow_cost``.

Options: ``[--rounds 3] [--n 100000] [--procs 1]``.

Drains N no-op tasks (queue ``bench``) with a pool of ``--procs`` children at
concurrency 128, in alternating rounds, each on a fresh private Redis:

- ``plain``: none of the flow features (the path every job takes by default);
- ``rate limit``: the worker sets ``rate_limit = "1000000/s"`` (``bench.apps:rated``),
  so every claim runs the token bucket in ``ack_claim.lua`` but never waits;
- ``rate key``: the same worker, the tasks carrying ``rate_key`` over 100 keys in
  turn (``r0`` .. ``r99``): a bucket per key, never binding;
- ``priorities``: the tasks alternate between priorities 0, 3 and -2, so every
  claim reads the priority marker and pops from several lists;
- ``fair 1 key``, ``fair 100 keys``, ``fair 10,000 keys``: the tasks carry
  ``fair_key`` over K keys in turn (``t0`` .. ), so every claim takes the keys
  from the fair ring one task a turn.

Prints every rate, the medians, their ratios to ``plain`` and the extra µs per
job, and Redis's own time per job over each drain (``INFO commandstats``, reset
once the tasks are in: ``EVALSHA`` -- the claim script, mostly -- and every
command). The plain path against the code before these features is an A/B of
two checkouts: ``python -m bench.ab``; the claim script alone, per task, is
``python -m bench.claim_cost --flow``.
"""

from __future__ import annotations

from bench.cases import run

CASES = (
    ("plain", {"app": "bench.apps:noop"}),
    ("rate limit", {"app": "bench.apps:rated"}),
    ("rate key", {"app": "bench.apps:rated", "rate_keys": 100}),
    ("priorities", {"app": "bench.apps:noop", "priorities": [0, 3, -2]}),
    ("fair 1 key", {"app": "bench.apps:noop", "fair_keys": 1}),
    ("fair 100 keys", {"app": "bench.apps:noop", "fair_keys": 100}),
    ("fair 10,000 keys", {"app": "bench.apps:noop", "fair_keys": 10_000}),
)


def main() -> None:
    run("python -m bench.flow_cost", __doc__.splitlines()[0], CASES, redis_time=True)


if __name__ == "__main__":
    main()
