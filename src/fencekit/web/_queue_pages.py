"""The handlers of a queue's task lists: the browse page and its bulk actions.

``GET /admin/queue`` shows one list a page at a time (:mod:`fencekit.web.browse`), under
the queue's name with its "paused" badge and Pause / Resume button (``POST /admin/pause``)
and, when tasks are parked or fair-share keys have work, its Flow section
(:mod:`fencekit.web._flow_view`);
``POST /admin/bulk`` applies one action to the tasks the page's filter
selects -- cancel (pending, scheduled, running), run now (scheduled), retry
(failed, dead), delete (finished, failed, dead) -- at most :data:`~fencekit.web.browse.BULK_LIMIT` per submit,
behind the same checks as every admin form (same origin, CSRF token, a known
queue; :meth:`fencekit.web.app._Admin.checked_post`) and a confirmation box.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from fencekit._redis import scripts
from fencekit._redis.run import arun
from fencekit.errors import StoreError
from fencekit.web._answers import error, notice, root
from fencekit.web._flow_view import read_flow
from fencekit.web._pages import render_browse
from fencekit.web._security import SECURITY_HEADERS
from fencekit.web.browse import BULK_ACTIONS, Filter, Row, matching

if TYPE_CHECKING:
    from fencekit.web.source import AdminSource

__all__ = ["QueuePages"]

PARALLEL = 50  # actions in flight at once


def _filter(params: Mapping[str, str]) -> Filter:
    return Filter(*(params.get(name, "").strip()[:200] for name in ("operation", "jid", "text")))


class QueuePages:
    """Mixed into the app's handlers (``source``, ``token``, ``_known`` and ``_redis_down`` are theirs)."""

    source: AdminSource
    token: str

    if TYPE_CHECKING:

        async def _known(self, queue: str) -> bool: ...

        def _redis_down(self, request: Request, exc: StoreError) -> Response: ...

    async def queue_page(self, request: Request) -> Response:
        """One list of a queue a page at a time, filtered (``?queue=&list=&page=&operation=&jid=&text=``)."""
        params = request.query_params
        queue, which, where = params.get("queue", ""), params.get("list", "pending"), _filter(params)
        if not params.get("page", "0").isdigit():
            return error(request, 400, "Bad request", "page must be a whole number from 0")
        try:
            if not await self._known(queue):
                return error(request, 404, "Not found", "no such queue")
            page = await self.source.browse(queue, which, int(params.get("page", "0")), where)
            paused = await self.source.queue(queue).paused()
            flow = await read_flow(self.source.redis, self.source.keys, queue)
        except ValueError as exc:  # an unknown list, a page past the last one allowed
            return error(request, 400, "Bad request", str(exc))
        except StoreError as exc:
            return self._redis_down(request, exc)
        body = render_browse(
            page,
            where=where,
            root=root(request),
            now=time.time(),
            token=self.token,
            actions=BULK_ACTIONS.get(which, ()),
            notice=notice(request),
            paused=paused,
            flow=flow,
        )
        return HTMLResponse(body, headers=SECURITY_HEADERS)

    async def bulk(self, request: Request, form: dict[str, str]) -> Response:
        """Apply ``action`` to the tasks of ``list`` the form's filter selects (behind checked_post)."""
        queue, which, action, where = (
            form["queue"],
            form.get("list", ""),
            form.get("action", ""),
            _filter(form),
        )
        if action not in BULK_ACTIONS.get(which, ()):
            return error(request, 400, "Bad request", f"no bulk action {action!r} on the {which!r} list")
        if form.get("confirm") != "yes":
            return error(
                request, 400, "Not confirmed", "tick the confirmation box to act on every selected task"
            )
        try:
            rows, cut = await matching(self.source.redis, self.source.keys, queue, which, where)
        except ValueError as exc:
            return error(request, 400, "Bad request", str(exc))
        done = 0
        for start in range(0, len(rows), PARALLEL):
            chunk = rows[start : start + PARALLEL]
            done += sum(await asyncio.gather(*(self._act(queue, which, action, row) for row in chunk)))
        self.source.logger.warning(
            "admin: bulk %s on %d of %d %s task(s) of queue %r (filter: %s)",
            action, done, len(rows), which, queue, where or "none",
        )  # fmt: skip
        query = {"queue": queue, "list": which, "done": "bulk", "action": action, "n": done, "of": len(rows)}
        query |= {
            k: v for k, v in (("operation", where.operation), ("jid", where.jid), ("text", where.text)) if v
        }
        if cut:
            query["cut"] = 1
        return RedirectResponse(f"{root(request)}/admin/queue?{urlencode(query)}", 303)

    async def _act(self, queue: str, which: str, action: str, row: Row) -> bool:
        qk = self.source.keys.queue(queue)
        if which == "dead":
            if row.dead_id is None:
                return False
            if action == "delete":
                return bool(
                    await arun(
                        self.source.redis,
                        scripts.dead_drop(dead=qk.dead, dead_index=qk.dead_index, dead_id=row.dead_id),
                    )
                )
            return await self.source.queue(queue).revive(row.dead_id)
        if row.jid is None:
            return False
        if action == "cancel":
            return await self.source.cancel(row.jid, queue)
        if action == "delete":
            index = qk.failed if which == "failed" else qk.finished
            return bool(
                await arun(self.source.redis, scripts.record_drop(index=index, record=qk.job(row.jid)))
            )
        if action == "run-now":
            return await self.source.queue(queue).run_now(row.jid)
        return bool(await self.source.queue(queue).retry_failed(row.jid))
