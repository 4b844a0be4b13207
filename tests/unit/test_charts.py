"""fencekit.web._charts: server-side SVG time charts, checked by parsing what they draw."""

from __future__ import annotations

import math
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
from markupsafe import Markup

from fencekit.errors import ConfigError
from fencekit.web._charts import PALETTE, TONES, Series, time_chart

NS = "{http://www.w3.org/2000/svg}"
EMITTED = {"svg", "title", "text", "tspan", "g", "line", "rect", "circle", "path"}
T0 = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
HOUR, DAY = 3600.0, 86400.0
HOSTILE = ["<img/src=x/onerror=alert(1)>", '"><script>alert(1)</script>', "a&b<c>'d\"", "]]><!--", "&amp;"]


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    tags = {el.tag.removeprefix(NS) for el in root.iter()}
    assert tags <= EMITTED, tags - EMITTED
    assert all(el.tag.startswith(NS) for el in root.iter())
    return root


def find(root: ET.Element, path: str) -> list[ET.Element]:
    return root.findall(path.replace("svg:", NS))


def group(root: ET.Element, cls: str) -> ET.Element:
    (g,) = [el for el in root.iter(f"{NS}g") if el.get("class") == cls]
    return g


def y_labels(root: ET.Element) -> list[str]:
    return [t.text or "" for t in group(root, "y-axis")]


def x_labels(root: ET.Element) -> list[str]:
    return [t.text or "" for t in group(root, "x-axis")]


def gridlines(root: ET.Element) -> list[float]:
    """The y of each horizontal gridline, top first."""
    return sorted(float(el.get("y1", "")) for el in group(root, "grid") if el.get("y1") == el.get("y2"))


def number(label: str) -> float:
    m = re.fullmatch(r"([0-9.e+-]+)([kMG]?)", label)
    assert m, label
    return float(m[1]) * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}[m[2]]


def path_segments(d: str) -> list[list[tuple[float, float]]]:
    segments = []
    for part in re.findall(r"M[^M]*", d):
        nums = [float(n) for n in re.findall(r"-?[0-9.]+", part.replace("h0", ""))]
        segments.append(list(zip(nums[::2], nums[1::2])))
    return segments


def coordinates(root: ET.Element) -> Iterator[tuple[float, float]]:
    """Every point drawn, including the far corners of rects and circles."""
    for el in root.iter():
        a = {
            k: float(v)
            for k, v in el.attrib.items()
            if k in {"x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "r"}
        }
        tag = el.tag.removeprefix(NS)
        if tag == "rect":
            x, y = a["x"], a["y"]
            yield x, y
            yield x + float(el.get("width", "")), y + float(el.get("height", ""))
        elif tag == "circle":
            yield a["cx"] - a["r"], a["cy"] - a["r"]
            yield a["cx"] + a["r"], a["cy"] + a["r"]
        elif tag == "line":
            yield a["x1"], a["y1"]
            yield a["x2"], a["y2"]
        elif tag == "text":
            yield a["x"], a["y"]
        elif tag == "path":
            for segment in path_segments(el.get("d", "")):
                yield from segment


def assert_inside(root: ET.Element) -> None:
    _, _, w, h = (float(v) for v in root.get("viewBox", "").split())
    for x, y in coordinates(root):
        assert 0 <= x <= w, (x, y)
        assert 0 <= y <= h, (x, y)


def wave(
    n: int, step: float = 60.0, scale: float = 100.0, phase: float = 0.0
) -> list[tuple[float, float | None]]:
    return [(T0 + i * step, scale * (1 + math.sin(i / 50 + phase))) for i in range(n)]


BUSY = [Series(f"queue-{i}", wave(2880, phase=i)) for i in range(10)]
CASES: dict[str, list[Series]] = {
    "empty": [],
    "no points": [Series("a", [])],
    "all none": [Series("a", [(T0, None), (T0 + 60, None)]), Series("b", [(T0 + 5, None)])],
    "sparse": [Series("a", [(T0 + 100, 3.0), (T0 + 2000, 1.0)]), Series("b", [(T0 + 1800, 2.5)])],
    "one point": [Series("a", [(T0 + 1800, 7.0)])],
    "busy": BUSY,
    "all zero": [Series("a", [(T0 + i * 60, 0.0) for i in range(60)])],
    "gaps": [Series("a", [(T0 + i * 60, None if i % 3 else float(i)) for i in range(60)])],
    "out of range": [Series("a", [(T0 - 600, 1e9), (T0 + 60, 4.0), (T0 + 2 * HOUR, 1e9)])],
    "only out of range": [Series("a", [(T0 - 600, 5.0), (T0 + 7200, 5.0)])],
    "negative": [Series("a", [(T0 + i * 60, -float(i)) for i in range(60)])],
    "nan and inf": [
        Series("a", [(T0 + 60, math.nan), (T0 + 120, math.inf), (T0 + 180, -math.inf), (T0 + 240, 2.0)]),
        Series("b", [(math.nan, 3.0), (math.inf, 3.0), (T0 + 300, 1.0)]),
    ],
    "unsorted": [Series("a", [(T0 + 900, 2.0), (T0 + 60, 1.0), (T0 + 300, 5.0)])],
    "huge": [Series("a", [(T0 + 60, 1e308), (T0 + 120, 1.7e308)])],
    "tiny": [Series("a", [(T0 + 60, 1e-300), (T0 + 120, 5e-324)])],
    "many series": [Series(f"series number {i} with a long name", wave(30, phase=i)) for i in range(30)],
}


@pytest.mark.parametrize("kind", ["line", "bars"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_input_gives_a_well_formed_svg_inside_its_viewbox(case: str, kind: str) -> None:
    end = T0 + 2 * DAY if case == "busy" else T0 + HOUR
    svg = time_chart(CASES[case], start=T0, end=end, title=f"{case} chart", unit="jobs/min", kind=kind)
    assert isinstance(svg, Markup)
    root = parse(svg)
    assert root.tag == f"{NS}svg"
    assert root.get("viewBox") == "0 0 720 180"
    assert (root.get("width"), root.get("height"), root.get("role")) == ("720", "180", "img")
    assert root.get("aria-label") == f"{case} chart"
    assert root[0].tag == f"{NS}title"
    assert root[0].text == f"{case} chart"
    assert_inside(root)
    no_data = [t for t in root.iter(f"{NS}text") if t.text == "no data yet"]
    assert bool(no_data) == (case in {"empty", "no points", "all none", "only out of range"})
    assert 3 <= len(gridlines(root)) - 1 <= 5
    top = number(y_labels(root)[-1])
    assert top >= 1 or case == "tiny"
    assert math.isfinite(top)


@pytest.mark.parametrize("kind", ["line", "bars"])
@pytest.mark.parametrize("size", [(100, 100), (300, 120), (1200, 400)])
def test_small_and_large_sizes_stay_inside(kind: str, size: tuple[int, int]) -> None:
    w, h = size
    root = parse(
        time_chart(
            CASES["many series"], start=T0, end=T0 + HOUR, title="t" * 300, kind=kind, width=w, height=h
        )
    )
    assert root.get("viewBox") == f"0 0 {w} {h}"
    assert_inside(root)
    assert 2 <= len(x_labels(root)) <= max(2, min(7, (w - 64) // 60))  # about 60 px apart at least


@pytest.mark.parametrize("label", HOSTILE)
@pytest.mark.parametrize("kind", ["line", "bars"])
def test_hostile_labels_titles_and_units_stay_text(label: str, kind: str) -> None:
    series = [Series(label, [(T0 + 60, 1.0), (T0 + 120, 2.0)]), Series("other", [(T0 + 60, 1.0)])]
    svg = time_chart(series, start=T0, end=T0 + HOUR, title=label, unit=label, kind=kind)
    root = parse(svg)  # only the elements the chart emits, in the svg namespace
    assert root.get("aria-label") == label
    assert root[0].text == label
    texts = ["".join(el.itertext()) for el in root.iter(f"{NS}text")]
    assert label in texts  # the legend entry
    assert texts[0] == f"{label} · {label}"  # the heading, then the unit
    tooltips = [el.text or "" for el in root.iter(f"{NS}title")]
    assert any(label in t for t in tooltips[1:])
    assert "<script" not in svg.lower()
    assert "<img" not in svg.lower()


def test_characters_xml_cannot_hold_are_replaced() -> None:
    root = parse(
        time_chart([Series("a\x00b\x1bc\ud800", [(T0 + 60, 1.0)])], start=T0, end=T0 + HOUR, title="x\x07")
    )
    assert root.get("aria-label") == "x\ufffd"
    assert "a\ufffdb\ufffdc\ufffd" in ["".join(t.itertext()) for t in root.iter(f"{NS}text")]


def test_long_labels_are_cut_before_escaping() -> None:
    series = [Series("&" * 100, [(T0 + 60, 1.0)]), Series("q" * 40, [(T0 + 60, 1.0)])]
    root = parse(time_chart(series, start=T0, end=T0 + HOUR, title="t"))
    legend = [t.text for t in group(root, "legend").iter(f"{NS}text")]
    assert legend == ["&" * 39 + "…", "q" * 40]
    assert root.find(f".//{NS}g[@class='legend']/{NS}g/{NS}title") is not None
    full = [t.text or "" for t in group(root, "legend").iter(f"{NS}title")]
    assert full[0].startswith("&" * 100)


def test_legend_overflow_says_how_many_are_left_out() -> None:
    root = parse(time_chart(CASES["many series"], start=T0, end=T0 + HOUR, title="t"))
    legend = [t.text or "" for t in group(root, "legend").iter(f"{NS}text")]
    shown = [t for t in legend if t.startswith("series")]
    assert legend[-1] == f"+{30 - len(shown)} more"
    assert 3 <= len(shown) < 30


@pytest.mark.parametrize(
    ("peak", "expected"),
    [(0.003, 0.005), (0.7, 1), (1, 1), (1.01, 2), (2.2, 2.5), (3, 5), (7.5, 10), (42, 50), (999, 1000),
     (1001, 2000), (2400, 2500), (12345, 20000), (2.6e6, 5e6)],
)  # fmt: skip
def test_y_axis_max_is_the_least_nice_number_above_every_value(peak: float, expected: float) -> None:
    series = [Series("a", [(T0 + 60, peak / 3), (T0 + 120, peak), (T0 + 180, peak / 2)])]
    root = parse(time_chart(series, start=T0, end=T0 + HOUR, title="t"))
    labels = [number(label) for label in y_labels(root)]
    assert labels[0] == 0
    assert labels[-1] == pytest.approx(expected)
    assert labels[-1] >= peak
    assert labels == sorted(labels)
    assert 3 <= len(labels) - 1 <= 5
    steps = {round(b - a, 12) for a, b in pairwise(labels)}
    assert len(steps) == 1, labels
    top = gridlines(root)[0]
    (path,) = find(root, ".//svg:path")
    highest = min(y for segment in path_segments(path.get("d", "")) for _, y in segment)
    assert highest >= top - 0.05  # no point above the axis maximum
    if peak == expected:
        assert highest == pytest.approx(top, abs=0.05)


def test_y_axis_of_zeros_and_of_nothing_goes_to_one() -> None:
    for series in (CASES["all zero"], CASES["empty"], CASES["negative"]):
        assert number(y_labels(parse(time_chart(series, start=T0, end=T0 + HOUR, title="t")))[-1]) == 1


@pytest.mark.parametrize(
    ("peak", "unit", "labels"),
    [
        (1400, "", ["0", "500", "1k", "1.5k", "2k"]),
        (1.7e6, "jobs/min", ["0", "500k", "1M", "1.5M", "2M"]),
        (220, "tasks", ["0", "50", "100", "150", "200", "250"]),
        (0.7, "", ["0", "0.25", "0.5", "0.75", "1"]),
        (0.004, "s", ["0", "1 ms", "2 ms", "3 ms", "4 ms", "5 ms"]),
        (1.1, "s", ["0", "500 ms", "1 s", "1.5 s", "2 s"]),
        (0.0009, "s", ["0", "250 µs", "500 µs", "750 µs", "1 ms"]),
        (100, "s", ["0", "25 s", "50 s", "75 s", "100 s"]),
        (1200, "s", ["0", "500 s", "16.7 min", "25 min", "33.3 min"]),
        (4e4, "s", ["0", "2.8 h", "5.6 h", "8.3 h", "11.1 h", "13.9 h"]),
    ],
)
def test_y_labels_are_compact(peak: float, unit: str, labels: list[str]) -> None:
    series = [Series("a", [(T0 + 60, peak)])]
    assert y_labels(parse(time_chart(series, start=T0, end=T0 + HOUR, title="t", unit=unit))) == labels


def test_unit_is_shown_and_tooltips_carry_it() -> None:
    root = parse(
        time_chart([Series("a", [(T0 + 40, 42.0)])], start=T0, end=T0 + HOUR, title="T", unit="jobs/min")
    )
    (heading, *_) = root.iter(f"{NS}text")
    assert "".join(heading.itertext()) == "T · jobs/min"
    tooltips = [t.text or "" for t in root.iter(f"{NS}title")]
    assert "Nov 14 22:14\na: 42 jobs/min" in tooltips


@pytest.mark.parametrize("span", [HOUR / 60, 600, HOUR, 5000, 6 * HOUR, DAY, 2 * DAY])
@pytest.mark.parametrize("offset", [0, 17, 1234.5])
def test_short_ranges_have_4_to_7_round_clock_ticks(span: float, offset: float) -> None:
    root = parse(time_chart([], start=T0 + offset, end=T0 + offset + span, title="t"))
    labels = x_labels(root)
    assert 4 <= len(labels) <= 7, labels
    pattern = r"\d\d:\d\d:\d\d" if span < 300 else r"\d\d:\d\d"
    assert all(re.fullmatch(pattern, label) for label in labels), labels
    if span >= HOUR:
        assert all(label.endswith(("0", "5")) for label in labels), labels
    assert len(set(labels)) == len(labels) or span == 2 * DAY


def test_one_hour_ticks() -> None:
    labels = x_labels(parse(time_chart([], start=T0, end=T0 + HOUR, title="t")))
    assert labels == ["22:20", "22:30", "22:40", "22:50", "23:00", "23:10"]


@pytest.mark.parametrize("days", [3, 5, 7, 30, 90, 365])
def test_long_ranges_have_4_to_7_date_ticks(days: int) -> None:
    labels = x_labels(parse(time_chart([], start=T0, end=T0 + days * DAY, title="t")))
    assert 4 <= len(labels) <= 7, labels
    months = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
    dates = [label for label in labels if re.fullmatch(rf"({months}) \d\d", label)]
    assert dates, labels
    if days >= 4:
        assert dates == labels
    else:
        assert all(label == "12:00" for label in labels if label not in dates)


def test_ninety_days_and_month_end() -> None:
    start = 1_732_665_600.0  # 2024-11-27 00:00 UTC
    assert x_labels(parse(time_chart([], start=start, end=start + 6 * DAY, title="t"))) == [
        "Nov 27", "Nov 28", "Nov 29", "Nov 30", "Dec 01", "Dec 02", "Dec 03",
    ]  # fmt: skip
    labels = x_labels(parse(time_chart([], start=start, end=start + 90 * DAY, title="t")))
    assert all(re.fullmatch(r"[A-Z][a-z]{2} \d\d", label) for label in labels)
    assert 4 <= len(labels) <= 7


def test_output_does_not_depend_on_the_local_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    def draw() -> str:
        return time_chart(CASES["sparse"], start=T0, end=T0 + 5 * DAY, title="t", kind="bars") + time_chart(
            CASES["gaps"], start=T0, end=T0 + HOUR, title="t"
        )

    before = draw()
    try:
        for zone in ("America/Los_Angeles", "Asia/Kolkata", "Pacific/Chatham"):
            monkeypatch.setenv("TZ", zone)
            time.tzset()
            assert draw() == before
    finally:
        monkeypatch.undo()
        time.tzset()


def test_a_gap_breaks_the_line() -> None:
    points: list[tuple[float, float | None]] = [(T0 + i * 60, float(i)) for i in range(10)]
    points[5] = (points[5][0], None)
    root = parse(time_chart([Series("a", points)], start=T0, end=T0 + HOUR, title="t"))
    (path,) = find(root, ".//svg:path")
    assert [len(s) for s in path_segments(path.get("d", ""))] == [5, 4]
    lone = [(T0 + 60, 1.0), (T0 + 120, None), (T0 + 180, 2.0), (T0 + 240, None)]
    (path,) = find(parse(time_chart([Series("a", lone)], start=T0, end=T0 + HOUR, title="t")), ".//svg:path")
    assert path.get("d", "").count("M") == 2
    assert path.get("d", "").count("h0") == 2  # a lone point is drawn as a dot


def test_nan_is_a_gap_and_negative_is_zero() -> None:
    points = [(T0 + 60, 1.0), (T0 + 120, math.nan), (T0 + 180, 2.0), (T0 + 240, -5.0)]
    root = parse(time_chart([Series("a", points)], start=T0, end=T0 + HOUR, title="t"))
    (path,) = find(root, ".//svg:path")
    segments = path_segments(path.get("d", ""))
    assert len(segments) == 2
    baseline = gridlines(root)[-1]
    assert segments[1][-1][1] == pytest.approx(baseline, abs=0.05)
    assert number(y_labels(root)[-1]) == 2


def test_points_outside_the_range_are_dropped() -> None:
    root = parse(time_chart(CASES["out of range"], start=T0, end=T0 + HOUR, title="t"))
    assert number(y_labels(root)[-1]) == 5
    assert len(find(root, ".//svg:g[@class='data']/svg:circle")) == 1


def test_markers_with_tooltips_only_for_short_series() -> None:
    short = parse(time_chart([Series("a", wave(120))], start=T0, end=T0 + 3 * HOUR, title="t"))
    circles = find(short, ".//svg:g[@class='data']/svg:circle")
    assert len(circles) == 120
    assert all(c.find(f"{NS}title") is not None for c in circles)
    long = parse(time_chart([Series("a", wave(121))], start=T0, end=T0 + 3 * HOUR, title="t"))
    assert find(long, ".//svg:circle") == []


def bar_groups(root: ET.Element) -> list[ET.Element]:
    return [g for g in group(root, "data") if g.tag == f"{NS}g"]


def test_bars_stack_to_the_sum() -> None:
    series = [
        Series("a", [(T0 + i * 300, float(i)) for i in range(12)]),
        Series("b", [(T0 + i * 300, 2.0 * i if i % 2 else None) for i in range(12)], tone="bad"),
        Series("c", [(T0 + i * 300, 5.0) for i in range(12)], tone="ok"),
    ]
    root = parse(time_chart(series, start=T0, end=T0 + HOUR, title="t", kind="bars"))
    ymax = number(y_labels(root)[-1])
    top, baseline = gridlines(root)[0], gridlines(root)[-1]
    groups = bar_groups(root)
    assert len(groups) == 12
    assert ymax == 50  # the tallest stack: 11 + 22 + 5 = 38
    for i, g in enumerate(groups):
        total = i + (2 * i if i % 2 else 0) + 5
        rects = find(g, "svg:rect")
        assert len(rects) == (3 if i % 2 else 2) - (i == 0)
        heights = [float(r.get("height", "")) for r in rects]
        assert sum(heights) == pytest.approx(total / ymax * (baseline - top), abs=0.06 * len(rects))
        bottom = max(float(r.get("y", "")) + float(r.get("height", "")) for r in rects)
        assert bottom == pytest.approx(baseline, abs=0.1)
        assert rects[-1].get("fill") == TONES["ok"]
        title = g.find(f"{NS}title")
        assert title is not None
        assert title.text is not None
        assert title.text.endswith(f"total: {total}") or len(rects) == 1


def test_bars_closer_than_a_column_are_summed() -> None:
    ones = [Series("a", [(T0 + i * 60, 1.0) for i in range(2880)])]
    root = parse(time_chart(ones, start=T0, end=T0 + 2 * DAY, title="t", kind="bars"))
    groups = bar_groups(root)
    assert 100 < len(groups) <= (720 - 64) // 4
    ymax, plot = number(y_labels(root)[-1]), gridlines(root)[-1] - gridlines(root)[0]
    drawn = sum(float(r.get("height", "")) for r in group(root, "data").iter(f"{NS}rect"))
    assert drawn / plot * ymax == pytest.approx(2880, abs=len(groups) * 0.05 / plot * ymax + 1)
    titles = [g.find(f"{NS}title") for g in groups]
    assert all(t is not None and t.text and " to " in t.text.splitlines()[0] for t in titles)


@pytest.mark.parametrize("kind", ["line", "bars"])
def test_busy_output_stays_small(kind: str) -> None:
    svg = time_chart(BUSY, start=T0, end=T0 + 2 * DAY, title="busy", kind=kind)
    assert len(svg.encode()) < 400_000
    root = parse(svg)
    assert_inside(root)
    if kind == "line":
        assert len(find(root, ".//svg:path")) == 10
        assert find(root, ".//svg:circle") == []


def test_same_input_same_output() -> None:
    for kind in ("line", "bars"):
        args: dict[str, Any] = {"start": T0, "end": T0 + 2 * DAY, "title": "t", "unit": "s", "kind": kind}
        assert time_chart(BUSY, **args) == time_chart(list(BUSY), **args)


def test_colours_tones_then_palette() -> None:
    series = [Series(f"s{i}", [(T0 + 60, 1.0), (T0 + 120, 2.0)]) for i in range(8)]
    series += [
        Series("ok", [(T0 + 60, 1.0)], "ok"),
        Series("w", [(T0 + 60, 1.0)], "warn"),
        Series("x", [], "?"),
    ]
    root = parse(time_chart(series, start=T0, end=T0 + HOUR, title="t"))
    strokes = [p.get("stroke") for p in find(root, ".//svg:path")]
    assert strokes[:8] == list(PALETTE)
    assert len(set(PALETTE)) == 8
    assert strokes[8:] == [TONES["ok"], TONES["warn"]]
    swatches = [r.get("fill") for r in find(root, ".//svg:g[@class='legend']/svg:g/svg:rect")]
    assert swatches[:3] == list(PALETTE[:3])


def test_no_links_scripts_or_styles() -> None:
    svg = time_chart(CASES["sparse"], start=T0, end=T0 + HOUR, title="t", kind="bars")
    assert not re.search(r"href|<script|<style|<image|url\(|@import|<foreignObject|\bon\w+=", svg)
    assert svg.count("http://") == 1  # the xmlns


@pytest.mark.parametrize(
    "kwargs",
    [
        {"start": T0, "end": T0},
        {"start": T0, "end": T0 - 1},
        {"start": math.nan, "end": T0},
        {"start": T0, "end": math.inf},
        {"kind": "pie"},
        {"width": 99},
        {"height": 50},
    ],
)
def test_bad_arguments_raise_config_error(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"start": T0, "end": T0 + HOUR, "title": "t"} | kwargs
    with pytest.raises(ConfigError):
        time_chart([], **args)
