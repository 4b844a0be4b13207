"""Time charts for the admin page, drawn on the server as inline SVG.

The admin page runs no JavaScript and is served with the Content-Security-Policy
``default-src 'none'; style-src 'unsafe-inline'``, so :func:`time_chart` writes its
charts as ``<svg>`` of shapes, text and presentation attributes only: no script, no
link, no external font, image or stylesheet, and no plotting library among the
runtime dependencies. Strings from the arguments are escaped and the result is
:class:`markupsafe.Markup`, for an autoescaping Jinja2 template. An SVG ``<title>``
on each bar, line marker and legend entry is its tooltip. Times are UTC, so the
same data always gives the same markup. Busy charts stay small: coordinates are
rounded to 0.1 px, a line keeps at most the lowest and highest point of each pixel
column, its markers stop above 120 points, and bars closer than 4 px are summed.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby, pairwise

from markupsafe import Markup, escape

from fencekit.errors import ConfigError

__all__ = ["Series", "time_chart"]

PALETTE = ("#3558d4", "#e07b39", "#2a9d8f", "#8e5bb5", "#8c6d46", "#d45593", "#7a8c2e", "#6b7385")
TONES = {"ok": "#1f8a4c", "bad": "#c2362f", "warn": "#b7791f"}
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_DAY = 86400
_STEPS: tuple[int, ...] = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 14400)
_STEPS += tuple(h * 3600 for h in (6, 8, 12, 24, 48, 72, 96, 168, 336, 672, 1344, 2184, 4368, 8736, 17472))
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_Points = list[tuple[float, float | None]]
TOP, BOTTOM, LEFT, RIGHT, ROW = 24, 18, 50, 14, 14  # margins and legend row height, px
CHAR = 6.5  # estimated width of one character at font-size 11, px
MARKERS, VISIBLE_MARKERS, BAR_PITCH, LABEL_MAX = 120, 40, 4, 40


@dataclass(frozen=True, slots=True)
class Series:
    """One line (or set of bars) of a chart: ``(unix seconds, value)`` points, ``None``
    for no data then; tone ``"ok"``, ``"bad"`` or ``"warn"`` for green, red or amber,
    else the palette colour of the series' position."""

    label: str
    points: Sequence[tuple[float, float | None]]
    tone: str = ""


def _f(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _text(s: str, limit: int = LABEL_MAX) -> Markup:
    """``s`` escaped, without characters XML forbids, cut to ``limit`` characters."""
    s = _NOT_XML.sub("\ufffd", str(s))
    return escape(s if len(s) <= limit else s[: limit - 1] + "…")


def _num(v: float) -> str:
    scale, suffix = next(((s, n) for s, n in ((1e9, "G"), (1e6, "M"), (1e3, "k")) if v >= s), (1.0, ""))
    v /= scale
    return (_f(v) if 1 <= v < 1000 or v == 0 else f"{v:.2g}") + suffix


def _value(v: float, unit: str, with_unit: bool = False) -> str:
    """``1.5k`` (``1.5k jobs/min`` with the unit), or for seconds ``5 ms``, ``1.2 s``."""
    if unit != "s" or v == 0:
        return _num(v) + (f" {_text(unit)}" if with_unit and unit else "")
    units = ((7200.0, 3600.0, "h"), (1000.0, 60.0, "min"), (1.0, 1.0, "s"), (1e-3, 1e-3, "ms"))
    scale, name = next(((s, n) for least, s, n in units if v >= least * 0.999999), (1e-6, "µs"))
    return f"{_num(v / scale)} {name}"


def _nice(top: float) -> tuple[float, int]:
    """The y maximum, the least 1, 2, 2.5 or 5 * 10^k >= ``top``, and its gridline count."""
    if top <= 0:
        return 1.0, 4
    k = math.floor(math.log10(top))  # maybe off by one: try k - 1 to k + 1
    steps = ((1.0, 4), (2.0, 4), (2.5, 5), (5.0, 5))
    return min((m * 10.0**e, n) for e in (k - 1, k, k + 1) for m, n in steps if m * 10.0**e >= top)


def _when(t: float, date: bool = True, clock: bool = True, seconds: bool = False) -> str:
    """``Nov 30 12:05`` in UTC, or parts of it."""
    g = time.gmtime(t)
    day = f"{_MONTHS[g.tm_mon - 1]} {g.tm_mday:02d}" if date else ""
    hour = f"{g.tm_hour:02d}:{g.tm_min:02d}" + (f":{g.tm_sec:02d}" if seconds or g.tm_sec else "")
    return f"{day} {hour}" if date and clock else day or hour


def _ticks(start: float, end: float, most: int) -> list[tuple[float, str]]:
    """4 (or fewer when ``most`` is less) to ``most`` round UTC times in [start, end], labelled."""

    def count(step: int) -> int:
        first = math.ceil(start / step) * step
        return 0 if first > end else math.floor((end - first) / step) + 1

    fits = [s for s in _STEPS if count(s) <= most] or [_STEPS[-1]]
    step = next((s for s in fits if count(s) >= min(4, most)), fits[0])
    while count(step) > most:
        step *= 2
    first, long = math.ceil(start / step) * step, end - start > 2 * _DAY
    times = [float(first + i * step) for i in range(count(step))]
    return [
        (t, _when(t, clock=False) if long and t % _DAY == 0 else _when(t, date=False, seconds=step < 60))
        for t in times
    ]


def _clean(points: Sequence[tuple[float, float | None]], start: float, end: float) -> _Points:
    """The points in [start, end], in time order; NaN and infinity as None, negative as 0."""
    kept = [(float(t), v) for t, v in points if math.isfinite(t) and start <= t <= end]
    out = [(t, None if v is None or not math.isfinite(v) else min(max(v, 0.0), 1e300)) for t, v in kept]
    return sorted(out, key=lambda p: p[0])


def _thin(coords: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The lowest and highest point of each pixel column, in order."""
    out: list[tuple[float, float]] = []
    for _, group in groupby(coords, key=lambda p: int(p[0])):
        col = list(group)
        ys = [p[1] for p in col]
        out.extend(col[i] for i in sorted({ys.index(min(ys)), ys.index(max(ys))}))
    return out


def time_chart(
    series: Sequence[Series],
    *,
    start: float,
    end: float,
    title: str,
    unit: str = "",
    kind: str = "line",
    width: int = 720,
    height: int = 180,
) -> Markup:
    """One ``<svg>`` chart of ``series`` from ``start`` to ``end`` (unix seconds).

    ``kind="line"``: a line per series, broken at each ``None``. ``kind="bars"``:
    the values stacked per timestamp; timestamps in one 4 px column are summed into
    one bar. Points outside [start, end] are dropped, negative values count as 0,
    NaN and infinity as ``None``; with no values the axes show "no data yet". Bad
    arguments (``end <= start``, another ``kind``, a size under 100) raise ConfigError.
    """
    width, height = int(width), int(height)
    if not (math.isfinite(start) and math.isfinite(end) and end > start):
        raise ConfigError(f"time_chart needs finite start < end, got start={start!r} end={end!r}")
    if kind not in ("line", "bars"):
        raise ConfigError(f"time_chart kind must be 'line' or 'bars', got {kind!r}")
    if width < 100 or height < 100:
        raise ConfigError(f"time_chart width and height must be >= 100, got {width}x{height}")
    data = [_clean(s.points, start, end) for s in series]
    colours = [TONES.get(s.tone, PALETTE[i % len(PALETTE)]) for i, s in enumerate(series)]
    labels = [_text(s.label) for s in series]

    # Legend: rows of entries under the plot, then "+N more" when they do not fit.
    max_rows = max(1, min(3, (height - TOP - BOTTOM - 40) // ROW))
    placed: list[tuple[int, float, int]] = []  # (row, x, series index or -remaining)
    x, row = 0.0, 0
    for i, label in enumerate(labels):
        w = 28 + CHAR * len(label.unescape())
        last_row, room = row == max_rows - 1, width - (0 if i == len(labels) - 1 else 60)
        if x > 0 and x + w > (room if last_row else width):
            if last_row:
                placed.append((row, min(x, width - 60.0), i - len(labels)))
                break
            x, row = 0.0, row + 1
        placed.append((row, x, i))
        x += w
    rows = max((r for r, _, _ in placed), default=-1) + 1
    left, right, top, bottom = LEFT, width - RIGHT, TOP, height - BOTTOM - rows * ROW
    pw, ph, span = right - left, bottom - top, end - start

    def px(t: float) -> float:
        return left + (t - start) / span * pw

    cols = max(1, int(pw // BAR_PITCH))
    buckets: dict[int, tuple[float, float, list[float]]] = {}  # column -> first, last, sums
    if kind == "bars":
        for i, pts in enumerate(data):
            for t, v in pts:
                if v is not None:
                    c = min(cols - 1, int((t - start) / span * cols))
                    lo, hi, sums = buckets.get(c, (t, t, [0.0] * len(data)))
                    sums[i] += v
                    buckets[c] = (min(lo, t), max(hi, t), sums)
        peak = max((sum(b[2]) for b in buckets.values()), default=0.0)
    else:
        peak = max((v for pts in data for _, v in pts if v is not None), default=0.0)
    has_data = any(v is not None for pts in data for _, v in pts)
    ymax, lines = _nice(peak)

    def py(v: float) -> float:
        return bottom - v / ymax * ph

    def tip(v: float) -> str:
        return _value(v, unit, with_unit=True)

    heading, full_title = _text(title, max(8, int(width / CHAR) - 12)), _text(title, 500)
    if unit and unit != "s":  # durations say their unit on every label
        heading += Markup(' <tspan fill-opacity="0.6" font-weight="400">· %s</tspan>') % _text(unit)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{full_title}" font-family="system-ui, sans-serif" '
        f'font-size="11" fill="currentColor"><title>{full_title}</title>',
        f'<text x="0" y="13" font-weight="600">{heading}</text>',
        '<g class="grid" stroke="currentColor" stroke-opacity="0.15">',
    ]
    marks = [(ymax * i / lines, py(ymax * i / lines)) for i in range(lines + 1)]
    ticks = [(px(t), label) for t, label in _ticks(start, end, max(2, min(7, pw // 60)))]
    out += [f'<line x1="{left}" y1="{_f(y)}" x2="{right}" y2="{_f(y)}"/>' for _, y in marks]
    out += [f'<line x1="{_f(x)}" y1="{top}" x2="{_f(x)}" y2="{bottom}"/>' for x, _ in ticks]
    out.append('</g><g class="y-axis" fill-opacity="0.7" text-anchor="end">')
    out += [f'<text x="{left - 6}" y="{_f(y + 3.5)}">{_value(v, unit)}</text>' for v, y in marks]
    out.append('</g><g class="x-axis" fill-opacity="0.7" text-anchor="middle">')
    for x, text in ticks:
        half = CHAR * len(text) / 2
        out.append(f'<text x="{_f(min(max(x, half), width - half))}" y="{bottom + 13}">{text}</text>')
    out.append(
        '</g><g class="data" fill="none" stroke-width="1.5" stroke-linejoin="round" stroke-linecap="round">'
    )
    if kind == "bars" and buckets:
        used = sorted(buckets)
        gap = min((b - a for a, b in pairwise(used)), default=cols)
        bw = min(24.0, 0.8 * gap * pw / cols)
        for c in used:
            lo, hi, sums = buckets[c]
            if not sum(sums):
                continue
            when = _when(lo) + (f" to {_when(hi)}" if hi > lo else "")
            readings = [f"{labels[i]}: {tip(v)}" for i, v in enumerate(sums) if v]
            total = f"\ntotal: {tip(sum(sums))}" if len(readings) > 1 else ""
            out.append(f"<g><title>{when}\n" + "\n".join(readings) + f"{total}</title>")
            bx, base = _f(min(left + c * pw / cols, right - bw)), float(bottom)
            for i, h in [(i, v / ymax * ph) for i, v in enumerate(sums) if v]:
                base -= h
                out.append(
                    f'<rect x="{bx}" y="{_f(base)}" width="{_f(bw)}" height="{_f(h)}" fill="{colours[i]}"/>'
                )
            out.append("</g>")
    elif kind == "line":
        for i, pts in enumerate(data):
            d: list[str] = []
            for present, run in groupby(pts, key=lambda p: p[1] is not None):
                if not present:
                    continue
                coords = [(px(t), py(v)) for t, v in run if v is not None]
                coords = _thin(coords) if len(coords) > pw else coords
                d.append(f"M{_f(coords[0][0])},{_f(coords[0][1])}")
                rest = " ".join(f"{_f(x)},{_f(y)}" for x, y in coords[1:])
                d.append(f"L{rest}" if rest else "h0")  # a lone point: a dot, by the round cap
            if d:
                out.append(f'<path d="{"".join(d)}" stroke="{colours[i]}"/>')
            shown = [(t, v) for t, v in pts if v is not None]
            if len(shown) <= MARKERS:
                hidden = ' fill-opacity="0"' if len(shown) > VISIBLE_MARKERS else ""
                for t, v in shown:
                    out.append(
                        f'<circle cx="{_f(px(t))}" cy="{_f(py(v))}" r="2.5" fill="{colours[i]}"{hidden}>'
                        f"<title>{_when(t)}\n{labels[i]}: {tip(v)}</title></circle>"
                    )
    out.append("</g>")
    if not has_data:
        out.append(
            f'<text x="{_f((left + right) / 2)}" y="{_f((top + bottom) / 2 + 4)}" text-anchor="middle" '
            'fill-opacity="0.6">no data yet</text>'
        )
    out.append('<g class="legend">')
    for r, x, i in placed:
        y = bottom + 18 + r * ROW
        if i < 0:
            out.append(f'<text x="{_f(x)}" y="{y + 9}" fill-opacity="0.7">+{-i} more</text>')
            continue
        values = [v for _, v in data[i] if v is not None]
        stats = f" (last {tip(values[-1])}, max {tip(max(values))})" if values else ""
        out.append(f"<g><title>{_text(series[i].label, 200)}{stats}</title>")
        out.append(f'<rect x="{_f(x)}" y="{y}" width="10" height="10" rx="2" fill="{colours[i]}"/>')
        out.append(f'<text x="{_f(x + 14)}" y="{y + 9}">{labels[i]}</text></g>')
    out.append("</g></svg>")
    return Markup("".join(out))
