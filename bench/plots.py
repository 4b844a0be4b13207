"""Charts of one ``python -m bench`` run: PNGs beside its tables, drawn with matplotlib.

    python -m bench.plots                                   # bench/results/latest.json -> bench/results/
    python -m bench.plots docs/bench/results.json --out docs/bench

The tables stay the record; a chart shows at a glance what a table of a dozen rows
makes the reader work out (how far apart the systems are, where the tail is).
:func:`write_plots` reads the dict that :mod:`bench.run` writes to ``latest.json``
and writes up to four files:

``drain.png``
    no-op jobs/s per system at 1 and 2 worker processes: fencekit's pool at the
    same N as the peers (``fk.same_n``, its best concurrency; else the best row of
    ``fk.drain``), fencekit's one-process ``Server`` (best row of ``fk.server``) and
    every peer (``peers.<name>.drain_p1`` / ``drain_p2``), with fencekit's ratio to
    the fastest peer. Needs ``fk`` or ``peers``.
``latency.png``
    idle enqueue -> start p50 / p99 / max in ms (log scale) for ``fk.latency``,
    ``fk.latency_server`` and ``peers.<name>.latency``. Only those three
    percentiles are kept in the results, not the samples, so no box plot.
``scale.png``
    µs per job (1 / drain rate) for each case of ``scale`` against its ``small``
    baseline, with ``cost_ratio``; the fenced-write case there (``op`` =
    ``"fenced"``, kept for its Redis memory) is left out.
``cases.png``
    fencekit's own cases: the best no-op drain per process count (``fk.drain``) and
    of the Server (``fk.server``), ``fk.fenced``, ``fk.fenced_result``, ``fk.sleep``,
    and the drain at INFO logging next to the same drain at WARNING when the results
    hold one. The
    INFO rows are looked for in ``fk.logging``, ``fk.drain_info`` and
    ``fk.server_info`` (a row or a list of rows, as :func:`bench.fk.drain` returns
    them) and among the rows of ``fk.drain`` / ``fk.server`` whose ``level`` or
    ``log_level`` is ``"INFO"``; a row without a level ran at WARNING (the level
    ``bench.fk.pool_argv`` and ``bench/fk_server.py`` use). No INFO row: no pair.

A missing value (a row whose run failed carries ``"error"``, a peer that could not
be installed has only ``"error"``) becomes a note where its bar would be, never an
exception; a chart whose section is absent is not written, and an older file of
that name in the folder is removed so that one folder never mixes two runs.

matplotlib (the ``bench`` extra) is imported only when a chart is drawn: a missing
matplotlib raises ``ImportError`` from :func:`write_plots`, which ``python -m bench``
reports in one line. Figures are made with ``matplotlib.figure.Figure`` and the Agg
canvas, without pyplot: no global figure registry, no GUI backend, whatever backend
the calling process has chosen.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.typing import RcKeyType  # recent matplotlib; read by type checkers only

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS = ROOT / "bench" / "results" / "latest.json"

DPI = 110
WIDTH = 8.4  # inches: 924 px at DPI (969 with the saved margin), about a GitHub README column
TIMES = "\u00d7"  # the multiplication sign of "x2.5" (ruff RUF001 flags it in a literal)

FK = "#1565c0"  # fencekit pool
FK_SERVER = "#00897b"  # fencekit Server
PEER = "#757575"
ERROR = "#c62828"
LAT = {"p50": "#37474f", "p99": "#78909c", "max": "#cfd8dc"}
CASE = {"no-op": FK, "Server": FK_SERVER, "fenced": "#6a1b9a", "sleep": "#ef6c00", "INFO": "#ad1457"}

NOTE_BOX = {"fc": "white", "ec": "none", "pad": 0.5}  # behind text that a line may cross
STYLE: dict[RcKeyType, Any] = {
    "font.size": 9.5,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "axes.labelsize": 9.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.axisbelow": True,
    "axes.grid": True,
    "axes.grid.axis": "x",
    "grid.color": "#e0e0e0",
    "grid.linewidth": 0.8,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "savefig.facecolor": "white",
}


# reading the results: every access tolerates absent keys and wrong types -----------------


def _dict(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _rows(x: Any) -> list[dict[str, Any]]:
    if isinstance(x, dict):
        return [x]
    return [r for r in x if isinstance(r, dict)] if isinstance(x, list) else []


def _num(x: Any) -> float | None:
    """A finite number, else None (NaN rates, ``None``, strings)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def _rate(row: dict[str, Any]) -> float | None:
    r = _num(row.get("rate"))
    return r if r and r > 0 else None


def _why(row: dict[str, Any], default: str = "no figure") -> str:
    err = row.get("error")
    return str(err) if err else default


def _short(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _best(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    """The row with the highest rate among ``rows`` matching ``match``; else the first failed one."""
    cand = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    ok = [r for r in cand if _rate(r)]
    if ok:
        return max(ok, key=lambda r: _rate(r) or 0.0)
    return cand[0] if cand else None


def _level(row: dict[str, Any]) -> str:
    return str(row.get("level") or row.get("log_level") or "WARNING").upper()


def _flat(label: str) -> str:
    return " ".join(label.split())


def _k(x: float) -> str:
    return f"{x:,.0f}"


def _ms(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def _tint(color: str, amount: float) -> tuple[float, float, float]:
    """``color`` mixed with white (``amount`` = share of white)."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(color)
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


# figure frame ----------------------------------------------------------------------------


def _figure(rows: int, per_row: float = 0.42, extra: float = 1.6) -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH, max(3.0, rows * per_row + extra)), dpi=DPI, layout="constrained")
    return fig, fig.add_subplot()


def _frame(
    fig: Figure,
    ax: Axes,
    results: dict[str, Any],
    title: str,
    subtitle: str,
    notes: list[str],
    legend: list[tuple[str, Any]] | None = None,
) -> None:
    """Title and a grey subtitle over the axes, a legend and a footnote (the notes, the run) under it."""
    sub = "\n".join(textwrap.fill(line, 95) for line in subtitle.split("\n"))
    ax.set_title(title, loc="left", pad=8 + 12.5 * (sub.count("\n") + 1))
    ax.annotate(
        sub, (0, 1), xycoords="axes fraction", xytext=(0, 6), textcoords="offset points", va="bottom"
    ).set(fontsize=9, color="#555555")
    if legend:
        from matplotlib.patches import Patch
        from matplotlib.transforms import ScaledTranslation

        # right of the x label (set at the left), under the tick labels
        below = ax.transAxes + ScaledTranslation(0, -16 / 72, fig.dpi_scale_trans)
        handles = [Patch(color=color, label=label) for label, color in legend]
        ax.legend(
            handles=handles,
            loc="upper right",
            bbox_to_anchor=(1, 0),
            bbox_transform=below,
            ncols=len(handles),
            borderaxespad=0,
            handlelength=1.4,
        )
        ax.set_xlabel(ax.get_xlabel(), loc="left")  # the legend is to its right
    run = f"python -m bench{' --quick' if results.get('mode') == 'quick' else ''}"
    if results.get("started"):
        run += f", {results['started']}"
    if _num(results.get("elapsed_s")):
        run += f" (run took {results['elapsed_s'] / 60:.0f} min)"
    lines = [*notes, run]
    if results.get("machine"):
        lines.append(f"Machine: {results['machine']}")
    wrapped = "\n".join(textwrap.fill(ln, 150, subsequent_indent="  ") for ln in lines)
    # as the figure's x label, so that the constrained layout makes room for it
    fig.supxlabel(wrapped, x=0.01, ha="left", fontsize=7.5, color="#616161", linespacing=1.35)


def _note(ax: Axes, x: float, y: float, text: str, color: str = ERROR) -> None:
    """A short note where a bar would start (a failed run, a missing figure)."""
    ax.annotate(
        _short(text, 70), (x, y), xytext=(4, 0), textcoords="offset points", va="center", color=color
    ).set(fontsize=8, bbox=NOTE_BOX)


def _ylabels(ax: Axes, labels: list[str], ticks: Sequence[float], bold: Iterable[int] = ()) -> None:
    ax.set_yticks(ticks, labels)
    ax.tick_params(axis="y", length=0)
    for i in bold:
        ax.get_yticklabels()[i].set_fontweight("bold")
    ax.set_ylim(len(labels) - 0.5, -0.5)  # top to bottom, room for a row that has only a note
    ax.grid(False, axis="y")


# drain.png ---------------------------------------------------------------------------------


def _drain(results: dict[str, Any]) -> Figure | None:
    fk = _dict(results.get("fk"))
    peers = _dict(results.get("peers"))
    if not fk and not peers:
        return None
    # (label, colour, {procs: row or None}, note when the system has no row at all)
    systems: list[tuple[str, str, dict[int, dict[str, Any] | None], str | None]] = []
    notes: list[str] = []
    n_same = None
    if fk:
        same = _rows(fk.get("same_n"))
        pool = {p: _best(same, procs=p) for p in (1, 2)}
        n_same = next((r.get("n") for r in pool.values() if r and _num(r.get("n"))), None)
        if not any(pool.values()):  # no same-N rows: the best of the concurrency sweep
            pool = {p: _best(_rows(fk.get("drain")), procs=p) for p in (1, 2)}
        concs = sorted({int(c) for r in pool.values() if r and (c := _num(r.get("conc")))})
        label = "fencekit pool" + (f"\n-c {' / '.join(map(str, concs))}" if concs else "")
        n = next((r.get("n") for r in pool.values() if r and _num(r.get("n"))), None)
        if n_same is None and n is not None:
            label += f", N = {_k(n)}"
        if any(pool.values()):
            systems.append((label, FK, pool, None))
        server = _best(_rows(fk.get("server")))
        if server is not None:
            n = f", N = {_k(server['n'])}" if _num(server.get("n")) else ""
            label = f"fencekit Server\n-c {server.get('conc')}{n}"
            systems.append((label, FK_SERVER, {1: server}, None))
    peer_rows: list[tuple[float, str, dict[int, dict[str, Any] | None], str | None]] = []
    for name, entry in peers.items():
        entry = _dict(entry)
        versions = str(entry.get("versions") or "").split(",")[0].strip()
        label = versions if versions.lower().startswith(name.lower()) else name
        if entry.get("error") and not any(_dict(entry.get(f"drain_p{p}")) for p in (1, 2)):
            peer_rows.append((-1.0, label, {}, f"not run: {_why(entry)}"))
            continue
        by_p: dict[int, dict[str, Any] | None] = {p: _dict(entry.get(f"drain_p{p}")) or None for p in (1, 2)}
        if not any(by_p.values()):
            peer_rows.append((-1.0, label, {}, _why(entry, "no drain figures in the results")))
            continue
        top = max((_rate(r) or 0.0) for r in by_p.values() if r is not None) if any(by_p.values()) else 0.0
        peer_rows.append((top, label, by_p, None))
    peer_rows.sort(key=lambda t: -t[0])
    systems += [(label, PEER, by_p, note) for _, label, by_p, note in peer_rows]
    if not systems:
        return None

    fastest: dict[int, tuple[str, float]] = {}
    for _, label, by_p, _ in peer_rows:
        for p, row in by_p.items():
            rate = _rate(row) if row else None
            if rate and (p not in fastest or rate > fastest[p][1]):
                fastest[p] = (label.split()[0], rate)
    top_rate = max(
        (_rate(r) or 0.0 for _, _, by_p, _ in systems for r in by_p.values() if r is not None), default=0.0
    )
    fig, ax = _figure(len(systems), per_row=0.62)
    h = 0.38
    ticks = []
    for i, (label, color, by_p, note) in enumerate(systems):
        ticks.append(i)
        if note is not None:
            _note(ax, 0, i, note)
            notes.append(f"{_flat(label)}: {note}")
            continue
        for p, dy in ((1, -h / 2), (2, h / 2)):
            y = i + dy
            row = by_p.get(p)
            shade = _tint(color, 0.55) if p == 1 else color
            if row is None:
                if p == 2 and color == FK_SERVER:
                    _note(ax, 0, y, "one process only", color="#9e9e9e")
                continue
            rate = _rate(row)
            if rate is None:
                _note(ax, 0, y, f"P={p}: {_why(row)}")
                notes.append(f"{_flat(label)} P={p}: {_why(row)}")
                continue
            ax.barh(y, rate, height=h * 0.92, color=shade)
            text = f" {_k(rate)}"
            if color == FK and p in fastest:
                text += f"  {TIMES}{rate / fastest[p][1]:.1f} vs {fastest[p][0]}"
            ax.text(rate, y, text, va="center", fontsize=8.5, fontweight="bold" if color == FK else None)
    _ylabels(ax, [s[0] for s in systems], ticks, bold=[i for i, s in enumerate(systems) if s[1] != PEER])
    ax.set_xlim(0, max(top_rate, 1.0) * 1.42)
    ax.set_xlabel("jobs/s (higher is better)")
    ax.xaxis.set_major_formatter(lambda x, _pos: f"{x / 1000:,.0f} k" if x else "0")
    n_peers = _num(n_same)
    same_n = f"N = {_k(n_peers)} for the fencekit pool and every peer" if n_peers else "N as labelled"
    _frame(
        fig,
        ax,
        results,
        "Drain: no-op jobs per second, 1 and 2 worker processes",
        f"No-op jobs pre-filled in one private Redis, {same_n};\n"
        "fencekit at the best concurrency of its sweep (-c), the Server in one process",
        notes,
        [("1 process", _tint(PEER, 0.55)), ("2 processes", PEER)],
    )
    return fig


# latency.png -------------------------------------------------------------------------------


def _latency(results: dict[str, Any]) -> Figure | None:
    fk = _dict(results.get("fk"))
    peers = _dict(results.get("peers"))
    systems: list[tuple[str, dict[str, Any]]] = []
    for key, label in (("latency", "fencekit pool"), ("latency_server", "fencekit Server")):
        if key in fk:
            row = _dict(fk[key])
            extra = [f"--procs {row['procs']}"] if row.get("procs") and key == "latency" else []
            extra += [f"-c {row['conc']}"] if row.get("conc") else []
            systems.append((f"{label}\n{' '.join(extra)}" if extra else label, row))
    peer_rows = []
    for name, entry in peers.items():
        entry = _dict(entry)
        row = _dict(entry.get("latency")) or {"error": _why(entry, "not measured")}
        peer_rows.append((name, row))
    peer_rows.sort(key=lambda t: _num(t[1].get("p50_ms")) or math.inf)
    for name, row in peer_rows:
        extra = [f"P={row['procs']}"] if row.get("procs") else []
        extra += ["partial"] if row.get("error") and _num(row.get("p50_ms")) else []
        systems.append((f"{name} ({', '.join(extra)})" if extra else name, row))
    if not systems:
        return None
    values = [
        v for _, r in systems for k in ("p50_ms", "p99_ms", "max_ms") if (v := _num(r.get(k))) and v > 0
    ]
    if not values:
        lo, hi = 0.1, 10.0
    else:
        lo, hi = min(values), max(values)
    left = 10 ** math.floor(math.log10(lo * 0.6))
    fig, ax = _figure(len(systems), per_row=0.62)
    ax.set_xscale("log")
    h = 0.26
    notes: list[str] = []
    for i, (label, row) in enumerate(systems):
        got = False
        for j, key in enumerate(("p50", "p99", "max")):
            v = _num(row.get(f"{key}_ms"))
            if v is None or v <= 0:
                continue
            got = True
            y = i + (j - 1) * h
            ax.barh(y, v - left, left=left, height=h * 0.92, color=LAT[key])
            ax.text(v, y, f" {_ms(v)}", va="center", fontsize=7.5)
        if row.get("error") or not got:
            why = _why(row, f"no samples (n = {row.get('n', '?')})")
            if not got:
                _note(ax, left, i, why)
            notes.append(f"{_flat(label)}: {why}")
    bold = [i for i, (label, _) in enumerate(systems) if label.startswith("fencekit")]
    _ylabels(ax, [s[0] for s in systems], list(range(len(systems))), bold=bold)
    ax.set_xlim(left, hi * 4)
    ax.set_xlabel("ms, enqueue → start (log scale; lower is better)")
    ax.xaxis.set_major_formatter(lambda x, _pos: f"{x:g}")
    ax.grid(True, axis="x", which="major")
    n = next((r.get("n") for _, r in systems if _num(r.get("n"))), None)
    _frame(
        fig,
        ax,
        results,
        "Idle latency: enqueue → job start",
        f"{_k(n) + ' jobs' if n else 'Jobs'}, one at a time 2 ms apart, to idle workers: p50, p99, max",
        notes,
        list(LAT.items()),
    )
    return fig


# scale.png ---------------------------------------------------------------------------------


def _scale(results: dict[str, Any]) -> Figure | None:
    sc = _dict(results.get("scale"))
    cases = [(name, r) for name, r in sc.items() if isinstance(r, dict) and r.get("op", "noop") != "fenced"]
    if not cases:
        return None
    base = _rate(_dict(sc.get("small")))
    fig, ax = _figure(len(cases), per_row=0.5)
    notes: list[str] = []
    us = [1e6 / r for _, row in cases if (r := _rate(row))]
    top = max(us, default=1.0)
    for i, (name, row) in enumerate(cases):
        rate = _rate(row)
        if rate is None:
            _note(ax, 0, i, _why(row))
            notes.append(f"{name}: {_why(row)}")
            continue
        cost = 1e6 / rate
        ax.barh(i, cost, height=0.6, color=PEER if name == "small" else FK)
        ratio = _num(row.get("cost_ratio")) or (base / rate if base else None)
        text = f" {cost:.1f} µs  ({_k(rate)} jobs/s)"
        if name == "small":
            text += "  baseline"
        elif ratio:
            text += f"  {TIMES}{ratio:.2f} the baseline"
        ax.text(cost, i, text, va="center", fontsize=8.5, bbox=NOTE_BOX)
    if base:
        ax.axvline(1e6 / base, color="#424242", linestyle="--", linewidth=0.9)
    small = _dict(sc.get("small"))
    labels = [
        f"small (N = {_k(small['n'])})" if name == "small" and _num(small.get("n")) else name
        for name, _ in cases
    ]
    _ylabels(ax, labels, list(range(len(cases))))
    ax.set_xlim(0, top * 1.75)
    ax.set_xlabel("µs of wall-clock time per job = 1 / drain rate (lower is better)")
    conc = f" -c {sc['conc']}" if sc.get("conc") else ""
    _frame(
        fig,
        ax,
        results,
        "Cost per job as the work around it grows",
        f"fencekit pool --procs 2{conc}, no-op jobs; the dashed line is the small case\n"
        f"(T6 goal: within {TIMES}1.15 of it; the 10 / 1000 queue and worker-class sweeps are not in T6)",
        notes,
    )
    return fig


# cases.png ---------------------------------------------------------------------------------


LOGGING_KEYS = ("logging", "drain_info", "server_info")


def _logging_rows(fk: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of the logging keys (a row there without a level ran at INFO), then INFO rows elsewhere."""
    rows = [
        r if r.get("level") or r.get("log_level") else {**r, "level": "INFO"}
        for key in LOGGING_KEYS
        for r in _rows(fk.get(key))
    ]
    return rows + [r for key in ("drain", "server") for r in _rows(fk.get(key)) if _level(r) == "INFO"]


def _same_runner(row: dict[str, Any], **want: Any) -> bool:
    return bool(row.get("server")) == bool(want["server"]) and all(
        row.get(k) == want[k] for k in ("procs", "conc") if not want["server"] or k == "conc"
    )


def _runner(row: dict[str, Any]) -> str:
    if row.get("server"):
        return f"Server -c {row.get('conc')}"
    return f"pool P={row.get('procs')} -c {row.get('conc')}"


def _cases(results: dict[str, Any]) -> Figure | None:
    fk = _dict(results.get("fk"))
    if not fk:
        return None
    warn_drain = [r for r in _rows(fk.get("drain")) if _level(r) != "INFO"]
    warn_server = [r for r in _rows(fk.get("server")) if _level(r) != "INFO"]
    bars: list[tuple[str, str, dict[str, Any]]] = []  # (label, kind, row)
    for p in (1, 2):
        row = _best(warn_drain, procs=p)
        if row is not None:
            bars.append((f"no-op, {_runner(row)}", "no-op", row))
    row = _best(warn_server)
    if row is not None:
        bars.append((f"no-op, {_runner(row)}", "Server", row))
    for row in _rows(fk.get("fenced")):
        bars.append((f"one fenced write, {_runner(row)}", "fenced", row))
    for row in _rows(fk.get("fenced_result")):
        bars.append((f"fenced write + result kept, {_runner(row)}", "fenced", row))
    for row in _rows(fk.get("sleep")):
        bars.append((f"asyncio.sleep(0.001), {_runner(row)}", "sleep", row))
    logged = _logging_rows(fk)
    for row in (r for r in logged if _level(r) == "INFO"):
        want = {"server": row.get("server"), "procs": row.get("procs"), "conc": row.get("conc")}
        # its WARNING twin: from the same logging rows if they hold one, else the plain drain
        twins = [r for r in logged if _level(r) != "INFO" and _same_runner(r, **want)]
        twins = twins or [r for r in warn_server + warn_drain if _same_runner(r, **want)]
        pair = _best(twins)
        if pair is not None:
            kind = "Server" if pair.get("server") else "no-op"
            bars.append((f"no-op at WARNING, {_runner(pair)}", kind, pair))
        bars.append((f"no-op at INFO, {_runner(row)}", "INFO", row))
    if not bars:
        return None
    fig, ax = _figure(len(bars), per_row=0.44)
    notes: list[str] = []
    top = max((_rate(r) or 0.0 for _, _, r in bars), default=1.0)
    for i, (label, kind, row) in enumerate(bars):
        rate = _rate(row)
        if rate is None:
            _note(ax, 0, i, _why(row))
            notes.append(f"{label}: {_why(row)}")
            continue
        ax.barh(i, rate, height=0.62, color=CASE[kind])
        n = f", N = {_k(row['n'])}" if _num(row.get("n")) else ""
        ax.text(rate, i, f" {_k(rate)}  ({1e6 / rate:.1f} µs/job{n})", va="center", fontsize=8.5)
    _ylabels(ax, [b[0] for b in bars], list(range(len(bars))))
    ax.set_xlim(0, max(top, 1.0) * 1.6)
    ax.set_xlabel("jobs/s (higher is better)")
    ax.xaxis.set_major_formatter(lambda x, _pos: f"{x / 1000:,.0f} k" if x else "0")
    if not any(_level(r) == "INFO" for r in logged):
        notes.append(
            "No drain at INFO logging in these results (looked for fk.logging, fk.drain_info, "
            "fk.server_info and rows of fk.drain / fk.server with level INFO)."
        )
    _frame(
        fig,
        ax,
        results,
        "fencekit by kind of job",
        "A pre-filled queue drained by the pool or a Server;\nlog level WARNING unless the row says INFO",
        notes,
    )
    return fig


# entry points ------------------------------------------------------------------------------

CHARTS: dict[str, Callable[[dict[str, Any]], Figure | None]] = {
    "drain": _drain,
    "latency": _latency,
    "scale": _scale,
    "cases": _cases,
}


def write_plots(results: dict[str, Any], outdir: Path) -> list[Path]:
    """Write ``<name>.png`` into ``outdir`` for each chart whose section is in ``results``.

    Returns the paths written. A chart that has nothing to show is not written and an
    older file of that name is removed. Raises ``ImportError`` without matplotlib.
    """
    import matplotlib

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with matplotlib.rc_context(STYLE):  # the caller's rcParams come back on the way out
        for name, build in CHARTS.items():
            path = outdir / f"{name}.png"
            fig = build(results)
            if fig is None:
                path.unlink(missing_ok=True)
                continue
            fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.25, metadata={"Software": None})
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "results", nargs="?", type=Path, default=DEFAULT_RESULTS, help="a results JSON of python -m bench"
    )
    ap.add_argument("--out", type=Path, help="folder for the PNGs (default: beside the results file)")
    args = ap.parse_args(argv)
    try:
        results = json.loads(args.results.read_text())
    except (OSError, ValueError) as exc:
        print(f"cannot read {args.results}: {exc}", file=sys.stderr)
        return 2
    try:
        paths = write_plots(_dict(results), args.out or args.results.parent)
    except ImportError as exc:
        print(f"plots skipped: pip install -e '.[bench]' ({exc})", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
