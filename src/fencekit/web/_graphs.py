"""Which charts the history pages show, made from a :class:`~fencekit.jobs.history.History`.

:mod:`fencekit.web._charts` draws; this module decides what is drawn:
throughput, failures, depth and durations over a window, all queues summed
or one queue, and (for all queues) the busiest queues side by side. Counts
are per bucket (per minute, or per hour over 90 days); a bucket nobody
booked counts 0 tasks, while its depth and durations are unknown (a gap).
A p95 above the histogram's last bound (60 s) is drawn at that bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from markupsafe import Markup

from fencekit.jobs.histogram import DEFAULT_BUCKETS
from fencekit.jobs.history import History
from fencekit.web._charts import Series, time_chart

__all__ = ["BUSIEST", "history_charts", "recent_chart"]

BUSIEST = 8
"""Queues drawn one line each on the all-queues page (the busiest in the window)."""


WIDTH = 1180
BARS = 200
"""At most this many bars per chart: a longer window sums its buckets into wider bars (10 min, 12 h ...)."""

_BINS = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440)  # in minutes


def _bin(history: History) -> int:
    """How many buckets one bar sums: the smallest round span that keeps the bars under :data:`BARS`."""
    minutes = len(history.at()) * history.step / 60
    fits = (b for b in _BINS if b * 60 % history.step == 0 and minutes / b <= BARS)
    return next(fits, _BINS[-1]) * 60 // history.step


def _per(history: History) -> str:
    minutes = _bin(history) * history.step // 60
    if minutes % 60:
        return "min" if minutes == 1 else f"{minutes} min"
    return "h" if minutes == 60 else f"{minutes // 60} h"


def _counts(history: History, field: str) -> list[tuple[float, float | None]]:
    """``field`` summed per bar, at each bar's start (a bucket nobody booked counts 0)."""
    by_time = {b.at: b for b in history.buckets}
    width = _bin(history) * history.step
    sums: dict[float, float] = {}
    for at in history.at():
        start = max(history.start, at - at % width)  # the first bar may be a part of one
        bucket = by_time.get(at)
        sums[start] = sums.get(start, 0.0) + (float(getattr(bucket, field)) if bucket is not None else 0.0)
    return list(sums.items())


def _sampled(history: History, value: str) -> list[tuple[float, float | None]]:
    by_time = {b.at: b for b in history.buckets}
    return [(at, _bounded(getattr(by_time[at], value)) if at in by_time else None) for at in history.at()]


def _bounded(value: float | int | None) -> float | None:
    if value is None:
        return None
    return float(DEFAULT_BUCKETS[-1]) if math.isinf(value) else float(value)


def _chart(history: History, series: list[Series], title: str, unit: str, kind: str) -> Markup:
    return time_chart(
        series, start=history.start, end=history.end, title=title, unit=unit, kind=kind, width=WIDTH
    )


def recent_chart(history: History) -> Markup:
    """The dashboard's chart: processed and failed per minute over the last hour, all queues."""
    series = [
        Series("processed", _counts(history, "processed"), "ok"),
        Series("failed", _counts(history, "failed"), "bad"),
    ]
    return _chart(history, series, "Processed and failed per minute, last hour", "tasks", "bars")


def history_charts(history: History, per_queue: Mapping[str, History]) -> list[Markup]:
    """The history page's charts, top to bottom."""
    per = _per(history)
    charts = [
        _chart(history, [Series("processed", _counts(history, "processed"), "ok")],
               f"Processed per {per}", "tasks", "bars"),
        _chart(
            history,
            [
                Series("failed", _counts(history, "failed"), "bad"),
                Series("dead-lettered", _counts(history, "dead")),
                Series("retried", _counts(history, "retried"), "warn"),
                Series("fenced out", _counts(history, "fenced_out")),
            ],
            f"Failures per {per}",
            "tasks",
            "bars",
        ),
    ]  # fmt: skip
    if len(per_queue) > 1:
        busiest = sorted(per_queue.items(), key=lambda item: -item[1].totals().processed)[:BUSIEST]
        lines = [Series(q, _counts(h, "processed")) for q, h in busiest if h.totals().processed]
        if lines:
            title = f"Processed per {per}, the {len(lines)} busiest queues"
            charts.append(_chart(history, lines, title, "tasks", "line"))
    charts.append(
        _chart(
            history, [Series("deepest", _sampled(history, "depth"))], "Queue depth (pending)", "tasks", "line"
        )
    )
    charts.append(
        _chart(
            history,
            [Series("p50", _sampled(history, "p50"), "ok"), Series("p95", _sampled(history, "p95"), "warn")],
            "Job duration (bucket bounds)",
            "s",
            "line",
        )
    )
    return charts
