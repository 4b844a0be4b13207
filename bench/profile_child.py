# ruff: noqa: ASYNC221, ASYNC230, C401, SIM115
"""Profile a pool child on the hot path with py-spy (``pip install py-spy``).

    python -m bench.profile_child [--procs 1] [--conc 512] [--n 1000000] [--seconds 5]
                                  [--op noop|fenced|fenced_result|...] [--level WARNING|INFO]
                                  [--keep-result SECONDS]

Fills the queue, starts ``python -m fencekit.pool --procs P``, records the first
child with ``py-spy record --format raw`` (collapsed stacks, native frames off),
and prints the functions with the most samples: self time and inclusive time.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
from pathlib import Path

import redis.asyncio as aredis

from bench import fk
from bench.common import ROOT, children_of, spawn, stop
from fencekit.testing import RedisServer


def summarise(raw: str, top: int = 25) -> str:
    self_c: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        self_c[_short(frames[-1])] += n
        for f in set(_short(x) for x in frames):
            incl[f] += n
    out = [f"{total} samples", "", "self %  function"]
    out += [f"{100 * c / total:5.1f}  {f}" for f, c in self_c.most_common(top)]
    out += ["", "inclusive %  function"]
    out += [f"{100 * c / total:5.1f}  {f}" for f, c in incl.most_common(top)]
    return "\n".join(out)


def _short(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py)"
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({path.rsplit('/', 2)[-2:] and '/'.join(path.rsplit('/', 2)[-2:])})"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--conc", type=int, default=512)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--op", default="noop")
    ap.add_argument("--level", default="WARNING", help="the pool's log level (INFO: the per-job lines)")
    ap.add_argument("--keep-result", type=float, default=0.0, help="seconds a record is kept (0: none)")
    args = ap.parse_args()
    pyspy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if pyspy is None:
        raise SystemExit("py-spy not found: pip install py-spy")
    with RedisServer() as srv:
        url = srv.url()
        r = aredis.from_url(url)
        await r.flushall()
        await fk.fill(fk.quiet_client(url, args.keep_result), args.n, args.op)
        proc = spawn(
            fk.pool_argv(url, args.procs, args.conc, level=args.level),
            ROOT / "bench" / "results" / "profile-pool.log",
        )
        try:
            await fk.wait_processed(r, [fk.stats_key("bench")], 5000, 30)
            child = children_of(proc.pid)[0]
            rec = subprocess.run(
                [
                    pyspy,
                    "record",
                    "-p",
                    str(child),
                    "-d",
                    str(args.seconds),
                    "-r",
                    "250",
                    "-f",
                    "raw",
                    "-o",
                    "/tmp/fencekit-child.raw",
                    "--nonblocking",
                ],
                capture_output=True,
                text=True,
                timeout=args.seconds + 60,
            )
            done = int(await r.hget(fk.stats_key("bench"), "processed") or 0)
        finally:
            stop(proc)
            await r.aclose()
    print(rec.stderr[-300:])
    print(f"processed so far: {done}")
    print(summarise(open("/tmp/fencekit-child.raw").read()))


if __name__ == "__main__":
    asyncio.run(main())
