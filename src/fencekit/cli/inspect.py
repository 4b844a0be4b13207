"""``fencekit queues``, ``consumers``, ``schedules``, ``job JID``, ``batch BID``: reading, never writing.

``schedules`` lists the periodic schedules (``client.schedules()``).
``queues`` and ``consumers`` read what the admin page reads, through the
same :class:`~fencekit.web.source.AdminSource` (three pipelined round trips;
consumers' beat ages measured on Redis's clock), so the command line and
``/admin`` can never disagree. ``job`` reads one task's record as
``Client.job`` does, ``batch`` one batch as ``Client.batch_info`` does. The
JSON shapes are listed in ``docs/reference/cli.md``.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, fields
from typing import Any

from fencekit.cli.base import Context, Exit, Verb
from fencekit.cli.output import age, when
from fencekit.jobs.batches import BatchInfo
from fencekit.jobs.records import JobInfo
from fencekit.produce.handle import QueueStats
from fencekit.produce.schedules import ScheduleInfo
from fencekit.web._views import ConsumerView, QueueView
from fencekit.web.source import AdminSource

__all__ = ["VERBS", "batch_dict", "job_dict"]

STAT_FIELDS = tuple(f.name for f in fields(QueueStats))
SHOWN_FIELDS = ("processed", "failed", "retried", "fenced_out", "dead")
"""The counters of the human table; ``--wide`` (and ``--json``) show every one."""


def _source(ctx: Context) -> AdminSource:
    ttl = float(ctx.settings.get("heartbeat_ttl", 30.0))
    # dead_letter_limit 0: no lists of letters, failures or scheduled tasks, only the counts
    return AdminSource(ctx.client.redis, ctx.client.keys, heartbeat_ttl=ttl, dead_letter_limit=0)


# queues ---------------------------------------------------------------------------------


def queue_dict(view: QueueView) -> dict[str, Any]:
    """One queue in ``fencekit queues --json``: the live counts, then every counter."""
    return {
        "name": view.name,
        "pending": view.pending,
        "scheduled": view.scheduled,
        "running": view.in_flight,
        "dead_letters": view.dead_letters,
        **asdict(view.stats),
    }


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # nothing beyond the common flags


def _queues_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wide", action="store_true", help="every counter (enqueued, purged, revived, expired ...)"
    )


async def _queues(ctx: Context, args: argparse.Namespace) -> int:
    snapshot = await _source(ctx).snapshot()
    if ctx.out.as_json:
        ctx.out.json(
            {
                "queues": [queue_dict(v) for v in snapshot.queues],
                "totals": {
                    "pending": sum(v.pending for v in snapshot.queues),
                    "scheduled": sum(v.scheduled for v in snapshot.queues),
                    "running": sum(v.in_flight for v in snapshot.queues),
                    "dead_letters": sum(v.dead_letters for v in snapshot.queues),
                    **asdict(snapshot.totals),
                },
            }
        )
        return Exit.OK
    if not snapshot.queues:
        ctx.out.line("no queues yet (a queue is known from its first enqueue or consumer)")
        return Exit.OK
    live = ("pending", "scheduled", "running", "dead letters")
    shown = STAT_FIELDS if args.wide else SHOWN_FIELDS
    counters = tuple(name.replace("_", " ") for name in shown)
    rows = [
        (
            v.name,
            v.pending,
            v.scheduled,
            v.in_flight,
            v.dead_letters,
            *(getattr(v.stats, f) for f in shown),
        )
        for v in snapshot.queues
    ]
    ctx.out.table(("queue", *live, *counters), rows, numeric=(*live, *counters))
    return Exit.OK


# consumers ------------------------------------------------------------------------------


def consumer_dict(view: ConsumerView) -> dict[str, Any]:
    """One consumer in ``fencekit consumers --json``."""
    return {
        "id": view.id,
        "kind": view.kind,
        "host": view.host,
        "pid": view.pid,
        "queues": list(view.queues),
        "concurrency": view.concurrency,
        "started": view.started,
        "beat_age": view.beat_age,
        "in_flight": view.in_flight,
        "alive": view.alive,
    }


async def _consumers(ctx: Context, args: argparse.Namespace) -> int:
    snapshot = await _source(ctx).snapshot()
    if ctx.out.as_json:
        ttl = float(ctx.settings["heartbeat_ttl"])
        ctx.out.json({"consumers": [consumer_dict(c) for c in snapshot.consumers], "heartbeat_ttl": ttl})
        return Exit.OK
    if not snapshot.consumers:
        ctx.out.line("no consumers registered")
        return Exit.OK
    rows = [
        (
            c.id,
            c.kind or "?",
            f"{c.host or '?'}/{c.pid if c.pid is not None else '?'}",
            ", ".join(c.queues),
            c.concurrency,
            c.in_flight,
            age(c.beat_age),
            "yes" if c.alive else "NO",
        )
        for c in snapshot.consumers
    ]
    columns = ("id", "kind", "host/pid", "queues", "concurrency", "running", "last beat", "alive")
    ctx.out.table(columns, rows, numeric=("concurrency", "running", "last beat"))
    return Exit.OK


# schedules ------------------------------------------------------------------------------


def schedule_dict(info: ScheduleInfo) -> dict[str, Any]:
    """One schedule in ``fencekit schedules --json`` (times in Unix seconds)."""
    return {
        "name": info.name,
        "queue": info.queue,
        "operation": info.operation,
        "cron": info.cron,
        "every": info.every,
        "tz": info.tz,
        "catch_up": info.catch_up,
        "params": info.params,
        "last_run": info.last_run,
        "last_jid": info.last_jid,
        "next_run": info.next_run,
        "registered_at": info.registered_at,
    }


def _last(info: ScheduleInfo) -> str:
    return when(info.last_run) if info.last_run is not None else "never"


async def _schedules(ctx: Context, args: argparse.Namespace) -> int:
    found = await ctx.client.schedules()
    if ctx.out.as_json:
        ctx.out.json({"schedules": [schedule_dict(s) for s in found]})
        return Exit.OK
    if not found:
        ctx.out.line("no periodic schedules registered (a running Server or pool registers its own)")
        return Exit.OK
    rows = [
        (s.name, s.expression, s.tz, "yes" if s.catch_up else "no", _last(s), when(s.next_run)) for s in found
    ]
    ctx.out.table(("name", "schedule", "tz", "catch-up", "last run", "next run"), rows)
    return Exit.OK


# job ------------------------------------------------------------------------------------


def job_dict(info: JobInfo) -> dict[str, Any]:
    """A task's record in ``fencekit job --json`` (and in ``failed --json``)."""
    return {
        "jid": info.jid,
        "queue": info.queue,
        "operation": info.operation,
        "status": info.status.value,
        "attempt": info.attempt,
        "token": info.token,
        "enqueued_at": info.enqueued_at,
        "started_at": info.started_at,
        "finished_at": info.finished_at,
        "due_at": info.due_at,
        "progress": asdict(info.progress) if info.progress is not None else None,
        "result": info.result,
        "error": asdict(info.error) if info.error is not None else None,
        "params": info.params,
        "runs": [asdict(run) for run in info.runs],
        "batch": info.batch,
    }


def _job_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("jid", metavar="JID", help="the task's jid")
    parser.add_argument("--queue", help="its queue (default: looked for in every known queue)")


def print_job(ctx: Context, info: JobInfo) -> None:
    """The human form of a record: one field a line, then the traceback if it failed."""
    out = ctx.out
    progress = info.progress
    lines = [
        ("jid", info.jid),
        ("queue", info.queue),
        ("operation", info.operation or "?"),
        ("status", info.status.value),
        ("attempt", str(info.attempt)),
        ("token", str(info.token) if info.token is not None else "-"),
        ("enqueued", when(info.enqueued_at)),
        ("due", when(info.due_at)),
        ("started", when(info.started_at)),
        ("finished", when(info.finished_at)),
        ("progress", f"{progress.fraction:.0%} {progress.message}".rstrip() if progress else "-"),
        ("params", _compact(info.params)),
    ]
    if info.batch is not None:
        lines.insert(3, ("batch", info.batch))
    if info.result is not None or info.status.value == "done":
        lines.append(("result", _compact(info.result)))
    if info.error is not None:
        lines.append(("error", str(info.error)))
    for name, value in lines:
        out.line(f"{name:<10} {value}")
    if info.error is not None and info.error.traceback:
        out.line("traceback:")
        out.line(info.error.traceback.rstrip("\n"))


def _compact(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)


async def _job(ctx: Context, args: argparse.Namespace) -> int:
    info = await ctx.client.job(args.jid, queue=args.queue)
    if info is None:
        if ctx.out.as_json:
            ctx.out.json({"jid": args.jid, "found": False})
        ctx.out.error(f"no record of task {args.jid} (it keeps none, it was forgotten, or the jid is wrong)")
        return Exit.NOT_DONE
    if ctx.out.as_json:
        ctx.out.json({"found": True, **job_dict(info)})
    else:
        print_job(ctx, info)
    return Exit.OK


# batch ----------------------------------------------------------------------------------


def batch_dict(info: BatchInfo) -> dict[str, Any]:
    """A batch in ``fencekit batch --json`` (times in Unix seconds)."""
    return {
        "bid": info.bid,
        "state": info.state.value,
        "done": info.done,
        "total": info.total,
        "pending": info.pending,
        "running": info.running,
        "succeeded": info.succeeded,
        "failed": info.failed,
        "cancelled": info.cancelled,
        "created_at": info.created_at.timestamp(),
        "finished_at": info.finished_at.timestamp() if info.finished_at is not None else None,
        "parent": info.parent,
        "callbacks": dict(info.callbacks),
    }


def _batch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bid", metavar="BID", help="the batch's id (Batch.bid)")


def print_batch(ctx: Context, info: BatchInfo) -> None:
    """The human form of a batch: one field a line, then its callbacks by kind."""
    final = info.succeeded + info.failed + info.cancelled
    share = f" ({final / info.total:.0%})" if info.total else ""
    lines = [
        ("bid", info.bid),
        ("state", info.state.value),
        ("total", str(info.total)),
        ("final", f"{final} of {info.total}{share}"),
        ("pending", str(info.pending)),
        ("running", str(info.running)),
        ("succeeded", str(info.succeeded)),
        ("failed", str(info.failed)),
        ("cancelled", str(info.cancelled)),
        ("created", when(info.created_at.timestamp())),
        ("finished", when(info.finished_at.timestamp() if info.finished_at is not None else None)),
        ("parent", info.parent or "-"),
    ]
    for name, value in lines:
        ctx.out.line(f"{name:<10} {value}")
    if not info.callbacks:
        ctx.out.line(f"{'callbacks':<10} -")
    for kind, jid in sorted(info.callbacks.items()):
        ctx.out.line(f"{'on_' + kind:<10} {jid}")


async def _batch(ctx: Context, args: argparse.Namespace) -> int:
    info = await ctx.client.batch_info(args.bid)
    if info is None:
        if ctx.out.as_json:
            ctx.out.json({"bid": args.bid, "found": False})
        ctx.out.error(f"no batch {args.bid} (it finished longer ago than it is kept, or the id is wrong)")
        return Exit.NOT_DONE
    if ctx.out.as_json:
        ctx.out.json({"found": True, **batch_dict(info)})
    else:
        print_batch(ctx, info)
    return Exit.OK


VERBS = (
    Verb(
        "queues",
        "A table of every known queue: pending, scheduled, running, dead letters and its counters.",
        _queues_arguments,
        _queues,
    ),
    Verb(
        "consumers",
        "The registered consumers: id, kind, host/pid, queues, concurrency, last beat, alive.",
        _no_arguments,
        _consumers,
        settings=("heartbeat_ttl",),
        epilog="A consumer is alive while its last beat is younger than --heartbeat-ttl.",
    ),
    Verb(
        "schedules",
        "The periodic schedules the running processes registered: expression, tz, last and next run.",
        _no_arguments,
        _schedules,
    ),
    Verb(
        "job",
        "One task's record: status, attempt, token, times, progress, result or error, params.",
        _job_arguments,
        _job,
    ),
    Verb(
        "batch",
        "One batch: state, its children by state (pending, running, succeeded ...), times, callbacks.",
        _batch_arguments,
        _batch,
    ),
)
