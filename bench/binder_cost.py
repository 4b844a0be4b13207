"""What checking a task function's plain annotations costs per job: ``python -m bench.binder_cost``.

``python -m bench.binder_cost [--rounds 5] [--n 500000]``

A task function's params are bound to its signature on the worker
(``Binder.decode``, once per job) and, since the annotation checks
(:mod:`fencekit.jobs._types`), checked against its plain annotations there and at
enqueue (``Binder.encode``). Each round times both, alternately, for the
quick start's ``send_email(to: str, *, subject: str = "")`` and the same
function without annotations (nothing to check); prints CPU ns per call, the
minima, and the difference: the checks' whole cost per job, to set against a
drain's µs per job.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from fencekit.jobs._binding import Binder


def send_email(to: str, *, subject: str = "") -> str:
    return to


def send_email_untyped(to, *, subject=""):  # type: ignore[no-untyped-def]
    return to


def per_call(fn: Callable[[], Any], n: int) -> float:
    started = time.process_time_ns()
    for _ in range(n):
        fn()
    return (time.process_time_ns() - started) / n


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.binder_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=500_000)
    args = parser.parse_args()
    params = {"to": "ada@example.com", "subject": "hi"}
    binders = {"annotated": Binder(send_email), "unannotated": Binder(send_email_untyped)}
    decode: dict[str, list[float]] = {name: [] for name in binders}
    encode: dict[str, list[float]] = {name: [] for name in binders}
    for _ in range(args.rounds):
        for name, binder in binders.items():
            decode[name].append(per_call(lambda b=binder: b.decode(params), args.n))
            encode[name].append(
                per_call(lambda b=binder: b.encode(("ada@example.com",), {"subject": "hi"}), args.n // 10)
            )
    for what, figures in (("decode (worker, per job)", decode), ("encode (enqueue, per call)", encode)):
        best = {name: min(values) for name, values in figures.items()}
        print(
            f"{what}: annotated {best['annotated']:.0f} ns, unannotated {best['unannotated']:.0f} ns, "
            f"checks +{best['annotated'] - best['unannotated']:.0f} ns"
        )


if __name__ == "__main__":
    main()
