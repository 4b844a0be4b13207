"""Drain throughput of two checkouts side by side: ``python -m bench.ab OTHER_CHECKOUT``.

Each round runs, alternately in this checkout and in ``OTHER_CHECKOUT`` (each
with its own ``.venv``), one drain per case -- a pool with 1 and 2 children
and a one-process ``Server``, N no-op tasks at concurrency 128, on a private
Redis (``bench.fk.drain``) -- and prints every figure and the ratio of the
medians, this ÷ other. Alternating rounds spread a shared machine's noise
over both sides; compare the ratios, not the absolute figures.

    python -m bench.ab ../fencekit-main --rounds 3 --n 200000 [--op fenced] [--level INFO] [--case Server]
        [--keep-result 3600] [--this-env FENCEKIT_MAX_JOBS=100000000 ...]

``--op`` picks the job (``noop``, ``fenced``, ... of ``bench.apps``) and
``--level`` the pool's log level (WARNING by default; INFO logs each job's
two lines). ``--this-env NAME=VALUE`` (repeatable) sets an environment variable for this
checkout's runs only: with ``OTHER_CHECKOUT`` a checkout of the same commit, a setting's cost
(``FENCEKIT_<SETTING>``) against its default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

CASES = (("pool --procs 1", 1, False), ("pool --procs 2", 2, False), ("Server (1 process)", 1, True))


# Runs in either checkout's interpreter: only bench.fk and fencekit.testing, which both have.
DRAIN = """
import asyncio, sys, tempfile
from pathlib import Path
from bench import fk
from fencekit.testing import RedisServer
n, procs, server, op, level = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4], sys.argv[5]
keep = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
async def run(url):
    result = await fk.drain(
        url, Path(tempfile.mkdtemp()), n=n, procs=procs, conc=128, server=server, op=op, level=level,
        keep_result=keep,
    )
    return result["rate"]
with RedisServer() as srv:
    print(asyncio.run(run(srv.url())))
"""


def in_checkout(
    root: Path,
    n: int,
    procs: int,
    server: bool,
    op: str = "noop",
    level: str = "WARNING",
    keep: float = 0.0,
    env: dict[str, str] | None = None,
) -> float:
    """One drain run by ``root``'s own interpreter in ``root`` (``env`` added to its environment);
    returns jobs/s."""
    python = root / ".venv" / "bin" / "python"
    argv = [str(python), "-c", DRAIN, str(n), str(procs), "1" if server else "0", op, level, str(keep)]
    out = subprocess.run(
        argv,
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout (with its own .venv)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument(
        "--op", default="noop", help="the job: an operation of bench.apps (noop, fenced, ...)"
    )
    parser.add_argument("--level", default="WARNING", help="the pool's log level")
    parser.add_argument("--case", default="", help="only the cases whose label contains this (e.g. Server)")
    parser.add_argument(
        "--keep-result", type=float, default=0.0, help="seconds each task's record is kept (0: none)"
    )
    parser.add_argument(
        "--this-env", action="append", default=[], metavar="NAME=VALUE", help="for this checkout's runs only"
    )
    args = parser.parse_args()
    this_env = dict(item.split("=", 1) for item in args.this_env)
    cases = [case for case in CASES if args.case in case[0]]
    here = Path(__file__).resolve().parents[1]
    sides = {"this": here, "other": args.other.resolve()}
    figures: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for side, root in sides.items():
            for label, procs, server in cases:
                env = this_env if side == "this" else None
                rate = in_checkout(root, args.n, procs, server, args.op, args.level, args.keep_result, env)
                figures.setdefault((side, label), []).append(rate)
                print(f"{side:5} {label}: {rate:,.0f} jobs/s", file=sys.stderr, flush=True)
    if this_env:
        print("this: " + " ".join(f"{k}={v}" for k, v in this_env.items()))
    print(f"| drain, {args.n:,} no-op tasks, -c 128 | other | this | this ÷ other (medians) |")
    print("|---|---|---|---|")
    for label, _, _ in cases:
        other, this = figures[("other", label)], figures[("this", label)]
        ratio = statistics.median(this) / statistics.median(other)
        print(
            f"| {label} | {' / '.join(f'{x:,.0f}' for x in other)} | "
            f"{' / '.join(f'{x:,.0f}' for x in this)} | \N{MULTIPLICATION SIGN}{ratio:.2f} |"
        )


if __name__ == "__main__":
    main()
