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
    GET  /admin           dashboard (refreshes itself), with the last hour's chart
    GET  /admin/history   charts of ?queue=NAME (default: all) over ?window=1h|24h|48h|90d
    GET  /admin/api/history  the same numbers as JSON (&per_queue=1: each queue's too)
    GET  /admin/job       one task's page (?jid=...)
    GET  /admin/batch/BID one batch's page: progress, children by state, callbacks
    POST /admin/cancel-batch  cancel a batch's children not final  (form: bid, csrf)
    GET  /admin/purge     confirmation page for purging ?queue=NAME
    POST /admin/purge     purge a queue              (form: queue, csrf, confirm=yes)
    POST /admin/revive    re-enqueue a dead letter   (form: queue, id, csrf)
    POST /admin/pause     pause or resume a queue on every host  (form: queue, action=pause|resume, csrf)
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
  dead-letter reasons and payloads) is HTML-escaped by the templates'
  autoescaping, and the pages carry a
  Content-Security-Policy without any script source, so an escaping slip
  could still not run script. The pages need no JavaScript: the refresh is
  a ``<meta http-equiv="refresh">``.
- Passwords never reach a page or a log line: the Redis URL is shown through
  ``RedisTarget.redacted()``.

The package, by job: :mod:`~fencekit.web.app` (the app and its handlers),
:mod:`~fencekit.web._security` (the checks above), :mod:`~fencekit.web._pages`
(HTML from the Jinja2 templates in ``templates/``, autoescaped; the charts
drawn as inline SVG by :mod:`~fencekit.web._charts` from what
:mod:`~fencekit.web._graphs` picks out of the history),
:mod:`~fencekit.web._metrics` (the Prometheus collector),
:mod:`~fencekit.web.source` (the one reader of Redis; :mod:`~fencekit.web._views`
the values it returns; :mod:`~fencekit.web._batch_view` what a batch's page shows,
:mod:`~fencekit.web._batch_pages` its handlers) and :mod:`~fencekit.web._serve` (uvicorn in the host's
event loop). A ``Server`` or a pool builds its web server in
:meth:`fencekit.runtime.services.Services.start_web`.
"""

from __future__ import annotations

from fencekit.web._serve import WebServer
from fencekit.web.app import create_app
from fencekit.web.source import AdminSource, DurationHistogram

__all__ = [
    "AdminSource",
    "DurationHistogram",
    "WebServer",
    "create_app",
]
