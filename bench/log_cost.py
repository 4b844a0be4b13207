"""The cost of one per-task log line, text against json, side by side: ``python -m bench.log_cost``.

Options: ``[--lines 200000] [--rounds 5]``. In one process, outside an event loop (each line is
written at once, to ``/dev/null``), the consumer's "task ... completed" line through
:class:`fencekit._log.JobLines` as the pool writes it: the text format, and ``--log-format json``
with the task's fields. Prints µs per line (the median of the rounds) and the ratio json / text.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

from fencekit._log import JobLines, line_handler

_NULL = open("/dev/null", "w")  # noqa: SIM115 (the process's sink)


def _per_line(log_format: str, n: int) -> float:
    logger = logging.getLogger(f"bench.log_cost.{log_format}")
    logger.propagate = False
    logger.handlers[:] = []
    handler = line_handler(log_format)
    handler.setStream(_NULL)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    lines = JobLines(logger)
    fields = {"jid": "01J0000000000000000000000", "queue": "analysis", "operation": "analyse"}
    started = time.perf_counter()
    for i in range(n):
        extra = {**fields, "attempt": 1, "token": i, "duration": 0.0021} if lines.structured else None
        lines.info("task %s completed in %.3fs", "01J0000000000000000000000", 0.0021, fields=extra)
    took = time.perf_counter() - started
    logger.removeHandler(handler)
    return took / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args()
    figures: dict[str, list[float]] = {"text": [], "json": []}
    for _ in range(opts.rounds):
        for log_format in figures:
            figures[log_format].append(_per_line(log_format, opts.lines))
    text, json_ = (statistics.median(figures[k]) for k in ("text", "json"))
    print(f"one per-task line, {opts.lines:,} lines x {opts.rounds} rounds (median)")
    for name, values in figures.items():
        print(
            f"  {name:<5} {statistics.median(values):.2f} us/line   rounds: "
            + " / ".join(f"{v:.2f}" for v in values)
        )
    print(f"  json / text: x{json_ / text:.2f}")


if __name__ == "__main__":
    main()
