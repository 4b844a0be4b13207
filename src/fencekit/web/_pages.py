"""The HTML pages, rendered from the Jinja2 templates in ``templates/``.

Autoescaping is on for every template, so each string that came from users
or Redis (queue names, consumer ids, dead-letter reasons and payloads) is
HTML-escaped where it is written; nothing of theirs is ever marked safe.
Only :func:`_quantile`, which formats numbers, returns markup (``&le;``).
``StrictUndefined`` makes a misspelt variable an error instead of an empty
cell. The formatting helpers below are the templates' filters and globals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from urllib.parse import quote

import orjson
from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from fencekit.jobs.batches import CALLBACK_KINDS, BatchState
from fencekit.jobs.history import WINDOWS, History
from fencekit.jobs.records import JobInfo
from fencekit.web._batch_view import GROUPS, BatchView
from fencekit.web._flow_view import FlowView
from fencekit.web._graphs import history_charts, recent_chart
from fencekit.web.browse import BULK_LIMIT, LISTS, Filter, Page
from fencekit.web.source import DurationHistogram, Snapshot

__all__ = [
    "render_batch",
    "render_browse",
    "render_confirm",
    "render_dashboard",
    "render_error",
    "render_history",
    "render_job",
]

#: Characters of a dead letter's payload shown in the table.
PAYLOAD_PREVIEW = 300

#: Seconds between two reloads of the history page (its finest bucket is a minute).
HISTORY_REFRESH = 60


def render_dashboard(
    snap: Snapshot,
    *,
    recent: History,
    root: str,
    token: str,
    refresh: int,
    notice: str | None,
    redis: str | None,
) -> str:
    """The dashboard of ``snap`` and the last hour's chart; it reloads itself every ``refresh`` seconds."""
    return _env.get_template("dashboard.html").render(
        snap=snap,
        chart=recent_chart(recent),
        root=root,
        token=token,
        refresh=refresh,
        notice=notice,
        redis=redis,
    )


def render_history(
    history: History,
    per_queue: Mapping[str, History],
    *,
    queue: str | None,
    window: str,
    queues: Sequence[str],
    root: str,
) -> str:
    """The history page of ``queue`` (None: all queues) over ``window``; it reloads every minute."""
    query = f"?window={window}" + (f"&queue={_url_component(queue)}" if queue is not None else "")
    return _env.get_template("history.html").render(
        history=history,
        totals=history.totals(),
        charts=history_charts(history, per_queue),
        queue=queue,
        window=window,
        windows=list(WINDOWS),
        queues=queues,
        root=root,
        refresh=HISTORY_REFRESH,
        refresh_url=f"{root}/admin/history{query}",
        json_url=f"{root}/admin/api/history{query}",
    )


def render_confirm(queue: str, pending: int, *, root: str, token: str) -> str:
    """The confirmation step before purging ``queue`` (it does not reload itself)."""
    return _env.get_template("confirm.html").render(
        queue=queue, pending=pending, root=root, token=token, refresh=None
    )


def render_job(job: JobInfo, *, root: str, token: str, notice: str | None, now: float) -> str:
    """The page of one task: its record, error and traceback, and what can be done to it."""
    return _env.get_template("job.html").render(
        job=job, root=root, token=token, notice=notice, now=now, refresh=None
    )


_CALLBACK_RULE = {"complete": "every child final", "success": "every child succeeded",
                  "failure": "a child failed for good"}  # fmt: skip


def render_batch(view: BatchView, *, root: str, token: str, notice: str | None, now: float) -> str:
    """The page of one batch: progress, counts, children by state, callbacks, and "cancel"."""
    info = view.info
    complete = info.state in (BatchState.COMPLETING, BatchState.DONE)
    due = {"complete": True, "success": info.succeeded == info.total, "failure": info.failed > 0}
    callbacks = [  # (kind, jid, when it runs, where it is: "enqueued" -- its page exists -- or why not)
        (kind, info.callbacks[kind], _CALLBACK_RULE[kind],
         ("enqueued" if due[kind] else "not run") if complete else "not enqueued yet")
        for kind in CALLBACK_KINDS
        if kind in info.callbacks
    ]  # fmt: skip
    counts = {"": info.pending + info.running, "s": info.succeeded, "f": info.failed, "c": info.cancelled}
    return _env.get_template("batch.html").render(
        view=view,
        info=info,
        created=info.created_at.timestamp(),
        finished=info.finished_at.timestamp() if info.finished_at is not None else None,
        callbacks=callbacks,
        groups=[(state, label, counts[state]) for state, label in GROUPS],
        cancellable=info.state in (BatchState.OPEN, BatchState.ARMED),
        root=root,
        token=token,
        notice=notice,
        now=now,
        refresh=None,
    )


_TIME_LABEL = {"pending": "enqueued", "scheduled": "due", "running": "claimed", "finished": "finished",
               "failed": "failed", "dead": "died"}  # fmt: skip
_DETAIL_LABEL = {"pending": "params", "scheduled": "params", "running": "params", "finished": "result",
                 "failed": "error", "dead": "reason"}  # fmt: skip


def render_browse(
    page: Page,
    *,
    where: Filter,
    root: str,
    now: float,
    token: str,
    actions: Sequence[str],
    notice: str | None,
    paused: bool = False,
    flow: FlowView | None = None,
) -> str:
    """One page of one list of a queue (:mod:`fencekit.web.browse`), with its filter and pager,
    whether the queue is paused (its badge and its Pause / Resume button), and its Flow section
    (:mod:`fencekit.web._flow_view`: parked tasks and fair-share keys; None: not shown)."""
    query = [("queue", page.queue), ("list", page.list)]
    query += [
        (k, v) for k, v in (("operation", where.operation), ("jid", where.jid), ("text", where.text)) if v
    ]
    here = f"{root}/admin/queue?" + "&".join(f"{k}={_url_component(v)}" for k, v in query)
    return _env.get_template("browse.html").render(
        page=page,
        where=where,
        lists=LISTS,
        here=here,
        token=token,
        actions=actions,
        notice=notice,
        paused=paused,
        flow=flow,
        bulk_limit=BULK_LIMIT,
        time_label=_TIME_LABEL[page.list],
        detail_label=_DETAIL_LABEL[page.list],
        root=root,
        now=now,
        refresh=None,
    )


def render_error(
    title: str, message: str, *, root: str, refresh: int | None = None, redis: str | None = None
) -> str:
    """An error page, linking back to the dashboard (and reloading itself if ``refresh``)."""
    return _env.get_template("error.html").render(
        title=title, message=message, root=root, refresh=refresh, redis=redis
    )


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 1:
        return "just now"
    return f"{_span(seconds)} ago"


def _span(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"


def _clock(at: float) -> str:
    return datetime.fromtimestamp(at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f} µs"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _quantile(d: DurationHistogram, q: float) -> str:
    """The bucket bound of the ``q`` quantile, as "&le; 25.0 ms" (or "&gt;" the last bound)."""
    bound = d.quantile_bound(q)
    if bound is None:
        return "-"
    if math.isinf(bound):
        return Markup("&gt; %s") % _ms(d.bounds[-1])
    return Markup("&le; %s") % _ms(bound)


def _preview(raw: bytes) -> str:
    payload = raw.decode("utf-8", errors="replace")
    return payload[:PAYLOAD_PREVIEW] + "…" if len(payload) > PAYLOAD_PREVIEW else payload


def _pretty(value: object) -> str:
    """A JSON value indented for a ``<pre>`` (escaped by the template like any text)."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() if value is not None else "null"


def _url_component(value: str) -> str:
    """``value`` percent-encoded for a query string, "/" and "&" included."""
    return quote(value, safe="")


_env = Environment(
    loader=PackageLoader("fencekit.web", "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters.update(
    ago=_ago, span=_span, clock=_clock, ms=_ms, preview=_preview, url_component=_url_component, pretty=_pretty
)
_env.globals["quantile"] = _quantile
