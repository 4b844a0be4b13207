# ruff: noqa: RUF001
"""The typical job beside the peers': one write and a small result kept, at the peers' usual settings.

    python -m bench.typical                                # fencekit, arq, SAQ, streaQ, taskiq, Dramatiq
    python -m bench.typical --peers taskiq,dramatiq --rounds 3

Every system drains ``--n`` (20,000) pre-enqueued jobs with ``--procs`` (2) worker
processes at concurrency ``-c`` (32) and its default log level (INFO), on one
private Redis, in alternating rounds (the median is reported):

- fencekit, ``pool --procs P -c C --log-level INFO``, the ``Client``'s default
  ``keep_result`` (3600 s): the no-op job kept in no record (the README's headline
  job, at these settings), the typical job with its fenced write riding the ack
  (``current_job().set_on_ack``, ``bench.apps.OnAckResult``), and the same with the
  write awaited (``await current_job().set_if_fresh``, ``bench.apps.FencedResult``);
- each peer (``bench/peers/run_peer.py``, in its own virtualenv) with ``--usual``:
  its no-op drain, and its typical job: one ``SET`` on its own Redis connection,
  then a small dict returned and kept by the peer's result store (each driver's
  ``KEPT`` says where and for how long). A peer's write is a plain ``SET``: none
  of them has fenced writes, so this is the nearest equivalent, not the same
  guarantee.

After each typical drain the harness counts what the jobs left (the ``bench:out:*``
keys written and the results kept), so a peer that silently kept nothing shows it.
``python -m bench`` runs the same section (``--only typical``) with one round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench import fk
from bench.common import ROOT
from bench.peers import venvs

PEERS = ("arq", "saq", "streaq", "taskiq", "dramatiq")
"""The peers that keep results: arq, SAQ, streaQ and taskiq by design, Dramatiq with its Results."""

FK_CASES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("no-op, no record", {"op": "noop", "keep_result": 0.0}),
    ("typical, write on ack", {"op": "on_ack_result", "keep_result": 3600.0}),
    ("typical, awaited write", {"op": "fenced_result", "keep_result": 3600.0}),
)
HEADLINE = "typical, write on ack"


async def run_fk_case(url: str, logdir: Path, name: str, n: int, procs: int, conc: int) -> dict[str, Any]:
    kw = dict(FK_CASES)[name]
    return await fk.drain(url, logdir, n=n, procs=procs, conc=conc, level="INFO", **kw)


def run_peer_case(
    url: str, logdir: Path, peer: str, scenario: str, n: int, procs: int, conc: int
) -> dict[str, Any]:
    """One drain of ``peer`` (``drain`` or ``typical``), ``--usual``; an error is returned, not raised."""
    ok, info = venvs.ensure(peer)
    if not ok:
        return {"error": f"cannot install: {info}"}
    argv = [
        str(venvs.python_of(peer)),
        str(ROOT / "bench" / "peers" / "run_peer.py"),
        peer,
        scenario,
        "--url", url,
        "--logdir", str(logdir),
        "--n", str(n),
        "--procs", str(procs),
        "--conc", str(conc),
        "--usual",
        "--timeout", "400",
    ]  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return {"error": f"{scenario} did not finish within 600 s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-400:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    result["versions"] = info
    return result


async def run(
    url: str, logdir: Path, *, n: int, procs: int, conc: int, rounds: int, peers: tuple[str, ...] | list[str]
) -> dict[str, Any]:
    """Every case in alternating rounds; returns the results keyed as :func:`render` reads them."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for _ in range(rounds):
        for name, _kw in FK_CASES:
            result = await run_fk_case(url, logdir, name, n, procs, conc)
            rows.setdefault(f"fencekit: {name}", []).append(result)
            print(f"fencekit {name}: {result.get('rate', result.get('error'))}", flush=True)
        for peer in peers:
            for scenario in ("drain", "typical"):
                result = await asyncio.to_thread(run_peer_case, url, logdir, peer, scenario, n, procs, conc)
                rows.setdefault(f"{peer}: {scenario}", []).append(result)
                print(f"{peer} {scenario}: {result.get('rate', result.get('error'))}", flush=True)
    return {"n": n, "procs": procs, "conc": conc, "rounds": rounds, "peers": list(peers), "rows": rows}


def median_rate(results: list[dict[str, Any]]) -> float | None:
    rates = [r["rate"] for r in results if isinstance(r.get("rate"), (int, float))]
    return statistics.median(rates) if rates else None


def fastest_peer(res: dict[str, Any], scenario: str = "typical") -> tuple[str, float] | None:
    """The peer whose ``scenario`` drained fastest (median), with its rate."""
    rates = {p: median_rate(res["rows"].get(f"{p}: {scenario}", [])) for p in res["peers"]}
    known = {p: r for p, r in rates.items() if r}
    if not known:
        return None
    top = max(known, key=lambda p: known[p])
    return top, known[top]


def render(res: dict[str, Any]) -> list[str]:
    """The side-by-side table: each system's no-op and typical drain, and fencekit's typical job ÷ each."""
    rows = res["rows"]
    mine = median_rate(rows.get(f"fencekit: {HEADLINE}", []))
    bare = median_rate(rows.get("fencekit: no-op, no record", []))
    lines = [
        f"N = {res['n']:,} jobs, {res['procs']} processes each, concurrency {res['conc']}, each system's "
        f"default log level, results kept; median jobs/s of {res['rounds']} round(s)",
        "",
        "| system | no-op | typical job | typical ÷ no-op | fencekit's typical job (write on ack) ÷ |",
        "|---|---|---|---|---|",
    ]
    for name, label in (
        ("typical, write on ack", "write on ack"),
        ("typical, awaited write", "awaited write"),
    ):
        rate = median_rate(rows.get(f"fencekit: {name}", []))
        lines.append(
            f"| **fencekit** ({label}) | {_rate(rows.get('fencekit: no-op, no record', []))} | "
            f"{_rate(rows.get(f'fencekit: {name}', []))} | {_share(rate, bare)} | {_ratio(mine, rate)} |"
        )
    kept = []
    for peer in res["peers"]:
        noop, typical = rows.get(f"{peer}: drain", []), rows.get(f"{peer}: typical", [])
        version = next((r["versions"].split(",")[0] for r in noop + typical if r.get("versions")), peer)
        rate = median_rate(typical)
        lines.append(
            f"| {version} | {_rate(noop)} | {_rate(typical)} | {_share(rate, median_rate(noop))} | "
            f"{_ratio(mine, rate)} |"
        )
        if typical:
            last = typical[-1]
            kept.append(
                f"- {version}: {last.get('kept', '?')}; after the last drain: {last.get('results', '?')} "
                f"results and {last.get('writes', '?')} written keys of 1,024; {last.get('settings', '')}"
            )
    lines += [
        "",
        "The typical job: one write, then a small dict returned and kept. fencekit's write is fenced "
        "(`set_on_ack`, or `await set_if_fresh`) and its result is kept in the job's record (`keep_result` "
        "3600 s, the default; the no-op keeps none); a peer's is a plain `SET` on its own connection, its "
        "result kept by its result store:",
        *kept,
    ]
    top = fastest_peer(res)
    if mine and top:
        lines += [
            "",
            f"fencekit's typical job ÷ the fastest peer's typical job ({top[0]}): ×{mine / top[1]:.1f}",
        ]
    return lines


def _share(part: float | None, whole: float | None) -> str:
    return f"{part / whole:.2f}" if part and whole else "—"


def _rate(results: list[dict[str, Any]]) -> str:
    rate = median_rate(results)
    if rate is None:
        errors = [r.get("error") for r in results if r.get("error")]
        return f"error: {errors[0]}" if errors else "—"
    return f"{rate:,.0f}"


def _ratio(mine: float | None, theirs: float | None) -> str:
    return f"×{mine / theirs:.1f}" if mine and theirs else "—"


async def main(args: argparse.Namespace) -> None:
    from fencekit.testing import RedisServer

    logdir = Path(tempfile.mkdtemp(prefix="fencekit-typical-"))
    peers = args.peers.split(",") if args.peers else list(PEERS)
    with RedisServer() as srv:
        res = await run(
            srv.url(), logdir, n=args.n, procs=args.procs, conc=args.c, rounds=args.rounds, peers=peers
        )
    print()
    print("\n".join(render(res)))
    print(f"\nlogs: {logdir}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.typical", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("-c", type=int, default=32, help="concurrency of each worker process")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--peers", help=f"comma-separated (default: {','.join(PEERS)})")
    asyncio.run(main(parser.parse_args()))
