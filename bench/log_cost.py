"""The cost of one per-task log line, text against json, side by side: ``python -m bench.log_cost``.

Options: ``[--lines 200000] [--rounds 5]``. In one process, to ``/dev/null``, the consumer's
"task ... completed" line through :class:`fencekit._log.JobLines` as the pool writes it (its
fields built by ``task_fields`` when the format wants them): the text format, and
``--log-format json``; first each line written at once (outside an event loop), then as a busy
child writes them (in a loop, one write per iteration). Prints µs per line (the median of the
rounds) and the ratio json / text.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time

from fencekit._log import JobLines, line_handler
from fencekit.consume._outcomes import task_fields
from fencekit.jobs import codec

_PER_ITERATION = 64  # lines one event-loop iteration of a busy pool child logs (32 jobs)
_NULL = open("/dev/null", "w")  # noqa: SIM115 (the process's sink)


def _per_line(log_format: str, n: int, batched: bool) -> float:
    logger = logging.getLogger(f"bench.log_cost.{log_format}")
    logger.propagate = False
    logger.handlers[:] = []
    handler = line_handler(log_format)
    handler.setStream(_NULL)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    lines = JobLines(logger)
    envelope = codec.Envelope("01J0000000000000000000000", "analysis", "analyse", {}, 0, 0)

    def write(first: int, count: int) -> None:
        for i in range(first, first + count):
            extra = task_fields(envelope, "analysis", i, 0.0021) if lines.structured else None
            lines.info("task %s completed in %.3fs", "01J0000000000000000000000", 0.0021, fields=extra)

    async def in_loop() -> None:
        for first in range(0, n, _PER_ITERATION):
            write(first, _PER_ITERATION)
            await asyncio.sleep(0)  # the next iteration writes this one's lines at once

    started = time.perf_counter()
    if batched:
        asyncio.run(in_loop())
    else:
        write(0, n)
    took = time.perf_counter() - started
    logger.removeHandler(handler)
    return took / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args()
    for batched in (False, True):
        figures: dict[str, list[float]] = {"text": [], "json": []}
        for _ in range(opts.rounds):
            for log_format in figures:
                figures[log_format].append(_per_line(log_format, opts.lines, batched))
        text, json_ = (statistics.median(figures[k]) for k in ("text", "json"))
        how = f"in an event loop, {_PER_ITERATION} lines per write" if batched else "each written at once"
        print(f"one per-task line, {how}: {opts.lines:,} lines x {opts.rounds} rounds (median)")
        for name, values in figures.items():
            print(
                f"  {name:<5} {statistics.median(values):.2f} us/line   rounds: "
                + " / ".join(f"{v:.2f}" for v in values)
            )
        print(f"  json / text: x{json_ / text:.2f}")


if __name__ == "__main__":
    main()
