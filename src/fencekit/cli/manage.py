"""``fencekit cancel``, ``purge``, ``pause``, ``resume``, ``dead-letters`` and ``failed``: the verbs
that change a queue.

Each is a thin layer over the ``Client``/``Queue`` API, so the command line
does exactly what a program would. The destructive ones (``purge``,
``dead-letters --purge``) ask on a terminal and refuse off one unless
``--yes``. The bulk ones (``dead-letters --revive-all``, ``failed
--retry-all``) run in pipelined batches (:mod:`fencekit.produce._bulk`) with a
bar on stderr. A queue name that the registry does not know is refused with
exit 1 and the known names: a typo must not read as "empty".
"""

from __future__ import annotations

import argparse
from typing import Any

from fencekit.cli.base import Context, Exit, Verb, known_queue_or_none
from fencekit.cli.inspect import job_dict, print_job
from fencekit.cli.output import when
from fencekit.produce._bulk import DEFAULT_BATCH
from fencekit.produce.handle import DeadLetter, Queue

__all__ = ["VERBS"]

_PAYLOAD_SHOWN = 80


async def _queue(ctx: Context, name: str) -> Queue | None:
    """The handle of ``name`` if the registry knows it; else prints why and returns None."""
    queue = ctx.client.queue(name)  # ConfigError (exit 2) for a name that cannot be a queue
    problem = known_queue_or_none(name, await ctx.client.queues())
    if problem is not None:
        if ctx.out.as_json:
            ctx.out.json({"queue": name, "found": False})
        ctx.out.error(problem)
        return None
    return queue


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _batch_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batch", type=_positive, default=DEFAULT_BATCH, metavar="N",
        help=f"items per round trip of a bulk operation (default: {DEFAULT_BATCH})",
    )  # fmt: skip


# cancel ---------------------------------------------------------------------------------


def _cancel_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("jid", metavar="JID", help="the task's jid")
    parser.add_argument("--queue", help="its queue (default: looked for in every known queue)")


async def _cancel(ctx: Context, args: argparse.Namespace) -> int:
    cancelled = await ctx.client.cancel(args.jid, queue=args.queue)
    status = None
    if not cancelled:
        info = await ctx.client.job(args.jid, queue=args.queue)
        status = info.status.value if info is not None else None
    if ctx.out.as_json:
        ctx.out.json(
            {"jid": args.jid, "cancelled": cancelled, "status": "cancelled" if cancelled else status}
        )
    if cancelled:
        if not ctx.out.as_json:
            ctx.out.line(f"cancelled {args.jid}")
        return Exit.OK
    why = f"it is {status} already" if status is not None else "no such task waiting or running"
    ctx.out.error(f"task {args.jid} not cancelled: {why}")
    return Exit.NOT_DONE


# purge ----------------------------------------------------------------------------------


def _purge_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="QUEUE")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")


async def _purge(ctx: Context, args: argparse.Namespace) -> int:
    queue = await _queue(ctx, args.queue)
    if queue is None:
        return Exit.NOT_DONE
    waiting = await queue.length()
    if not ctx.confirm(f"Drop the {waiting} task(s) waiting in {queue.name!r}?", args.yes):
        ctx.out.error("nothing purged")
        return Exit.NOT_DONE
    purged = await queue.purge()
    if ctx.out.as_json:
        ctx.out.json({"queue": queue.name, "purged": purged})
    else:
        ctx.out.line(f"purged {purged} waiting task(s) from {queue.name}")
    return Exit.OK


# pause, resume ---------------------------------------------------------------------------


def _queue_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="QUEUE")


def _pausing(paused: bool) -> Any:
    async def run(ctx: Context, args: argparse.Namespace) -> int:
        queue = await _queue(ctx, args.queue)
        if queue is None:
            return Exit.NOT_DONE
        changed = await (queue.pause() if paused else queue.resume())
        if ctx.out.as_json:
            ctx.out.json({"queue": queue.name, "paused": paused, "changed": changed})
        else:
            state = "paused" if paused else "resumed"
            ctx.out.line(f"{queue.name} {state}" if changed else f"{queue.name} was {state} already")
        return Exit.OK

    return run


# dead-letters ---------------------------------------------------------------------------


def letter_dict(letter: DeadLetter) -> dict[str, Any]:
    """One dead letter in ``fencekit dead-letters --json`` (the payload as text, bad bytes replaced)."""
    return {
        "id": letter.id,
        "jid": letter.jid,
        "reason": letter.reason,
        "at": letter.at,
        "payload": letter.raw.decode("utf-8", errors="replace"),
        "extra": letter.extra,
    }


def _dead_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="QUEUE")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--revive", metavar="ID", help="enqueue this dead letter again")
    action.add_argument("--revive-all", action="store_true", help="enqueue every dead letter again")
    action.add_argument("--purge", action="store_true", help="drop every dead letter")
    parser.add_argument(
        "--limit", type=_positive, default=50, metavar="N", help="letters listed (default: 50)"
    )
    parser.add_argument("--yes", action="store_true", help="do not ask before --purge")
    _batch_argument(parser)


async def _dead_letters(ctx: Context, args: argparse.Namespace) -> int:
    queue = await _queue(ctx, args.queue)
    if queue is None:
        return Exit.NOT_DONE
    out = ctx.out
    if args.revive is not None:
        revived = await queue.revive(args.revive)
        if out.as_json:
            out.json({"queue": queue.name, "id": args.revive, "revived": revived})
        if not revived:
            out.error(f"no dead letter {args.revive!r} in {queue.name}")
            return Exit.NOT_DONE
        if not out.as_json:
            out.line(f"revived {args.revive}")
        return Exit.OK
    if args.revive_all:
        total = await queue.dead_count()
        with out.bar(f"reviving dead letters of {queue.name}", total) as bar:
            count_revived: int = await queue.revive_all(
                batch=args.batch, progress=lambda handled, of: bar.update(handled)
            )
        if out.as_json:
            out.json({"queue": queue.name, "revived": count_revived})
        else:
            out.line(f"revived {count_revived} dead letter(s) of {queue.name}")
        return Exit.OK
    if args.purge:
        count = await queue.dead_count()
        if not ctx.confirm(f"Drop the {count} dead letter(s) of {queue.name!r}?", args.yes):
            out.error("nothing purged")
            return Exit.NOT_DONE
        purged = await queue.purge_dead()
        if out.as_json:
            out.json({"queue": queue.name, "purged": purged})
        else:
            out.line(f"purged {purged} dead letter(s) of {queue.name}")
        return Exit.OK
    letters = await queue.dead_letters(args.limit)
    count = await queue.dead_count()
    if out.as_json:
        out.json({"queue": queue.name, "count": count, "dead_letters": [letter_dict(d) for d in letters]})
        return Exit.OK
    if not letters:
        out.line(f"no dead letters in {queue.name}")
        return Exit.OK
    rows = [(d.id, when(d.at), d.jid, d.reason, _clip(letter_dict(d)["payload"])) for d in letters]
    out.table(
        ("id", "died", "jid", "reason", "payload"),
        rows,
        title=f"{queue.name}: newest {len(letters)} of {count} dead letter(s)",
    )
    return Exit.OK


def _clip(text: str) -> str:
    return text if len(text) <= _PAYLOAD_SHOWN else text[: _PAYLOAD_SHOWN - 1] + "…"


# failed ---------------------------------------------------------------------------------


def _failed_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="QUEUE")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--retry", metavar="JID", help="run this failed task again from its first attempt")
    action.add_argument("--retry-all", action="store_true", help="run every kept failure again")
    action.add_argument("--show", metavar="JID", help="print one kept failure with its traceback")
    parser.add_argument(
        "--limit", type=_positive, default=50, metavar="N", help="failures listed (default: 50)"
    )
    _batch_argument(parser)


async def _failed(ctx: Context, args: argparse.Namespace) -> int:
    queue = await _queue(ctx, args.queue)
    if queue is None:
        return Exit.NOT_DONE
    out = ctx.out
    if args.retry is not None:
        retried = bool(await queue.retry_failed(args.retry))
        if out.as_json:
            out.json({"queue": queue.name, "jid": args.retry, "retried": retried})
        if not retried:
            out.error(f"task {args.retry} is not a kept failure of {queue.name}")
            return Exit.NOT_DONE
        if not out.as_json:
            out.line(f"retried {args.retry}")
        return Exit.OK
    if args.retry_all:
        total = await queue.failed_count()
        with out.bar(f"retrying failed tasks of {queue.name}", total) as bar:
            retried_n: int = await queue.retry_all_failed(
                batch=args.batch, progress=lambda handled, of: bar.update(handled)
            )
        if out.as_json:
            out.json({"queue": queue.name, "retried": retried_n})
        else:
            out.line(f"retried {retried_n} failed task(s) of {queue.name}")
        return Exit.OK
    if args.show is not None:
        info = await ctx.client.job(args.show, queue=queue.name)
        if info is None:
            out.error(f"no record of task {args.show} in {queue.name}")
            return Exit.NOT_DONE
        if out.as_json:
            out.json(job_dict(info))
        else:
            print_job(ctx, info)
        return Exit.OK
    kept = await queue.failed(args.limit)
    count = await queue.failed_count()
    if out.as_json:
        out.json({"queue": queue.name, "count": count, "failed": [job_dict(i) for i in kept]})
        return Exit.OK
    if not kept:
        out.line(f"no failed tasks kept in {queue.name}")
        return Exit.OK
    rows = [
        (i.jid, i.operation, i.attempt, when(i.finished_at), _clip(str(i.error) if i.error else "-"))
        for i in kept
    ]
    out.table(
        ("jid", "operation", "attempt", "failed", "error"),
        rows,
        title=f"{queue.name}: newest {len(kept)} of {count} kept failure(s)",
        numeric=("attempt",),
    )
    return Exit.OK


VERBS = (
    Verb(
        "cancel",
        "Cancel a task: a waiting one leaves its queue, a running one is fenced out and cancelled.",
        _cancel_arguments,
        _cancel,
        settings=("keep_finished",),
    ),
    Verb(
        "purge",
        "Drop every task waiting in QUEUE (not scheduled or running ones; counters are kept).",
        _purge_arguments,
        _purge,
    ),
    Verb(
        "pause",
        "Pause QUEUE on every host: within about a second no consumer claims from it (running tasks "
        "go on, enqueues are accepted) until `fencekit resume QUEUE`.",
        _queue_argument,
        _pausing(True),
    ),
    Verb(
        "resume",
        "Resume a paused QUEUE: consumers claim from it again within about a second.",
        _queue_argument,
        _pausing(False),
    ),
    Verb(
        "dead-letters",
        "List a queue's dead letters (newest first), or revive one, revive all, or purge them.",
        _dead_arguments,
        _dead_letters,
    ),
    Verb(
        "failed",
        "List the failures a queue keeps (newest first), show one, or run one or all again.",
        _failed_arguments,
        _failed,
        settings=("keep_result",),
    ),
)
