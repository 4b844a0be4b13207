# ruff: noqa: B023, C408, C416, E501, RUF001
"""The end-to-end benchmark: fencekit and its peers on one private Redis, in one run.

    python -m bench                 # full sizes (about 15 minutes on 2 cores)
    python -m bench --quick         # smaller sizes, same scenarios (CI-like)
    python -m bench --only fk,scale # some sections: micro, ceiling, fk, scale, peers
    python -m bench --peers huey,rq # some peers

Prints Markdown tables and writes ``bench/results/latest.json`` and ``latest.md``.
Peers run in their own virtualenvs under ``bench/.venvs`` (made on first use, see
``bench/peers/venvs.py``); a peer that cannot install or run is reported with the
reason. Nothing here asserts on speed: the targets (T1-T6 of the benchmark issue)
are reported as met or missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import ceiling, fk
from bench.common import PY, ROOT, machine_line
from bench.peers import venvs

RESULTS = ROOT / "bench" / "results"
PEERS = list(venvs.PEERS)

SIZES = {
    "full": dict(
        n_drain=200_000,
        n_peer=20_000,
        n_scale=1_000_000,
        n_fenced=100_000,
        n_sleep=20_000,
        lat_n=1000,
        enq_single=10_000,
        enq_bulk=200_000,
        peer_enq=5_000,
        peer_bulk=20_000,
        peer_lat=1000,
        concs=(32, 128, 512),
        sleep_concs=(1, 16, 128, 512),
        scheduled=10_000,
        consumers=50,
        queues=100,
    ),
    "quick": dict(
        n_drain=50_000,
        n_peer=5_000,
        n_scale=200_000,
        n_fenced=20_000,
        n_sleep=5_000,
        lat_n=300,
        enq_single=3_000,
        enq_bulk=50_000,
        peer_enq=1_000,
        peer_bulk=5_000,
        peer_lat=300,
        concs=(128, 512),
        sleep_concs=(16, 512),
        scheduled=10_000,
        consumers=50,
        queues=100,
    ),
}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# sections ---------------------------------------------------------------------------


def run_micro(out: dict[str, Any], timeout: float = 900) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "micro.json"
    log("micro: pytest bench/ --benchmark-only")
    proc = subprocess.run(
        [
            PY,
            "-m",
            "pytest",
            "bench/",
            "--benchmark-only",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--benchmark-json={path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if not path.exists():
        out["micro"] = {"error": f"pytest exit {proc.returncode}: {proc.stdout[-500:]} {proc.stderr[-500:]}"}
        return
    data = json.loads(path.read_text())
    rows = []
    for b in data["benchmarks"]:
        per = b.get("extra_info", {}).get("tasks_per_round")
        rows.append(
            {
                "group": b["group"],
                "name": b["name"],
                "median_s": b["stats"]["median"],
                "mean_s": b["stats"]["mean"],
                "per_task_s": b["stats"]["median"] / per if per else None,
            }
        )
    out["micro"] = {"rows": rows, "exit": proc.returncode}


async def run_fk(url: str, logdir: Path, s: dict[str, Any], out: dict[str, Any]) -> None:
    res: dict[str, Any] = {"startup": [], "drain": [], "server": [], "fenced": [], "sleep": []}
    out["fk"] = res
    for p in (1, 2):
        res["startup"].append(await fk.startup(url, logdir, p))
        log(f"fk startup p{p}: {res['startup'][-1]}")
    for p in (1, 2):
        for c in s["concs"]:
            r = await fk.drain(url, logdir, n=s["n_drain"], procs=p, conc=c)
            res["drain"].append(r)
            log(f"fk drain p{p} c{c}: {r.get('rate', r.get('error'))}")
    for c in s["concs"]:
        r = await fk.drain(url, logdir, n=s["n_drain"], conc=c, server=True)
        res["server"].append(r)
        log(f"fk Server c{c}: {r.get('rate', r.get('error'))}")
    best = best_conc(res["drain"], 2)
    for p in (1, 2):
        r = await fk.drain(url, logdir, n=s["n_fenced"], procs=p, conc=best, op="fenced")
        res["fenced"].append(r)
        log(f"fk fenced p{p} c{best}: {r.get('rate', r.get('error'))}")
    for c in s["sleep_concs"]:
        r = await fk.drain(url, logdir, n=s["n_sleep"], procs=2, conc=c, op="sleep")
        res["sleep"].append(r)
        log(f"fk sleep p2 c{c}: {r.get('rate', r.get('error'))}")
    res["same_n"] = []
    for p in (1, 2):
        r = await fk.drain(url, logdir, n=s["n_peer"], procs=p, conc=best_conc(res["drain"], p))
        res["same_n"].append(r)
        log(f"fk drain same-N p{p}: {r.get('rate', r.get('error'))}")
    res["enqueue"] = await fk.enqueue(url, s["enq_single"], s["enq_bulk"])
    log(f"fk enqueue: {res['enqueue']}")
    res["latency"] = await fk.latency(url, logdir, n=s["lat_n"], procs=2, conc=16)
    log(f"fk latency pool: {res['latency']}")
    res["latency_server"] = await fk.latency(url, logdir, n=s["lat_n"], conc=16, server=True)
    log(f"fk latency Server: {res['latency_server']}")


async def run_scale(url: str, logdir: Path, s: dict[str, Any], out: dict[str, Any]) -> None:
    conc = best_conc(out.get("fk", {}).get("drain", []), 2) or 128
    n = s["n_drain"]
    res: dict[str, Any] = {"conc": conc}
    out["scale"] = res
    cases = [
        ("small", dict(n=n)),
        (f"{s['n_scale']:,} pending", dict(n=s["n_scale"], memory=True, timeout=900)),
        (f"{s['scheduled']:,} scheduled retries", dict(n=n, scheduled=s["scheduled"])),
        (
            f"{s['queues']} queues, one pool",
            dict(n=n, app="bench.apps:many_queues", queues=[f"q{i:03d}" for i in range(s["queues"])]),
        ),
        (f"{s['consumers']} consumers registered", dict(n=n, fake_consumers=s["consumers"] - 2)),
    ]
    for name, kw in cases:
        r = await fk.drain(url, logdir, procs=2, conc=conc, **kw)
        res[name] = r
        log(f"scale {name}: {r.get('rate', r.get('error'))}")
    small = res["small"].get("rate")
    for name, _ in cases:
        rate = res[name].get("rate")
        res[name]["cost_ratio"] = small / rate if small and rate else None
    # Not a scale case (a fenced write costs more than a no-op): the Redis keys N fenced jobs leave.
    name = f"{n:,} fenced jobs"
    res[name] = await fk.drain(url, logdir, procs=2, conc=conc, n=n, op="fenced", memory=True)
    log(f"scale {name}: {res[name].get('rate', res[name].get('error'))}")


def run_peers(url: str, logdir: Path, s: dict[str, Any], out: dict[str, Any], peers: list[str]) -> None:
    res: dict[str, Any] = {}
    out["peers"] = res
    script = ROOT / "bench" / "peers" / "run_peer.py"
    for peer in peers:
        log(f"peer {peer}: venv")
        ok, info = venvs.ensure(peer)
        entry: dict[str, Any] = {"versions": info if ok else None}
        res[peer] = entry
        if not ok:
            entry["error"] = f"cannot install: {info}"
            log(f"peer {peer}: {entry['error']}")
            continue
        py = str(venvs.python_of(peer))

        def one(scenario: str, *extra: str, timeout: float = 600) -> dict[str, Any]:
            argv = [py, str(script), peer, scenario, "--url", url, "--logdir", str(logdir), *extra]
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                return {"error": f"{scenario} did not finish within {timeout:.0f}s"}
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if not lines:
                return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-400:]}"}
            return json.loads(lines[-1])

        for p in (1, 2):
            entry[f"drain_p{p}"] = one(
                "drain", "--n", str(s["n_peer"]), "--procs", str(p), "--timeout", "400"
            )
            log(
                f"peer {peer} drain p{p}: {entry[f'drain_p{p}'].get('rate', entry[f'drain_p{p}'].get('error'))}"
            )
        entry["enqueue"] = one("enqueue", "--n", str(s["peer_enq"]), "--n-bulk", str(s["peer_bulk"]))
        entry["latency"] = one("latency", "--n", str(s["peer_lat"]), "--procs", "2")
        entry["settings"] = entry["drain_p1"].get("settings") or entry["enqueue"].get("settings")
        log(f"peer {peer}: enqueue {entry['enqueue'].get('single')} latency {entry['latency'].get('p50_ms')}")


def best_conc(rows: list[dict[str, Any]], procs: int) -> int:
    cand = [r for r in rows if r.get("procs") == procs and r.get("rate")]
    return max(cand, key=lambda r: r["rate"])["conc"] if cand else 128


# rendering --------------------------------------------------------------------------------


def f0(x: Any) -> str:
    return f"{x:,.0f}" if isinstance(x, (int, float)) else "—"


def f2(x: Any) -> str:
    return f"{x:.2f}" if isinstance(x, (int, float)) else "—"


def ratio(a: Any, b: Any) -> str:
    return f"×{a / b:.1f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "—"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def render(out: dict[str, Any]) -> str:
    L: list[str] = [
        f"Machine: {out['machine']}.",
        f"Mode: {out['mode']}; run took {out.get('elapsed_s', 0):.0f} s.",
        "",
    ]
    fkr = out.get("fk", {})
    peers = out.get("peers", {})
    best2 = max((r.get("rate", 0) for r in fkr.get("drain", []) if r.get("procs") == 2), default=None)
    if fkr:
        L += ["### Drain, no-op jobs (fencekit)", ""]
        st = {r["procs"]: r.get("ready_s") for r in fkr.get("startup", [])}
        rows = [
            [
                f"pool --procs {r['procs']}",
                str(r["conc"]),
                f0(r["n"]),
                f0(r.get("rate")),
                f2(r.get("first_ack_s")),
                f2(st.get(r["procs"])),
            ]
            for r in fkr.get("drain", [])
        ]
        rows += [
            [
                "Server (1 process)",
                str(r["conc"]),
                f0(r["n"]),
                f0(r.get("rate")),
                f2(r.get("first_ack_s")),
                "—",
            ]
            for r in fkr.get("server", [])
        ]
        L += table(
            ["runner", "concurrency", "N", "jobs/s", "launch → first ack s", "start-up to 'pool ready' s"],
            rows,
        )
        L += ["", "### With work (fencekit pool)", ""]
        rows = [
            [
                "one fenced write (`set_if_fresh`)",
                str(r["procs"]),
                str(r["conc"]),
                f0(r["n"]),
                f0(r.get("rate")),
            ]
            for r in fkr.get("fenced", [])
        ]
        rows += [
            ["`asyncio.sleep(0.001)`", str(r["procs"]), str(r["conc"]), f0(r["n"]), f0(r.get("rate"))]
            for r in fkr.get("sleep", [])
        ]
        L += table(["job", "procs", "concurrency", "N", "jobs/s"], rows)
        e, lat, lats = fkr.get("enqueue", {}), fkr.get("latency", {}), fkr.get("latency_server", {})
        L += ["", "### Enqueue and idle latency (fencekit)", ""]
        L += table(
            ["measure", "figure"],
            [
                [f"`enqueue`, one at a time ({f0(e.get('n_single'))})", f"{f0(e.get('single'))} jobs/s"],
                [
                    f"`enqueue_many`, batches of {e.get('batch')} ({f0(e.get('n_bulk'))})",
                    f"{f0(e.get('bulk'))} jobs/s",
                ],
                [
                    f"latency, idle pool --procs 2 -c 16, {lat.get('n')} jobs 2 ms apart",
                    f"p50 {f2(lat.get('p50_ms'))} ms, p99 {f2(lat.get('p99_ms'))} ms, max {f2(lat.get('max_ms'))} ms",
                ],
                [
                    "latency, idle Server -c 16",
                    f"p50 {f2(lats.get('p50_ms'))} ms, p99 {f2(lats.get('p99_ms'))} ms, max {f2(lats.get('max_ms'))} ms",
                ],
            ],
        )
    if peers or fkr.get("same_n"):
        same = {r["procs"]: r for r in fkr.get("same_n", [])}
        fk2 = same.get(2, {}).get("rate")
        e, lat = fkr.get("enqueue", {}), fkr.get("latency", {})
        L += ["", f"### Side by side (same Redis, same N = {f0(same.get(1, {}).get('n'))} for the drain)", ""]
        rows = [
            [
                "**fencekit**",
                f0(same.get(1, {}).get("rate")),
                f0(fk2),
                "×1.0",
                f0(e.get("single")),
                f0(e.get("bulk")),
                f"{f2(lat.get('p50_ms'))} / {f2(lat.get('p99_ms'))}",
                f"pool, -c {same.get(2, {}).get('conc')}",
            ]
        ]
        for name, p in peers.items():
            if p.get("error"):
                rows.append([name, "—", "—", "—", "—", "—", "—", f"**not run**: {p['error']}"])
                continue
            d1, d2, en, la = (p.get(k, {}) for k in ("drain_p1", "drain_p2", "enqueue", "latency"))
            errs = "; ".join(
                f"{k}: {p[k]['error']}"
                for k in ("drain_p1", "drain_p2", "enqueue", "latency")
                if p.get(k, {}).get("error")
            )
            bulk = f0(en.get("bulk")) if en.get("bulk") else f"n/a ({en.get('bulk_api', '—')})"
            rows.append(
                [
                    f"{name} ({p.get('versions')})",
                    f0(d1.get("rate")),
                    f0(d2.get("rate")),
                    ratio(fk2, d2.get("rate")),
                    f0(en.get("single")),
                    bulk,
                    f"{f2(la.get('p50_ms'))} / {f2(la.get('p99_ms'))}",
                    (p.get("settings") or "") + (f" — errors: {errs}" if errs else ""),
                ]
            )
        L += table(
            [
                "system",
                "drain P=1 jobs/s",
                "drain P=2 jobs/s",
                "fencekit P=2 ÷ peer P=2",
                "single enqueue/s",
                "bulk enqueue/s",
                "latency p50 / p99 ms",
                "settings",
            ],
            rows,
        )
    sc = out.get("scale")
    if sc:
        L += ["", f"### Scale (pool --procs 2 -c {sc['conc']}; cost per job relative to the small case)", ""]
        rows = [
            [
                name,
                f0(r.get("n")),
                f0(r.get("rate")),
                f2(r.get("cost_ratio")) if r.get("cost_ratio") else r.get("error", "—"),
            ]
            for name, r in sc.items()
            if isinstance(r, dict)
        ]
        L += table(["case", "N", "jobs/s", "cost per job ÷ small"], rows)
        big = next((r for r in sc.values() if isinstance(r, dict) and r.get("rss")), None)
        if big:
            rss = big["rss"]
            L += ["", f"### Memory (VmRSS KiB, pool --procs 2, over {f0(big['n'])} jobs)", ""]
            rows = []
            for when in ("early", "after", "idle_after"):
                v = rss.get(when, {})
                rows.append(
                    [
                        when.replace("_", " "),
                        f0(v.get("supervisor")),
                        ", ".join(f0(c) for c in v.get("children", [])),
                    ]
                )
            L += table(["when", "supervisor", "children"], rows)
        stored = [(name, r) for name, r in sc.items() if isinstance(r, dict) and r.get("redis")]
        if stored:
            L += [
                "",
                "### Redis memory (keys in db 0 and used_memory, before the fill and after the drain)",
                "",
            ]
            rows = []
            for name, r in stored:
                red = r["redis"]
                e, f, a = red.get("empty", {}), red.get("filled", {}), red.get("after", {})
                rows.append(
                    [
                        name,
                        f"{f0(e.get('keys'))} / {f0(e.get('used_memory'))}",
                        f"{f0(f.get('keys'))} / {f0(f.get('used_memory'))}",
                        f"{f0(a.get('keys'))} / {f0(a.get('used_memory'))}",
                    ]
                )
            L += table(["case", "empty: keys / bytes", "filled", "drained"], rows)
    ce = out.get("ceiling")
    if ce:
        L += ["", "### Redis ceiling (redis-benchmark, 50 clients, job cycle LPUSH + RPOP + HSET + HDEL)", ""]
        if ce.get("error"):
            L += [f"not measured: {ce['error']}"]
        else:
            rows = []
            for k, v in ce.items():
                cmds = ", ".join(f"{c} {f0(r)}" for c, r in v["commands"].items())
                rows.append(
                    [
                        k.replace("P", "-P "),
                        cmds,
                        f0(v["jobs_per_s"]),
                        f"{best2 / v['jobs_per_s'] * 100:.0f} %" if best2 else "—",
                    ]
                )
            L += table(["pipeline", "commands/s", "job cycles/s", "fencekit best P=2 drain as % of it"], rows)
    mi = out.get("micro")
    if mi:
        L += ["", "### Micro (pytest-benchmark, median)", ""]
        if mi.get("error"):
            L += [f"failed: {mi['error']}"]
        else:
            rows = [
                [
                    r["group"],
                    r["name"].split("[", 1)[-1].rstrip("]") if "[" in r["name"] else r["name"],
                    f"{r['median_s'] * 1e6:,.2f} µs",
                    f"{r['per_task_s'] * 1e6:,.2f} µs" if r.get("per_task_s") else "—",
                ]
                for r in mi["rows"]
            ]
            L += table(["group", "case", "median per call", "per task"], rows)
    t = out.get("targets")
    if t:
        L += ["", "### Targets", ""]
        L += table(
            ["target", "goal", "measured", "verdict"],
            [[k, v["goal"], v["measured"], v["verdict"]] for k, v in t.items()],
        )
    return "\n".join(L) + "\n"


def targets(out: dict[str, Any]) -> dict[str, Any]:
    T: dict[str, Any] = {}
    fkr, peers = out.get("fk", {}), out.get("peers", {})
    same = {r["procs"]: r for r in fkr.get("same_n", [])}
    fk2 = same.get(2, {}).get("rate")
    peer_rates = {
        n: p.get("drain_p2", {}).get("rate") for n, p in peers.items() if p.get("drain_p2", {}).get("rate")
    }
    if fk2 and peer_rates:
        top = max(peer_rates, key=peer_rates.get)
        x = fk2 / peer_rates[top]
        T["T1"] = {
            "goal": "drain P=2 ≥ 5× fastest peer",
            "measured": f"{f0(fk2)} vs {top} {f0(peer_rates[top])}: ×{x:.1f}",
            "verdict": "met" if x >= 5 else "missed",
        }
    best2 = max((r.get("rate", 0) for r in fkr.get("drain", []) if r.get("procs") == 2), default=None)
    ce = out.get("ceiling", {})
    if best2 and ce.get("P128"):
        frac = best2 / ce["P128"]["jobs_per_s"]
        T["T2"] = {
            "goal": "drain ≥ 30 % of Redis ceiling (pipelined)",
            "measured": f"{frac * 100:.0f} % ({f0(best2)} of {f0(ce['P128']['jobs_per_s'])})",
            "verdict": "met" if frac >= 0.3 else "missed",
        }
    lat = fkr.get("latency", {})
    if lat.get("p50_ms") is not None:
        pl = {
            n: p.get("latency", {})
            for n, p in peers.items()
            if p.get("latency", {}).get("p50_ms") is not None
        }
        ahead = all(lat["p50_ms"] < v["p50_ms"] and lat["p99_ms"] < v["p99_ms"] for v in pl.values())
        ok = lat["p50_ms"] < 0.5 and lat["p99_ms"] < 1.5 and ahead
        best_peer = min(pl, key=lambda n: pl[n]["p50_ms"]) if pl else None
        T["T3"] = {
            "goal": "idle p50 < 0.5 ms, p99 < 1.5 ms, ahead of every peer",
            "measured": f"p50 {f2(lat['p50_ms'])} / p99 {f2(lat['p99_ms'])} ms"
            + (
                f"; best peer {best_peer} {f2(pl[best_peer]['p50_ms'])} / {f2(pl[best_peer]['p99_ms'])}"
                if best_peer
                else ""
            ),
            "verdict": "met" if ok else "missed",
        }
    e = fkr.get("enqueue", {})
    if e:
        ps = {
            n: p.get("enqueue", {}).get("single")
            for n, p in peers.items()
            if p.get("enqueue", {}).get("single")
        }
        top = max(ps, key=ps.get) if ps else None
        x = e["single"] / ps[top] if top else None
        ok = e["bulk"] >= 100_000 and (x is None or x >= 2)
        T["T4"] = {
            "goal": "enqueue_many ≥ 100 k/s; single ≥ 2× fastest peer single",
            "measured": f"bulk {f0(e['bulk'])}/s; single {f0(e['single'])}/s"
            + (f" vs {top} {f0(ps[top])}/s (×{x:.2f})" if top else ""),
            "verdict": "met" if ok else "missed",
        }
    mi = out.get("micro", {}).get("rows", [])
    if mi:
        resp = {}
        for r in mi:
            if "pack_" in r["name"]:
                impl = "compiled" if "compiled" in r["name"] else "python"
                resp.setdefault(r["group"], {})[impl] = r["median_s"]
        slower = [g for g, v in resp.items() if "compiled" in v and v["compiled"] > v.get("python", 1e9)]
        hot = {
            ("lean" if "lean" in r["name"] else "redis-py"): r["median_s"]
            for r in mi
            if r["group"].startswith("claim+ack loop K=1 ")
        }
        x = hot["redis-py"] / hot["lean"] if len(hot) == 2 else None
        T["T5"] = {
            "goal": "compiled encoder never slower; lean ≥ 2× redis-py at K=1",
            "measured": f"compiled slower in {len(slower)} of {len(resp)} groups; lean ×{x:.2f} at K=1"
            if x
            else f"compiled slower in {len(slower)} groups",
            "verdict": "met" if not slower and x and x >= 2 else "missed",
        }
    sc = out.get("scale")
    if sc:
        ratios = {k: v.get("cost_ratio") for k, v in sc.items() if isinstance(v, dict) and k != "small"}
        worst = max((v for v in ratios.values() if v), default=None)
        big = next((r for r in sc.values() if isinstance(r, dict) and r.get("rss")), None)
        growth = ""
        grew = False
        if big:
            a, b = big["rss"].get("early", {}), big["rss"].get("after", {})
            if a.get("supervisor") and b.get("supervisor"):
                dsup = b["supervisor"] - a["supervisor"]
                dch = [y - x for x, y in zip(a.get("children", []), b.get("children", [])) if x and y]
                growth = (
                    f"; RSS growth supervisor {dsup:+,} KiB, children {', '.join(f'{d:+,}' for d in dch)} KiB"
                )
                grew = max([dsup, *dch]) > 0.1 * max([a["supervisor"], *a.get("children", [1])])
        T["T6"] = {
            "goal": "cost per job within 15 % at scale; no memory growth",
            "measured": "worst ratio " + (f"{worst:.2f}" if worst else "—") + growth,
            "verdict": "met" if worst and worst <= 1.15 and not grew else "missed",
        }
    return T


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    from fencekit.testing import RedisServer

    s = SIZES["quick" if args.quick else "full"]
    sections = set(args.only.split(",")) if args.only else {"micro", "ceiling", "fk", "scale", "peers"}
    peers = args.peers.split(",") if args.peers else PEERS
    RESULTS.mkdir(parents=True, exist_ok=True)
    logdir = RESULTS / "logs"
    logdir.mkdir(exist_ok=True)
    out: dict[str, Any] = {
        "machine": machine_line(),
        "mode": "quick" if args.quick else "full",
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "sizes": {k: v for k, v in s.items()},
    }
    started = time.perf_counter()
    with RedisServer() as srv:
        url = srv.url()
        if "ceiling" in sections:
            log("ceiling: redis-benchmark")
            out["ceiling"] = ceiling.run(srv.port, n=200_000 if not args.quick else 100_000)
        if "fk" in sections:
            await run_fk(url, logdir, s, out)
        if "scale" in sections:
            await run_scale(url, logdir, s, out)
        if "peers" in sections:
            await asyncio.to_thread(run_peers, url, logdir, s, out, peers)
    if "micro" in sections:
        run_micro(out)
    out["elapsed_s"] = time.perf_counter() - started
    out["targets"] = targets(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (CI-like)")
    ap.add_argument("--only", help="comma-separated sections: micro,ceiling,fk,scale,peers")
    ap.add_argument("--peers", help="comma-separated peers (default: all)")
    ap.add_argument("--no-plots", action="store_true", help="tables only, no PNG charts (bench/plots.py)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    out = runner(amain(args))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(out, indent=1, default=str))
    text = render(out)
    (RESULTS / "latest.md").write_text(text)
    print(text)
    if not args.no_plots:
        write_charts(out)
    return 0


def write_charts(out: dict[str, Any]) -> None:
    """The PNG charts beside the tables (``bench/plots.py``); never fails the run."""
    try:
        from bench.plots import write_plots

        paths = write_plots(out, RESULTS)
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "matplotlib":
            log("plots skipped: pip install -e '.[bench]'")
        else:
            log(f"plots failed: {exc}")
        return
    except Exception as exc:  # the tables and latest.json are written: regenerate with python -m bench.plots
        log(f"plots failed: {type(exc).__name__}: {exc}")
        return
    for path in paths:
        log(f"chart: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
