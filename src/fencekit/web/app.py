"""The Starlette app: :func:`create_app` and its route handlers (routes in :mod:`fencekit.web`).

Handlers are methods of :class:`_Admin`, which holds what ``create_app``
was given (those of a queue's lists and of a batch are mixed in from
:mod:`~fencekit.web._queue_pages` and :mod:`~fencekit.web._batch_pages`); two
wrappers add the checks: :meth:`_Admin.guarded` (Basic Auth) and
:meth:`_Admin.checked_post` (same origin, CSRF token, a known queue).
Every HTML response carries :data:`~fencekit.web._security.SECURITY_HEADERS`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from urllib.parse import quote, urlencode

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from fencekit._redis.keys import JID_RULE, is_jid, validate_queue
from fencekit.errors import ConfigError, StoreError
from fencekit.jobs.history import WINDOWS, History
from fencekit.web._answers import error as _error
from fencekit.web._answers import json_error as _json_error
from fencekit.web._answers import notice as _notice
from fencekit.web._answers import root as _root
from fencekit.web._batch_pages import BatchPages
from fencekit.web._metrics import Metrics
from fencekit.web._pages import (
    render_confirm,
    render_dashboard,
    render_history,
    render_job,
)
from fencekit.web._queue_pages import QueuePages
from fencekit.web._security import (
    SECURITY_HEADERS,
    Credentials,
    NoSniff,
    host_allowed,
    process_csrf_token,
    read_form,
    same_origin,
)
from fencekit.web.browse import LISTS
from fencekit.web.source import AdminSource

__all__ = ["DEFAULT_REFRESH", "create_app"]

DEFAULT_REFRESH = 5

Handler = Callable[[Request], Awaitable[Response]]
FormHandler = Callable[[Request, dict[str, str]], Awaitable[Response]]
TaskHandler = Callable[[Request, dict[str, str], str, str], Awaitable[Response]]


def create_app(
    source: AdminSource,
    *,
    admin_username: str | None = None,
    admin_password: str | None = None,
    refresh: int = DEFAULT_REFRESH,
    protect_metrics: bool = True,
    csrf_token: str | None = None,
    hosts: frozenset[str] | None = None,
) -> Starlette:
    """The ASGI app serving probes, /admin and /metrics from ``source``.

    Basic Auth is on only when both ``admin_username`` and ``admin_password``
    are given. ``refresh`` is the dashboard's reload interval in seconds.
    ``csrf_token`` defaults to one random token per process, so several
    mounts of the app (or a restart of the web server) keep accepting forms
    rendered earlier by the same process. ``hosts``: the only ``Host`` names
    /admin and /metrics answer to (421 for others; None, the default for a
    mounted app, leaves that to the host application -- Starlette's
    ``TrustedHostMiddleware``). ``app.state.registry`` is the Prometheus
    registry of /metrics, for the host to add its own collectors.
    """
    if type(refresh) is not int or refresh < 1:
        raise ConfigError(f"refresh must be an int >= 1 (seconds), got {refresh!r}")
    credentials = None
    if admin_username is not None and admin_password is not None:
        if not admin_username or not admin_password:
            raise ConfigError("admin_username and admin_password must not be empty strings")
        credentials = Credentials(admin_username.encode(), admin_password.encode())
    admin = _Admin(source, credentials, csrf_token or process_csrf_token(), refresh, hosts)
    guarded, checked_post = admin.guarded, admin.checked_post
    routes = [
        Route("/live", admin.live, methods=["GET"]),
        Route("/ready", admin.ready, methods=["GET"]),
        Route("/admin", guarded(admin.dashboard), methods=["GET"]),
        Route("/admin/purge", guarded(admin.purge_confirm), methods=["GET"]),
        Route("/admin/purge", guarded(checked_post(admin.purge)), methods=["POST"]),
        Route("/admin/revive", guarded(checked_post(admin.revive)), methods=["POST"]),
        Route("/admin/pause", guarded(checked_post(admin.pause)), methods=["POST"]),
        Route("/admin/job", guarded(admin.job_page), methods=["GET"]),
        Route("/admin/batch/{bid:path}", guarded(admin.batch_page), methods=["GET"]),
        Route(
            "/admin/cancel-batch", guarded(checked_post(admin.cancel_batch, queue=False)), methods=["POST"]
        ),
        Route("/admin/queue", guarded(admin.queue_page), methods=["GET"]),
        Route("/admin/bulk", guarded(checked_post(admin.bulk)), methods=["POST"]),
        Route("/admin/history", guarded(admin.history_page), methods=["GET"]),
        Route("/admin/api/history", guarded(admin.history_json), methods=["GET"]),
        Route("/admin/cancel", guarded(checked_post(admin.on_task(admin.cancel))), methods=["POST"]),
        Route("/admin/retry", guarded(checked_post(admin.on_task(admin.retry))), methods=["POST"]),
        Route("/admin/run-now", guarded(checked_post(admin.on_task(admin.run_now))), methods=["POST"]),
        Route("/metrics", guarded(admin.metrics) if protect_metrics else admin.metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(NoSniff)])
    app.state.registry = admin.prometheus.registry
    app.state.source = source
    app.state.admin_open = credentials is None
    return app


class _Admin(QueuePages, BatchPages):
    """The route handlers of one app, sharing its source, credentials, token and refresh."""

    def __init__(
        self,
        source: AdminSource,
        credentials: Credentials | None,
        token: str,
        refresh: int,
        hosts: frozenset[str] | None,
    ) -> None:
        self.source = source
        self.credentials = credentials
        self.hosts = hosts
        self.token = token
        self.refresh = refresh
        self.prometheus = Metrics(source)

    # checks ------------------------------------------------------------------
    def guarded(self, handler: Handler) -> Handler:
        """``handler`` for allowed ``Host`` names only, behind Basic Auth when credentials are set."""
        credentials, hosts, source = self.credentials, self.hosts, self.source

        async def endpoint(request: Request) -> Response:
            if not host_allowed(request, hosts):
                return Response(
                    "misdirected request: this server does not answer for that host name "
                    "(set web_hosts / FENCEKIT_WEB_HOSTS to add it)\n",
                    status_code=421,
                    media_type="text/plain",
                )
            if credentials is not None:
                header = request.headers.get("authorization")
                if not credentials.match(header):
                    if header:
                        client = request.client.host if request.client else "?"
                        source.logger.warning("admin: failed login from %s on %s", client, request.url.path)
                    return Response(
                        "authentication required\n",
                        status_code=401,
                        media_type="text/plain",
                        headers={"WWW-Authenticate": 'Basic realm="fencekit", charset="UTF-8"'},
                    )
            return await handler(request)

        return endpoint

    def on_task(self, handler: TaskHandler) -> FormHandler:
        """``handler(request, form, queue, jid)`` for a form that names a task, 400 without a usable jid."""

        async def endpoint(request: Request, form: dict[str, str]) -> Response:
            jid = form.get("jid", "")
            if not is_jid(jid):
                return _error(request, 400, "Bad request", "missing jid")
            return await handler(request, form, form["queue"], jid)

        return endpoint

    def checked_post(self, handler: FormHandler, *, queue: bool = True) -> Handler:
        """Same-origin and CSRF checks and a known ``queue`` field (unless ``queue`` is False: a
        form that names a batch, whose children may be in any queue), then ``handler(request, form)``."""

        async def endpoint(request: Request) -> Response:
            if not same_origin(request):
                return _error(request, 403, "Forbidden", "cross-origin or origin-less form post refused")
            form = await read_form(request)
            if form is None:
                return _error(request, 413, "Too large", "form too large")
            if not secrets.compare_digest(form.get("csrf", "").encode(), self.token.encode()):
                return _error(request, 403, "Forbidden", "missing or stale form token: reload the page")
            try:
                if queue and not await self._known(form.get("queue", "")):
                    return _error(request, 404, "Not found", "no such queue")
                return await handler(request, form)
            except StoreError as exc:
                return self._redis_down(request, exc)

        return endpoint

    async def _known(self, queue: str) -> bool:
        """True if ``queue`` is a valid name the pages may act on; raises :class:`StoreError`."""
        try:
            validate_queue(queue)
            return await self.source.is_known(queue)
        except ConfigError:
            return False

    # probes ------------------------------------------------------------------
    async def live(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        if await self.source.ready():
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "redis unavailable"}, status_code=503)

    # pages -------------------------------------------------------------------
    async def dashboard(self, request: Request) -> Response:
        try:
            snap = await self.source.snapshot()
            recent, _ = await self.source.history(None, "1h")
        except StoreError as exc:
            return self._redis_down(request, exc)
        body = render_dashboard(
            snap,
            recent=recent,
            root=_root(request),
            token=self.token,
            refresh=self.refresh,
            notice=_notice(request),
            redis=self.source.redis_display,
        )
        return HTMLResponse(body, headers=SECURITY_HEADERS)

    async def purge_confirm(self, request: Request) -> Response:
        queue = request.query_params.get("queue", "")
        try:
            if not await self._known(queue):
                return _error(request, 404, "Not found", "no such queue")
            pending = await self.source.queue(queue).length()
        except StoreError as exc:
            return self._redis_down(request, exc)
        body = render_confirm(queue, pending, root=_root(request), token=self.token)
        return HTMLResponse(body, headers=SECURITY_HEADERS)

    async def job_page(self, request: Request) -> Response:
        jid = request.query_params.get("jid", "").strip()
        if not is_jid(jid):
            return _error(request, 400, "Bad request", f"give a jid: {JID_RULE}")
        try:
            job = await self.source.job(jid)
        except StoreError as exc:
            return self._redis_down(request, exc)
        if job is None:
            return _error(
                request, 404, "Not found", "no record of that task: it keeps none, or it was forgotten"
            )
        body = render_job(
            job, root=_root(request), token=self.token, notice=_notice(request), now=time.time()
        )
        return HTMLResponse(body, headers=SECURITY_HEADERS)

    async def history_page(self, request: Request) -> Response:
        found = await self._history(request)
        if isinstance(found, Response):
            return found
        queue, window, (history, per_queue) = found
        try:
            queues = await self.source.known_queues()
        except StoreError as exc:
            return self._redis_down(request, exc)
        body = render_history(
            history, per_queue, queue=queue, window=window, queues=queues, root=_root(request)
        )
        return HTMLResponse(body, headers=SECURITY_HEADERS)

    async def history_json(self, request: Request) -> Response:
        found = await self._history(request, json=True)
        if isinstance(found, Response):
            return found
        _, _, (history, per_queue) = found
        body = history.to_json()
        if request.query_params.get("per_queue") == "1":
            body["per_queue"] = {q: h.to_json()["buckets"] for q, h in per_queue.items()}
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    async def _history(
        self, request: Request, *, json: bool = False
    ) -> Response | tuple[str | None, str, tuple[History, dict[str, History]]]:
        """The ``?queue=`` (optional) and ``?window=`` (default 1h) of a request, and their history."""
        fail = _json_error if json else _error
        queue = request.query_params.get("queue") or None
        window = request.query_params.get("window", "1h")
        if window not in WINDOWS:
            return fail(request, 400, "Bad request", f"window must be one of {', '.join(WINDOWS)}")
        try:
            if queue is not None and not await self._known(queue):
                return fail(request, 404, "Not found", "no such queue")
            return queue, window, await self.source.history(queue, window)
        except StoreError as exc:
            if json:
                return _json_error(request, 503, "Redis unavailable", str(exc))
            return self._redis_down(request, exc)

    # actions (behind checked_post) -------------------------------------------
    async def cancel(self, request: Request, form: dict[str, str], queue: str, jid: str) -> Response:
        cancelled = await self.source.cancel(jid, queue)
        if cancelled:
            self.source.logger.warning("admin: cancelled task %s of queue %r", jid, queue)
        done = "cancelled" if cancelled else "not-cancelled"
        if form.get("next") == "admin":  # from the dashboard's running and scheduled rows
            return RedirectResponse(f"{_root(request)}/admin?done={done}", 303)
        return RedirectResponse(f"{_root(request)}/admin/job?jid={quote(jid, safe='')}&done={done}", 303)

    async def run_now(self, request: Request, form: dict[str, str], queue: str, jid: str) -> Response:
        moved = await self.source.queue(queue).run_now(jid)
        if moved:
            self.source.logger.info("admin: started scheduled task %s of queue %r now", jid, queue)
        return RedirectResponse(f"{_root(request)}/admin?done={'run-now' if moved else 'run-now-gone'}", 303)

    async def retry(self, request: Request, form: dict[str, str], queue: str, jid: str) -> Response:
        again = await self.source.queue(queue).retry_failed(jid)
        if again:
            self.source.logger.info("admin: re-enqueued failed task %s of queue %r", jid, queue)
        done = "retried" if again else "retry-gone"
        return RedirectResponse(f"{_root(request)}/admin/job?jid={quote(jid, safe='')}&done={done}", 303)

    async def purge(self, request: Request, form: dict[str, str]) -> Response:
        if form.get("confirm") != "yes":
            return _error(request, 400, "Not confirmed", "purging needs the confirmation step")
        queue = form["queue"]
        dropped = await self.source.queue(queue).purge()
        self.source.logger.warning("admin: purged %d pending task(s) of queue %r", dropped, queue)
        return RedirectResponse(f"{_root(request)}/admin?done=purged&n={dropped}", status_code=303)

    async def pause(self, request: Request, form: dict[str, str]) -> Response:
        """Pause or resume ``queue`` on every host (``action``: pause | resume), as ``queue.pause()``."""
        queue, action = form["queue"], form.get("action", "")
        if action not in ("pause", "resume"):
            return _error(request, 400, "Bad request", "action must be pause or resume")
        handle = self.source.queue(queue)
        changed = await (handle.pause() if action == "pause" else handle.resume())
        state = "paused" if action == "pause" else "resumed"
        if changed:
            self.source.logger.warning("admin: %s queue %r", state, queue)
        else:
            self.source.logger.warning("admin: queue %r was %s already", queue, state)
        done = state if changed else f"{state}-already"
        if form.get("next") == "queue":  # from the queue's browse page: back to the list it showed
            which = form.get("list", "")
            query = urlencode({"queue": queue, "list": which if which in LISTS else LISTS[0], "done": done})
            return RedirectResponse(f"{_root(request)}/admin/queue?{query}", 303)
        return RedirectResponse(f"{_root(request)}/admin?done={done}", 303)

    async def revive(self, request: Request, form: dict[str, str]) -> Response:
        queue, dead_id = form["queue"], form.get("id", "")
        if not dead_id or len(dead_id) > 200:
            return _error(request, 400, "Bad request", "missing dead-letter id")
        revived = await self.source.queue(queue).revive(dead_id)
        if revived:
            self.source.logger.info("admin: re-enqueued dead letter %r of queue %r", dead_id, queue)
        done = "revived" if revived else "gone"
        return RedirectResponse(f"{_root(request)}/admin?done={done}", status_code=303)

    # metrics and errors ------------------------------------------------------
    async def metrics(self, request: Request) -> Response:
        return Response(await self.prometheus.scrape(), media_type=CONTENT_TYPE_LATEST)

    def _redis_down(self, request: Request, exc: StoreError) -> Response:
        """503, reloading itself until Redis answers; shows the Redis URL without its password."""
        self.source.logger.warning("admin page: Redis unavailable: %s", exc)
        return _error(
            request,
            503,
            "Redis unavailable",
            "Redis did not answer; the page will retry.",
            refresh=DEFAULT_REFRESH,
            redis=self.source.redis_display,
        )
