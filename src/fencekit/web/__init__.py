"""HTTP: probes, the admin page, admin actions and Prometheus metrics.

One Starlette app (:func:`create_app`) serves every placement: ``Server``
and the pool supervisor run it with :class:`WebServer` on ``web_port``
(3030, bound to ``127.0.0.1`` unless a host is given), and a user can mount
it in their own FastAPI/Starlette service instead::

    source = AdminSource.from_url("redis://...", queues=["emails"])
    app.mount("/jobs", create_app(source, admin_username="alice", admin_password="secret"))

Routes (relative to where the app is mounted)::

    GET  /live            200 {"status": "ok"}                      the process is up
    GET  /ready           200 {"status": "ok"}                      Redis answers PING
                          503 {"status": "redis unavailable"}       ... within ~0.5 s
    GET  /admin           dashboard (refreshes itself)
    GET  /admin/purge     confirmation page for purging ?queue=NAME
    POST /admin/purge     purge a queue              (form: queue, csrf, confirm=yes)
    POST /admin/revive    re-enqueue a dead letter   (form: queue, id, csrf)
    GET  /metrics         Prometheus text format

Security:

- ``/admin*`` (and ``/metrics`` unless ``protect_metrics=False``) need HTTP
  Basic Auth when both ``admin_username`` and ``admin_password`` are set,
  compared in constant time; otherwise they are open, as kickdown's were,
  and :class:`WebServer` logs a warning when that happens on a non-loopback
  address.
- POSTs need the per-process CSRF token embedded in the forms, and an
  ``Origin`` (or, without one, ``Referer``) naming this same host. Basic Auth
  credentials are sent by the browser on every request, cross-site ones
  included; the token is what a foreign page cannot read.
- Every string that came from users or Redis (queue names, consumer ids,
  dead-letter reasons and payloads) is HTML-escaped, and the pages carry a
  Content-Security-Policy without any script source, so an escaping slip
  could still not run script. The pages need no JavaScript: the refresh is
  a ``<meta http-equiv="refresh">``.
- Passwords never reach a page or a log line: the Redis URL is shown through
  ``RedisTarget.redacted()``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import html
import ipaddress
import logging
import math
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from fencekit._redis.keys import validate_queue
from fencekit.errors import ConfigError, StoreError
from fencekit.web.source import AdminSource, ChildView, DurationHistogram, Snapshot

__all__ = [
    "AdminSource",
    "DurationHistogram",
    "WebServer",
    "create_app",
    "web_for_server",
    "web_for_supervisor",
]

DEFAULT_PORT = 3030
DEFAULT_HOST = "127.0.0.1"
DEFAULT_REFRESH = 5
MAX_FORM_BYTES = 8192
PAYLOAD_PREVIEW = 300

#: The CSRF token of this process, made on first use (see :func:`create_app`).
_process_token: str | None = None

Handler = Callable[[Request], Awaitable[Response]]


def process_csrf_token() -> str:
    """The random CSRF token shared by every app created in this process."""
    global _process_token
    if _process_token is None:
        _process_token = secrets.token_urlsafe(32)
    return _process_token


# security --------------------------------------------------------------------

_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True, slots=True)
class _Credentials:
    username: bytes
    password: bytes

    def match(self, header: str | None) -> bool:
        """Constant-time check of an ``Authorization: Basic`` header."""
        if not header:
            return False
        scheme, _, param = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(param.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        user, sep, password = decoded.partition(b":")
        if not sep:
            return False
        user_ok = secrets.compare_digest(user, self.username)
        password_ok = secrets.compare_digest(password, self.password)
        return user_ok and password_ok


def _netloc(url: str) -> str:
    return urlsplit(url).netloc.rpartition("@")[2].lower()


def _same_origin(request: Request) -> bool:
    """True if the request says it comes from a page of this same host."""
    host = request.headers.get("host", "").lower()
    if not host:
        return False
    origin = request.headers.get("origin")
    if origin is not None:
        return origin != "null" and _netloc(origin) == host
    referer = request.headers.get("referer")
    return referer is not None and _netloc(referer) == host


# the app -------------------------------------------------------------------------


def create_app(
    source: AdminSource,
    *,
    admin_username: str | None = None,
    admin_password: str | None = None,
    refresh: int = DEFAULT_REFRESH,
    protect_metrics: bool = True,
    csrf_token: str | None = None,
) -> Starlette:
    """The ASGI app serving probes, /admin and /metrics from ``source``.

    Basic Auth is on only when both ``admin_username`` and ``admin_password``
    are given. ``refresh`` is the dashboard's reload interval in seconds.
    ``csrf_token`` defaults to one random token per process, so several
    mounts of the app (or a restart of the web server) keep accepting forms
    rendered earlier by the same process. ``app.state.registry`` is the
    Prometheus registry of /metrics, for the host to add its own collectors.
    """
    if type(refresh) is not int or refresh < 1:
        raise ConfigError(f"refresh must be an int >= 1 (seconds), got {refresh!r}")
    credentials = None
    if admin_username is not None and admin_password is not None:
        if not admin_username or not admin_password:
            raise ConfigError("admin_username and admin_password must not be empty strings")
        credentials = _Credentials(admin_username.encode(), admin_password.encode())
    token = csrf_token or process_csrf_token()
    logger = source.logger
    collector = _Collector()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)

    def guarded(handler: Handler, *, always: bool = False) -> Handler:
        """Wrap ``handler`` with Basic Auth (when configured, and ``always`` or protected)."""

        async def endpoint(request: Request) -> Response:
            if credentials is not None and not credentials.match(request.headers.get("authorization")):
                return Response(
                    "authentication required\n",
                    status_code=401,
                    media_type="text/plain",
                    headers={"WWW-Authenticate": 'Basic realm="fencekit", charset="UTF-8"'},
                )
            return await handler(request)

        return endpoint if (always or protect_metrics) else handler

    def checked_post(handler: Callable[[Request, dict[str, str]], Awaitable[Response]]) -> Handler:
        """Same-origin and CSRF checks, then ``handler(request, form)``."""

        async def endpoint(request: Request) -> Response:
            if not _same_origin(request):
                return _page_error(request, 403, "Forbidden", "cross-origin or origin-less form post refused")
            form = await _read_form(request)
            if form is None:
                return _page_error(request, 413, "Too large", "form too large")
            if not secrets.compare_digest(form.get("csrf", "").encode(), token.encode()):
                return _page_error(request, 403, "Forbidden", "missing or stale form token: reload the page")
            queue = form.get("queue", "")
            try:
                validate_queue(queue)
                known = await source.is_known(queue)
            except ConfigError:
                known = False
            except StoreError as exc:
                return _redis_down(request, source, exc)
            if not known:
                return _page_error(request, 404, "Not found", "no such queue")
            try:
                return await handler(request, form)
            except StoreError as exc:
                return _redis_down(request, source, exc)

        return endpoint

    async def live(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(request: Request) -> Response:
        if await source.ready():
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "redis unavailable"}, status_code=503)

    async def dashboard(request: Request) -> Response:
        try:
            snap = await source.snapshot()
        except StoreError as exc:
            return _redis_down(request, source, exc)
        notice = _notice(request)
        body = _render_dashboard(snap, source, _root(request), token, refresh, notice)
        return HTMLResponse(body, headers=_SECURITY_HEADERS)

    async def purge_confirm(request: Request) -> Response:
        queue = request.query_params.get("queue", "")
        try:
            validate_queue(queue)
            known = await source.is_known(queue)
            pending = await source.queue(queue).length() if known else 0
        except ConfigError:
            known, pending = False, 0
        except StoreError as exc:
            return _redis_down(request, source, exc)
        if not known:
            return _page_error(request, 404, "Not found", "no such queue")
        body = _render_confirm(queue, pending, _root(request), token)
        return HTMLResponse(body, headers=_SECURITY_HEADERS)

    async def purge(request: Request, form: dict[str, str]) -> Response:
        if form.get("confirm") != "yes":
            return _page_error(request, 400, "Not confirmed", "purging needs the confirmation step")
        queue = form["queue"]
        dropped = await source.queue(queue).purge()
        logger.warning("admin: purged %d pending task(s) of queue %r", dropped, queue)
        return RedirectResponse(f"{_root(request)}/admin?done=purged&n={dropped}", status_code=303)

    async def revive(request: Request, form: dict[str, str]) -> Response:
        queue, dead_id = form["queue"], form.get("id", "")
        if not dead_id or len(dead_id) > 200:
            return _page_error(request, 400, "Bad request", "missing dead-letter id")
        revived = await source.queue(queue).revive(dead_id)
        if revived:
            logger.info("admin: re-enqueued dead letter %r of queue %r", dead_id, queue)
        return RedirectResponse(
            f"{_root(request)}/admin?done={'revived' if revived else 'gone'}", status_code=303
        )

    async def metrics(request: Request) -> Response:
        collector.reading = await _reading(source)
        try:
            payload = generate_latest(registry)
        finally:
            collector.reading = None
        return Response(payload, media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/live", live, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/admin", guarded(dashboard, always=True), methods=["GET"]),
        Route("/admin/purge", guarded(purge_confirm, always=True), methods=["GET"]),
        Route("/admin/purge", guarded(checked_post(purge), always=True), methods=["POST"]),
        Route("/admin/revive", guarded(checked_post(revive), always=True), methods=["POST"]),
        Route("/metrics", guarded(metrics), methods=["GET"]),
    ]
    app = Starlette(routes=routes)
    app.state.registry = registry
    app.state.source = source
    app.state.admin_open = credentials is None
    return app


async def _read_form(request: Request) -> dict[str, str] | None:
    """The urlencoded form of a POST (last value of each field); None when too large."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_FORM_BYTES:
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=16)
    except (UnicodeDecodeError, ValueError):
        return {}
    return {k: v[-1] for k, v in fields.items()}


def _root(request: Request) -> str:
    """Where the app is mounted ("" at the top level), for links and redirects."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _notice(request: Request) -> str | None:
    """The outcome of the last action, from a fixed set of messages (never echoed input)."""
    done = request.query_params.get("done")
    if done == "revived":
        return "Dead letter re-enqueued."
    if done == "gone":
        return "That dead letter was already gone (re-enqueued or dropped)."
    if done == "purged":
        count = request.query_params.get("n", "")
        return f"Queue purged: {int(count) if count.isdigit() else 0} pending task(s) dropped."
    return None


def _redis_down(request: Request, source: AdminSource, exc: StoreError) -> Response:
    source.logger.warning("admin page: Redis unavailable: %s", exc)
    return _page_error(
        request,
        503,
        "Redis unavailable",
        "Redis did not answer; the page will retry.",
        refresh=DEFAULT_REFRESH,
        redis=source.redis_display,
    )


def _page_error(
    request: Request,
    status: int,
    title: str,
    message: str,
    *,
    refresh: int | None = None,
    redis: str | None = None,
) -> Response:
    root = _root(request)
    meta = f'<meta http-equiv="refresh" content="{refresh}; url={_e(root)}/admin">' if refresh else ""
    where = f"<p class=muted>Redis: <code>{_e(redis)}</code></p>" if redis else ""
    body = _layout(
        title,
        f"<section><h2>{_e(title)}</h2><p>{_e(message)}</p>{where}"
        f'<p><a href="{_e(root)}/admin">Back to the dashboard</a></p></section>',
        head=meta,
    )
    return HTMLResponse(body, status_code=status, headers=_SECURITY_HEADERS)


# metrics -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Reading:
    snapshot: Snapshot | None
    children: tuple[ChildView, ...] | None
    durations: DurationHistogram


async def _reading(source: AdminSource) -> _Reading:
    try:
        snap = await source.snapshot()
    except StoreError as exc:
        source.logger.warning("metrics: Redis unavailable: %s", exc)
        return _Reading(None, await source.pool_children(), source.durations)
    return _Reading(snap, snap.children, snap.durations)


_COUNTERS = (
    ("processed", "Tasks whose worker completed (each task counted once)."),
    ("failed", "Tasks permanently dropped: retries exhausted, no worker, malformed."),
    ("fenced_out", "Settlements refused because the delivery was no longer current."),
    ("dead", "Failed tasks kept as dead letters."),
    ("retried", "Attempts scheduled again after an exception or a crash."),
    ("enqueued", "Tasks accepted into the queue (revived ones included)."),
)


_GAUGES = (
    ("pending", "Tasks waiting in the queue."),
    ("scheduled", "Tasks waiting for a retry delay or a delayed start."),
    ("in_flight", "Tasks claimed by registered consumers and not settled yet."),
    ("dead_letters", "Dead letters currently kept for an operator."),
)


class _Collector:
    """Turns the reading taken for one scrape into metric families.

    ``collect()`` is synchronous (prometheus_client calls it), while Redis is
    read asynchronously: the /metrics handler reads Redis, puts the reading
    here and renders at once, with no ``await`` in between, so concurrent
    scrapes on one event loop never see each other's readings.
    """

    def __init__(self) -> None:
        self.reading: _Reading | None = None

    def collect(self) -> Iterable[Metric]:
        reading = self.reading
        if reading is None:
            return
        snap = reading.snapshot
        up = GaugeMetricFamily("fencekit_redis_up", "1 if Redis answered this scrape, else 0.")
        up.add_metric([], 1.0 if snap is not None else 0.0)
        yield up
        if snap is not None:
            yield from _queue_metrics(snap)
        yield _histogram(reading.durations)
        if reading.children is not None:
            yield from _child_metrics(reading.children)


def _queue_metrics(snap: Snapshot) -> Iterator[Metric]:
    for name, doc in _COUNTERS:
        family = CounterMetricFamily(f"fencekit_{name}", doc, labels=["queue"])
        for q in snap.queues:
            family.add_metric([q.name], float(getattr(q.stats, name)))
        yield family
    for name, doc in _GAUGES:
        gauge = GaugeMetricFamily(f"fencekit_{name}", doc, labels=["queue"])
        for q in snap.queues:
            gauge.add_metric([q.name], float(getattr(q, name)))
        yield gauge
    consumers = GaugeMetricFamily("fencekit_consumers", "Registered consumers with a fresh heartbeat.")
    consumers.add_metric([], float(sum(1 for c in snap.consumers if c.alive)))
    yield consumers


def _histogram(durations: DurationHistogram) -> Metric:
    buckets = [("+Inf" if math.isinf(b) else repr(b), float(n)) for b, n in durations.cumulative()]
    return HistogramMetricFamily(
        "fencekit_job_duration_seconds",
        "Time spent in perform() per job, in this process.",
        buckets=buckets,
        sum_value=durations.sum,
    )


def _child_metrics(children: tuple[ChildView, ...]) -> Iterator[Metric]:
    restarts = CounterMetricFamily(
        "fencekit_pool_child_restarts", "Times the pool restarted the child of a slot.", labels=["slot"]
    )
    uptime = GaugeMetricFamily(
        "fencekit_pool_child_uptime_seconds", "Seconds since the child of a slot started.", labels=["slot"]
    )
    for child in children:
        restarts.add_metric([str(child.slot)], float(child.restarts))
        uptime.add_metric([str(child.slot)], child.uptime)
    yield restarts
    yield uptime
    count = GaugeMetricFamily("fencekit_pool_children", "Pool children running now.")
    count.add_metric([], float(len(children)))
    yield count


# HTML ----------------------------------------------------------------------------


def _e(value: object) -> str:
    """HTML-escape anything for text and quoted attributes."""
    return html.escape(str(value), quote=True)


_CSS = """
:root{--fg:#1d2433;--muted:#6b7385;--line:#e3e6ee;--bg:#f6f7fb;--card:#fff;--accent:#3558d4;--bad:#c2362f;
--ok:#1f8a4c;--warn:#b7791f}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
color:var(--fg);background:var(--bg)}
header{background:#1d2433;color:#fff;padding:14px 28px;display:flex;align-items:baseline;gap:18px;
flex-wrap:wrap}
header h1{margin:0;font-size:20px;letter-spacing:.5px}
header .meta{color:#b8bfd3;font-size:12px}
main{padding:20px 28px;max-width:1280px}
section{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:14px 18px;
margin:0 0 18px}
h2{font-size:15px;margin:0 0 10px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(150px,1fr));gap:12px;margin:0 0 18px}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:12px 16px}
.card .label{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.6px}
.card .value{font-size:26px;font-weight:600;font-variant-numeric:tabular-nums}
.card.bad .value{color:var(--bad)} .card.ok .value{color:var(--ok)} .card.warn .value{color:var(--warn)}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:6px 10px;border-bottom:1px solid var(--line);vertical-align:top}
th{color:var(--muted);font-weight:600;font-size:12px;text-transform:uppercase;letter-spacing:.5px}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
code,.mono{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px;word-break:break-all}
.muted{color:var(--muted)} .empty{color:var(--muted);font-style:italic}
.pill{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px}
.pill.ok{background:#e3f4ea;color:var(--ok)} .pill.bad{background:#fbe6e5;color:var(--bad)}
.notice{background:#e8eefc;border:1px solid #c5d3f7;border-radius:8px;padding:10px 14px;margin:0 0 18px}
button,.button{font:inherit;font-size:12px;padding:3px 10px;border-radius:5px;border:1px solid var(--line);
background:#fff;color:var(--accent);cursor:pointer;text-decoration:none;white-space:nowrap}
button.danger{background:var(--bad);border-color:var(--bad);color:#fff;font-size:14px;padding:6px 14px}
form{margin:0}
"""


def _layout(title: str, content: str, *, head: str = "", subtitle: str = "") -> str:
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width,initial-scale=1">'
        f"{head}<title>{_e(title)} · fencekit</title><style>{_CSS}</style></head>"
        f"<body><header><h1>fencekit</h1><span class=meta>{subtitle}</span></header>"
        f"<main>{content}</main></body></html>\n"
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


def _bound(d: DurationHistogram, q: float) -> str:
    bound = d.quantile_bound(q)
    if bound is None:
        return "-"
    if math.isinf(bound):
        return f"&gt; {_ms(d.bounds[-1])}"
    return f"&le; {_ms(bound)}"


def _render_dashboard(
    snap: Snapshot, source: AdminSource, root: str, token: str, refresh: int, notice: str | None
) -> str:
    t = snap.totals
    cards = [
        ("processed", t.processed, "ok"),
        ("failed", t.failed, "bad" if t.failed else ""),
        ("fenced out", t.fenced_out, "warn" if t.fenced_out else ""),
        ("dead", t.dead, "bad" if t.dead else ""),
        ("retried", t.retried, ""),
        ("enqueued", t.enqueued, ""),
    ]
    parts = [
        "<div class=cards id=totals>"
        + "".join(
            f'<div class="card {cls}" data-counter="{_e(label)}"><div class=label>{_e(label)}</div>'
            f"<div class=value>{value}</div></div>"
            for label, value, cls in cards
        )
        + "</div>"
    ]
    if notice:
        parts.insert(0, f"<div class=notice role=status>{_e(notice)}</div>")
    parts.append(_queues_table(snap, root))
    parts.append(_consumers_table(snap))
    if snap.children is not None:
        parts.append(_children_table(snap.children))
    parts.append(_durations_block(snap.durations))
    parts.append(_dead_table(snap, root, token))
    redis_text = f"Redis {_e(source.redis_display)} · " if source.redis_display else ""
    subtitle = f"{redis_text}read {_e(_clock(snap.taken_at))} · refreshes every {refresh} s"
    head = f'<meta http-equiv="refresh" content="{refresh}; url={_e(root)}/admin">'
    return _layout("Dashboard", "".join(parts), head=head, subtitle=subtitle)


def _queues_table(snap: Snapshot, root: str) -> str:
    rows = []
    for q in snap.queues:
        purge = f"{_e(root)}/admin/purge?queue={_e(quote(q.name, safe=''))}"
        rows.append(
            f"<tr><td class=mono>{_e(q.name)}</td><td class=n>{q.pending}</td><td class=n>{q.scheduled}</td>"
            f"<td class=n>{q.in_flight}</td><td class=n>{q.dead_letters}</td>"
            f"<td class=n>{q.stats.processed}</td>"
            f"<td class=n>{q.stats.failed}</td><td class=n>{q.stats.fenced_out}</td>"
            f'<td><a class=button href="{purge}">Purge…</a></td></tr>'
        )
    body = "".join(rows) or "<tr><td colspan=9 class=empty>No queues yet.</td></tr>"
    return (
        "<section id=queues><h2>Queues</h2><table><thead><tr><th>queue</th><th class=n>pending</th>"
        "<th class=n>scheduled</th><th class=n>in flight</th><th class=n>dead letters</th>"
        "<th class=n>processed</th><th class=n>failed</th><th class=n>fenced out</th><th></th></tr></thead>"
        f"<tbody>{body}</tbody></table></section>"
    )


def _consumers_table(snap: Snapshot) -> str:
    rows = []
    for c in snap.consumers:
        state = "<span class='pill ok'>alive</span>" if c.alive else "<span class='pill bad'>expired</span>"
        rows.append(
            f"<tr><td class=mono>{_e(c.id)}</td><td>{_e(c.host)}</td><td class=n>{_e(c.pid or '')}</td>"
            f"<td>{_e(c.kind)}</td><td class=mono>{_e(', '.join(c.queues))}</td>"
            f"<td>{_e(_ago(c.beat_age))}</td><td class=n>{c.in_flight}</td><td>{state}</td></tr>"
        )
    body = "".join(rows) or "<tr><td colspan=8 class=empty>No consumers registered.</td></tr>"
    return (
        "<section id=consumers><h2>Consumers</h2><table><thead><tr><th>id</th><th>host</th>"
        "<th class=n>pid</th>"
        "<th>kind</th><th>queues</th><th>last beat</th><th class=n>in flight</th><th></th></tr></thead>"
        f"<tbody>{body}</tbody></table></section>"
    )


def _children_table(children: tuple[ChildView, ...]) -> str:
    rows = []
    for c in sorted(children, key=lambda c: c.slot):
        state = "<span class='pill ok'>running</span>" if c.alive else "<span class='pill bad'>down</span>"
        processed = "" if c.processed is None else str(c.processed)
        rows.append(
            f"<tr><td class=n>{c.slot}</td><td class=n>{c.pid}</td><td>{state}</td>"
            f"<td class=n>{c.restarts}</td><td>{_e(_span(c.uptime)) if c.alive else '-'}</td>"
            f"<td class=n>{processed}</td></tr>"
        )
    body = "".join(rows) or "<tr><td colspan=6 class=empty>No children running.</td></tr>"
    return (
        "<section id=children><h2>Pool children</h2><table><thead><tr><th class=n>slot</th>"
        "<th class=n>pid</th><th></th><th class=n>restarts</th><th>uptime</th><th class=n>processed</th>"
        f"</tr></thead><tbody>{body}</tbody></table></section>"
    )


def _durations_block(d: DurationHistogram) -> str:
    mean = d.sum / d.count if d.count else None
    return (
        "<section id=durations><h2>Job durations (this process)</h2><table><thead><tr>"
        "<th class=n>jobs</th><th class=n>mean</th><th class=n>p50</th><th class=n>p95</th>"
        "<th class=n>p99</th>"
        f"</tr></thead><tbody><tr><td class=n>{d.count}</td><td class=n>{_ms(mean)}</td>"
        f"<td class=n>{_bound(d, 0.5)}</td><td class=n>{_bound(d, 0.95)}</td>"
        f"<td class=n>{_bound(d, 0.99)}</td></tr></tbody></table></section>"
    )


def _dead_table(snap: Snapshot, root: str, token: str) -> str:
    rows = []
    for d in snap.dead_letters:
        payload = d.raw.decode("utf-8", errors="replace")
        if len(payload) > PAYLOAD_PREVIEW:
            payload = payload[:PAYLOAD_PREVIEW] + "…"
        rows.append(
            f"<tr><td>{_e(_clock(d.at))}</td><td class=mono>{_e(d.queue)}</td>"
            f"<td class=reason>{_e(d.reason)}</td>"
            f"<td class=mono>{_e(d.jid or '')}</td><td class=mono>{_e(payload)}</td><td>"
            f'<form method=post action="{_e(root)}/admin/revive">'
            f'<input type=hidden name=csrf value="{_e(token)}">'
            f'<input type=hidden name=queue value="{_e(d.queue)}">'
            f'<input type=hidden name=id value="{_e(d.id)}">'
            "<button type=submit>Re-enqueue</button></form></td></tr>"
        )
    body = "".join(rows) or "<tr><td colspan=6 class=empty>No dead letters.</td></tr>"
    return (
        "<section id=dead><h2>Latest dead letters</h2><table><thead><tr><th>when</th><th>queue</th>"
        "<th>reason</th><th>jid</th><th>payload</th><th></th></tr></thead>"
        f"<tbody>{body}</tbody></table></section>"
    )


def _render_confirm(queue: str, pending: int, root: str, token: str) -> str:
    content = (
        "<section id=confirm><h2>Purge a queue</h2>"
        f"<p>Drop every task waiting in <code>{_e(queue)}</code>: "
        f"<strong>{pending}</strong> pending task(s). "
        "Scheduled tasks, tasks in flight, dead letters and counters are kept. This cannot be undone.</p>"
        f'<form method=post action="{_e(root)}/admin/purge">'
        f'<input type=hidden name=csrf value="{_e(token)}">'
        f'<input type=hidden name=queue value="{_e(queue)}">'
        "<input type=hidden name=confirm value=yes>"
        f"<button class=danger type=submit>Purge {pending} task(s)</button> "
        f'<a class=button href="{_e(root)}/admin">Cancel</a></form></section>'
    )
    return _layout("Purge", content)


# serving -------------------------------------------------------------------------


class _HostedServer(uvicorn.Server):
    """uvicorn's server without its signal handling: the host process owns signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29 called this from serve()
        return


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class WebServer:
    """Serves an ASGI app with uvicorn inside the running event loop.

    ``start()`` binds the socket itself (so a busy port raises ``OSError``
    from ``start()`` instead of uvicorn's ``sys.exit``, and ``port=0`` picks
    a free port, readable as :attr:`port` afterwards), then returns once
    uvicorn is serving. ``stop()`` closes the listener, lets requests in
    progress finish within ``graceful_timeout`` seconds, and returns. No
    signal handler is installed and logging is not reconfigured.
    """

    def __init__(
        self,
        app: ASGIApp,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        logger: logging.Logger | None = None,
        access_log: bool = False,
        graceful_timeout: float = 2.0,
    ) -> None:
        if type(port) is not int or not 0 <= port < 65536:
            raise ConfigError(f"port must be an int from 0 to 65535, got {port!r}")
        self.app = app
        self.host = host
        self.port = port
        self.logger = logger or logging.getLogger("fencekit.web")
        self.access_log = access_log
        self.graceful_timeout = graceful_timeout
        self._server: _HostedServer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` of the listener (after :meth:`start`)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Bind, start serving, and return once requests are accepted."""
        if self.running:
            return
        sock = _bind(self.host, self.port)
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self.app,
            log_config=None,
            access_log=self.access_log,
            lifespan="off",
            server_header=False,
            timeout_graceful_shutdown=max(1, math.ceil(self.graceful_timeout)),
        )
        server = _HostedServer(config)
        self._server = server
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name="fencekit-web")
        started = time.monotonic()
        while not server.started:
            if self._task.done():
                sock.close()
                self._task.result()  # raises what stopped uvicorn
                raise RuntimeError("web server stopped while starting")
            if time.monotonic() - started > 10:
                await self.stop()
                raise TimeoutError("web server did not start within 10 s")
            await asyncio.sleep(0.005)
        self.logger.info("web: serving /live /ready /admin /metrics on %s", self.url)
        state = getattr(self.app, "state", None)
        if getattr(state, "admin_open", False) and not _is_loopback(self.host):
            self.logger.warning(
                "web: /admin is open without credentials on %s (not a loopback address); "
                "set admin_username and admin_password to require HTTP Basic Auth",
                self.host,
            )

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        server, task = self._server, self._task
        if server is None or task is None:
            return
        server.should_exit = True
        try:
            await task
        except (Exception, SystemExit) as exc:
            self.logger.warning("web: server stopped with %r", exc)
        finally:
            self._server = self._task = None
        self.logger.info("web: stopped")


def _bind(host: str, port: int) -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port`` (IPv4 or IPv6)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


# hosts ---------------------------------------------------------------------------


def web_for_server(server: Any) -> WebServer:
    """The web server of a ``fencekit.Server`` (duck-typed to avoid an import cycle).

    Reads the server's connection, key space, polled queues, Redis target,
    heartbeat TTL, ``web_host``/``web_port`` and admin credentials; job
    durations come from the consumer's histogram (``consumer.stats.durations``).
    """

    empty = DurationHistogram()

    def fresh_durations() -> DurationHistogram:
        consumer = getattr(server, "consumer", None)
        return consumer.stats.durations if consumer is not None else empty

    source = AdminSource(
        server._redis,
        server.keys,
        server.registry.queues,
        durations=fresh_durations,
        target=server.target,
        heartbeat_ttl=server.heartbeat_ttl,
        logger=server.logger,
    )
    app = create_app(source, admin_username=server.admin_username, admin_password=server.admin_password)
    return WebServer(app, server.web_host, server.web_port, logger=server.logger)


def web_for_supervisor(supervisor: Any) -> WebServer:
    """The web server of a pool ``Supervisor`` (what ``fencekit.pool`` starts).

    Shows the supervisor's children through ``supervisor.children_info()``;
    settings come from ``supervisor.settings`` (``web_host``, ``web_port``,
    ``admin_username``, ``admin_password``, ``heartbeat_ttl``). Job durations
    come from ``supervisor.durations()``: the children's histograms, summed
    from the shared liveness board.
    """
    settings = supervisor.settings
    durations = getattr(supervisor, "durations", None)
    source = AdminSource(
        supervisor.redis,
        supervisor.keys,
        supervisor.queues,
        children=supervisor.children_info,
        durations=durations,
        target=supervisor.target,
        heartbeat_ttl=settings.heartbeat_ttl,
        logger=supervisor.logger,
    )
    app = create_app(source, admin_username=settings.admin_username, admin_password=settings.admin_password)
    return WebServer(app, settings.web_host, settings.web_port, logger=supervisor.logger)
