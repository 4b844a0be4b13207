# ruff: noqa: B023, C408, C416, E501, RUF001
"""The end-to-end benchmark: fencekit and its peers on one private Redis, in one run.

    python -m bench                 # full sizes (about 15 minutes on 2 cores)
    python -m bench --quick         # smaller sizes, same scenarios (CI-like)
    python -m bench --only fk,scale # some sections: micro, ceiling, fk, scale, peers, typical
    python -m bench --peers huey,rq # some peers

Prints Markdown tables and writes ``bench/results/latest.json`` and ``latest.md``.
Peers run in their own virtualenvs under ``bench/.venvs`` (made on first use, see
``bench/peers/venvs.py``); a peer that cannot install or run is reported with the
reason. Nothing here asserts on speed: the targets (T1-T11 of the benchmark issues)
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

from bench import apps, ceiling, fk, typical
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
        queue_counts=(10, 100, 1000),
        op_counts=(1, 10, 100),
        n_producers=20_000,
        producers=64,
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
        queue_counts=(10, 100, 1000),
        op_counts=(1, 10, 100),
        n_producers=5_000,
        producers=64,
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
    # the same no-op drains at the pool's (and the Server's) default log level: a start and an
    # end line per job; their WARNING twins are the rows above at the same concurrency
    res["drain_info"], res["server_info"] = [], []
    for p in (1, 2):
        c = best_conc(res["drain"], p)
        r = await fk.drain(url, logdir, n=s["n_drain"], procs=p, conc=c, level="INFO")
        res["drain_info"].append(r)
        log(f"fk drain INFO p{p} c{c}: {r.get('rate', r.get('error'))}")
    c = best_conc(res["server"], 1)
    r = await fk.drain(url, logdir, n=s["n_drain"], conc=c, server=True, level="INFO")
    res["server_info"].append(r)
    log(f"fk Server INFO c{c}: {r.get('rate', r.get('error'))}")
    best = best_conc(res["drain"], 2)
    for p in (1, 2):
        r = await fk.drain(url, logdir, n=s["n_fenced"], procs=p, conc=best, op="fenced")
        res["fenced"].append(r)
        log(f"fk fenced p{p} c{best}: {r.get('rate', r.get('error'))}")
    # a fenced write and a small result kept in the task's record (written by the ack)
    res["fenced_result"] = []
    for p in (1, 2):
        r = await fk.drain(
            url, logdir, n=s["n_fenced"], procs=p, conc=best, op="fenced_result", keep_result=60
        )
        res["fenced_result"].append(r)
        log(f"fk fenced_result p{p} c{best}: {r.get('rate', r.get('error'))}")
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
    res["producers"] = await fk.producers(url, s["n_producers"], s["producers"])
    log(f"fk producers: {res['producers'].get('rate', res['producers'].get('error'))}")
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
        *(
            (
                f"{q} queues, one pool",
                dict(n=n, app=f"bench.apps:many_queues_{q}", queues=apps.queue_names(q)),
            )
            for q in s["queue_counts"]
        ),
        (f"{s['consumers']} consumers registered", dict(n=n, fake_consumers=s["consumers"] - 2)),
        *(
            (
                f"{k} worker class{'es' if k > 1 else ''} on the queue",
                dict(n=n, app=f"bench.apps:many_ops_{k}", ops=apps.op_names(k)),
            )
            for k in s["op_counts"]
        ),
    ]
    for name, kw in cases:
        r = await fk.drain(url, logdir, procs=2, conc=conc, **kw)
        res[name] = r
        log(f"scale {name}: {r.get('rate', r.get('error'))}")
    small = res["small"].get("rate")
    for name, kw in cases:
        rate = res[name].get("rate")
        res[name]["cost_ratio"] = small / rate if small and rate else None
        # the queue and worker-class sweeps are reported beside T6, not in it (T6 had 100 queues)
        if kw.get("ops") or (kw.get("queues") and len(kw["queues"]) != 100):
            res[name]["sweep"] = True
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
        entry["producers"] = one(
            "producers", "--n", str(s["n_producers"]), "--producers", str(s["producers"])
        )
        log(f"peer {peer} producers: {entry['producers'].get('rate', entry['producers'].get('error'))}")
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


def x2(a: Any, b: Any) -> str:
    return f"×{a / b:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "—"


def runner_name(r: dict[str, Any]) -> str:
    return "Server (1 process)" if r.get("server") else f"pool --procs {r.get('procs')}"


def noop_twin(fkr: dict[str, Any], r: dict[str, Any]) -> dict[str, Any]:
    """The no-op drain with the runner, procs, concurrency and log level of row ``r``."""
    info = r.get("level") == "INFO"
    if r.get("server"):
        rows = fkr.get("server_info" if info else "server", [])
    else:
        rows = fkr.get("drain_info" if info else "drain", [])
    return next(
        (
            t
            for t in rows
            if t.get("conc") == r.get("conc") and (r.get("server") or t.get("procs") == r.get("procs"))
        ),
        {},
    )


def logging_table(fkr: dict[str, Any]) -> list[str]:
    """Each INFO drain beside the WARNING drain of the same runner and concurrency."""
    info = fkr.get("drain_info", []) + fkr.get("server_info", [])
    if not info:
        return []
    rows = []
    for r in info:
        twin = noop_twin(fkr, {**r, "level": "WARNING"})
        rows.append(
            [
                runner_name(r),
                str(r.get("conc")),
                f0(r.get("n")),
                f0(r.get("rate")) if r.get("rate") else r.get("error", "—"),
                f0(twin.get("rate")),
                x2(r.get("rate"), twin.get("rate")),
            ]
        )
    return [
        "",
        "### Default logging (INFO) vs WARNING (fencekit, no-op drain)",
        "",
        *table(["runner", "concurrency", "N", "INFO jobs/s", "WARNING jobs/s", "INFO ÷ WARNING"], rows),
    ]


def server_table(fkr: dict[str, Any]) -> list[str]:
    """The one-process Server beside ``--procs 1`` at the same concurrency (and log level)."""
    pairs = [(r, noop_twin(fkr, {**r, "server": False, "procs": 1})) for r in fkr.get("server", [])]
    pairs += [(r, noop_twin(fkr, {**r, "server": False, "procs": 1})) for r in fkr.get("server_info", [])]
    pairs = [(a, b) for a, b in pairs if b]
    if not pairs:
        return []
    rows = [
        [
            str(a.get("conc")),
            a.get("level", "WARNING"),
            f0(a.get("n")),
            f0(a.get("rate")) if a.get("rate") else a.get("error", "—"),
            f0(b.get("rate")) if b.get("rate") else b.get("error", "—"),
            x2(a.get("rate"), b.get("rate")),
        ]
        for a, b in pairs
    ]
    return [
        "",
        "### Server (1 process) vs pool --procs 1 (no-op drain, same concurrency)",
        "",
        *table(
            ["concurrency", "log level", "N", "Server jobs/s", "pool --procs 1 jobs/s", "Server ÷ pool"], rows
        ),
    ]


def producers_table(fkr: dict[str, Any], peers: dict[str, Any]) -> list[str]:
    """Concurrent producers on one client: fencekit and each peer, with fencekit ÷ peer."""
    mine = fkr.get("producers", {})
    theirs = {n: p.get("producers", {}) for n, p in peers.items() if p.get("producers") or p.get("error")}
    if not mine and not theirs:
        return []
    k = mine.get("producers") or next((v.get("producers") for v in theirs.values() if v.get("producers")), 64)
    rows = [
        [
            "**fencekit**",
            f0(mine.get("n")),
            f0(mine.get("rate")) if mine.get("rate") else mine.get("error", "not in this run (section fk)"),
            "×1.0" if mine.get("rate") else "—",
            f0(fkr.get("enqueue", {}).get("single")),
            mine.get("how", "—") + (f"; error: {mine['error']}" if mine.get("error") else ""),
        ]
    ]
    for name, v in theirs.items():
        p = peers[name]
        if p.get("error") and not v:
            rows.append([name, "—", f"**not run**: {p['error']}", "—", "—", "—"])
            continue
        rows.append(
            [
                f"{name} ({p.get('versions')})",
                f0(v.get("n")),
                f0(v.get("rate")) if v.get("rate") else f"error: {v.get('error', '—')}",
                ratio(mine.get("rate"), v.get("rate")),
                f0(p.get("enqueue", {}).get("single")),
                v.get("how", "—"),
            ]
        )
    return [
        "",
        f"### {k} concurrent producers on one client (each awaits one enqueue at a time)",
        "",
        *table(
            ["system", "N", "jobs/s", "fencekit ÷ peer", "one producer (single enqueue/s)", "how"],
            rows,
        ),
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
        L += logging_table(fkr)
        L += server_table(fkr)
        L += ["", "### With work (fencekit pool)", ""]
        work = [
            ("one fenced write (`set_if_fresh`)", "fenced"),
            ("one fenced write + a small result kept in the record (`keep_result=60`)", "fenced_result"),
            ("`asyncio.sleep(0.001)`", "sleep"),
        ]
        rows = [
            [
                label,
                str(r["procs"]),
                str(r["conc"]),
                r.get("level", "WARNING"),
                f0(r["n"]),
                f0(r.get("rate")) if r.get("rate") else r.get("error", "—"),
                x2(r.get("rate"), noop_twin(fkr, r).get("rate")),
            ]
            for label, key in work
            for r in fkr.get(key, [])
        ]
        L += table(
            [
                "job",
                "procs",
                "concurrency",
                "log level",
                "N",
                "jobs/s",
                "÷ no-op drain (same procs, -c, level)",
            ],
            rows,
        )
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
    L += producers_table(fkr, peers)
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
    rp = out.get("replay")
    if rp:
        L += [
            "",
            "### Against the limit (each kind of job's Redis ceiling: the commands the drain sends for it, "
            "replayed in one script, Redis's own time, no network; bench.ceiling.replay)",
            "",
        ]
        p2 = {
            "nothing kept": best2,
            "fenced write": next((r.get("rate") for r in fkr.get("fenced", []) if r.get("procs") == 2), None),
            "fenced write + result kept": next(
                (r.get("rate") for r in fkr.get("fenced_result", []) if r.get("procs") == 2), None
            ),
        }
        rows = []
        for kind, v in rp.items():
            rate = p2.get(kind)
            rows.append(
                [
                    kind,
                    f"{v['us_per_job']:.2f}",
                    f0(v["jobs_per_s"]),
                    f0(rate) if rate else "—",
                    f"{rate / v['jobs_per_s'] * 100:.0f} %" if rate else "—",
                ]
            )
        L += table(
            ["kind of job", "Redis µs/job", "ceiling jobs/s", "fencekit P=2 drain", "% of the ceiling"], rows
        )
    ty = out.get("typical")
    if ty:
        L += [
            "",
            "### The typical job beside the peers' (one write, a small result kept; `python -m bench.typical`)",
            "",
        ]
        L += typical.render(ty)
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
        ratios = {
            k: v.get("cost_ratio")
            for k, v in sc.items()
            if isinstance(v, dict) and k != "small" and not v.get("sweep")
        }
        worst = max((v for v in ratios.values() if v), default=None)
        swept = {
            k: v["cost_ratio"]
            for k, v in sc.items()
            if isinstance(v, dict) and v.get("sweep") and v.get("cost_ratio")
        }
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
        top_sweep = max(swept, key=swept.get) if swept else None
        T["T6"] = {
            "goal": "cost per job within 15 % at scale; no memory growth",
            "measured": "worst ratio "
            + (f"{worst:.2f}" if worst else "—")
            + growth
            + (
                f"; not in the goal: the sweeps' worst {top_sweep} {swept[top_sweep]:.2f}"
                if top_sweep
                else ""
            ),
            "verdict": "met" if worst and worst <= 1.15 and not grew else "missed",
        }
    # issue 18: logging, work, concurrent producers, and the peers of the same run
    info2 = next((r for r in fkr.get("drain_info", []) if r.get("procs") == 2), {})
    warn2 = noop_twin(fkr, {**info2, "level": "WARNING"}) if info2 else {}
    if info2.get("rate") and warn2.get("rate"):
        x = info2["rate"] / warn2["rate"]
        T["T7"] = {
            "goal": "drain at the default logging (INFO) ≥ 85 % of the WARNING drain (P=2)",
            "measured": f"{f0(info2['rate'])} vs {f0(warn2['rate'])} jobs/s at -c {info2['conc']}: {x * 100:.0f} %",
            "verdict": "met" if x >= 0.85 else "missed",
        }
    fenced2 = next((r for r in fkr.get("fenced", []) if r.get("procs") == 2), {})
    twin = noop_twin(fkr, fenced2) if fenced2 else {}
    if fenced2.get("rate") and twin.get("rate"):
        x = fenced2["rate"] / twin["rate"]
        T["T8"] = {
            "goal": "one fenced write per job ≥ 50 % of the no-op drain at the same log level (P=2)",
            "measured": f"{f0(fenced2['rate'])} vs {f0(twin['rate'])} jobs/s ({fenced2.get('level', 'WARNING')}, "
            f"-c {fenced2['conc']}): {x * 100:.0f} %",
            "verdict": "met" if x >= 0.5 else "missed",
        }
    mine = fkr.get("producers", {}).get("rate")
    theirs = {
        n: p.get("producers", {}).get("rate") for n, p in peers.items() if p.get("producers", {}).get("rate")
    }
    if mine and theirs:
        top = max(theirs, key=theirs.get)
        x = mine / theirs[top]
        k = fkr["producers"].get("producers", 64)
        T["T9"] = {
            "goal": f"{k} concurrent producers on one Client ≥ 5× the fastest peer's",
            "measured": f"{f0(mine)} vs {top} {f0(theirs[top])} jobs/s: ×{x:.1f}",
            "verdict": "met" if x >= 5 else "missed",
        }
    p99s = {
        n: p.get("latency", {}).get("p99_ms")
        for n, p in peers.items()
        if p.get("latency", {}).get("p99_ms") is not None and not p.get("latency", {}).get("error")
    }
    if lat.get("p99_ms") is not None and p99s:
        top = min(p99s, key=p99s.get)
        T["T10"] = {
            "goal": "idle latency p99 at or below the best peer's (same run)",
            "measured": f"p99 {f2(lat['p99_ms'])} ms vs {top} {f2(p99s[top])} ms",
            "verdict": "met" if lat["p99_ms"] <= p99s[top] else "missed",
        }
    ty = out.get("typical")
    mine = typical.median_rate(ty["rows"].get(f"fencekit: {typical.HEADLINE}", [])) if ty else None
    top = typical.fastest_peer(ty) if ty else None
    if mine and top:
        T["T12"] = {
            "goal": "typical job (a fenced write, a small result kept; -c 32, INFO) ≥ 8× the fastest peer's",
            "measured": f"{f0(mine)} vs {top[0]} {f0(top[1])} jobs/s: ×{mine / top[1]:.1f}",
            "verdict": "met" if mine / top[1] >= 8 else "missed",
        }
    if "T1" in T:  # T1's figure against the stricter goal of issue 18
        T["T11"] = {
            "goal": "no-op drain P=2 ≥ 8× the fastest peer (same run, same N)",
            "measured": T["T1"]["measured"],
            "verdict": "met" if fk2 / max(peer_rates.values()) >= 8 else "missed",
        }
    return T


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    from fencekit.testing import RedisServer

    s = SIZES["quick" if args.quick else "full"]
    sections = (
        set(args.only.split(",")) if args.only else {"micro", "ceiling", "fk", "scale", "peers", "typical"}
    )
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
            log("ceiling: each kind of job's commands replayed in a script")
            out["replay"] = ceiling.replay(srv.port, n=100_000 if not args.quick else 20_000)
        if "fk" in sections:
            await run_fk(url, logdir, s, out)
        if "scale" in sections:
            await run_scale(url, logdir, s, out)
        if "peers" in sections:
            await asyncio.to_thread(run_peers, url, logdir, s, out, peers)
        if "typical" in sections:
            log("typical: the typical job beside the peers' (-c 32, INFO, results kept)")
            out["typical"] = await typical.run(
                url,
                logdir,
                n=s["n_peer"],
                procs=2,
                conc=32,
                rounds=1,
                peers=[p for p in peers if p in typical.PEERS],
            )
    if "micro" in sections:
        run_micro(out)
    out["elapsed_s"] = time.perf_counter() - started
    out["targets"] = targets(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (CI-like)")
    ap.add_argument("--only", help="comma-separated sections: micro,ceiling,fk,scale,peers,typical")
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
