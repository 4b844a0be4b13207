"""Every setting of ``Client``, ``Server`` and the pool, declared once.

A setting is one entry of the TypedDicts below: its name, its type and an
:class:`Option` (default, check, help). Everything else is derived from those
entries, so a new setting is one line here plus its use:

- the typed keyword arguments of ``Client(...)``, ``Server(...)`` and
  ``Pool(...)`` (PEP 692 ``**options: Unpack[...]``: mypy checks them);
- the environment variable ``FENCEKIT_<NAME>`` of each, read when the
  argument is not given (``FENCEKIT_<NAME>_FILE`` for a secret: the value is
  the file's content, as Docker secrets and systemd credentials provide it);
- the ``--name`` flag of ``fencekit pool`` and its ``--help`` line (see
  :mod:`fencekit.pool.cli`);
- the settings handed to a pool child (a resolved mapping is JSON; the
  child checks it again with :func:`resolve`).

Precedence: an explicit argument or flag, then the environment, then the
default. Every value is checked once, in :func:`resolve`, and a bad one is a
:class:`~fencekit.errors.ConfigError` naming the setting and where it came
from. Resolved settings are the same TypedDicts with every key present.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from typing_extensions import TypedDict

from fencekit._options import Option, defaults, describe, given, resolve, table, with_url
from fencekit._redis.address import default_url
from fencekit._redis.keys import DEFAULT_PREFIX
from fencekit.jobs.codec import DEFAULT_MAX_PAYLOAD
from fencekit.jobs.flow import check_weights, parse_weights
from fencekit.settings._checks import (
    _cpu_count,
    _link,
    _log_format,
    _log_level,
    _not_empty,
    _port,
    _port_text,
    _prefix,
    _url,
    at_least,
    positive,
    sql_identifier,
    sql_url,
)

__all__ = [
    "DEFAULT_OUTBOX_TABLE",
    "DEFAULT_SYNC_CONCURRENCY",
    "ClientOptions",
    "ClientSettings",
    "Option",
    "PoolOptions",
    "PoolSettings",
    "ServerOptions",
    "ServerSettings",
    "UrlOption",
    "defaults",
    "describe",
    "given",
    "resolve",
    "resolve_connecting",
    "table",
    "with_url",
]

DEFAULT_OUTBOX_TABLE = "fencekit_outbox"
"""The outbox table's name unless ``outbox_table`` says otherwise (docs/guides/outbox.md)."""

DEFAULT_SYNC_CONCURRENCY = 16
"""Threads of one consumer for sync (plain ``def``) tasks, unless ``sync_concurrency`` says otherwise."""

# the settings ------------------------------------------------------------------------


class UrlOption(TypedDict, total=False):
    """Where Redis is: a positional argument of ``Client``/``Server``, so kept apart."""

    redis_url: Annotated[
        str,
        Option(
            default_url,
            "Redis URL: redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// (a password "
            "is better kept in the environment than on a command line; default: the embedded Redis of "
            "the data directory, which the pool, Server and Client start if none runs; a server on the "
            "default port is used only when named)",
            check=_url,
            secret=True,
            metavar="URL",
        ),
    ]


class ClientOptions(TypedDict, total=False):
    """The settings of a producer (``Client``); ``Server`` and the pool have them too."""

    prefix: Annotated[
        str, Option(DEFAULT_PREFIX, "key prefix: every key starts with '<prefix>:'", check=_prefix)
    ]
    max_payload: Annotated[
        int, Option(DEFAULT_MAX_PAYLOAD, "largest encoded task in bytes", check=at_least(64), metavar="BYTES")
    ]
    durable_replicas: Annotated[
        int,
        Option(
            0, "enqueues and acks wait (WAIT) for this many replicas; 0: off", check=at_least(0), metavar="N"
        ),
    ]
    durable_timeout: Annotated[
        float,
        Option(1.0, "seconds WAIT may take before DurabilityError", check=positive, metavar="S"),
    ]
    keep_result: Annotated[
        float,
        Option(
            3600.0,
            "seconds a finished task's record (status, result, error) is kept; 0: tasks keep no "
            "record (the fastest path; client.job() then knows nothing of them)",
            check=at_least(0.0),
            metavar="S",
        ),
    ]
    keep_finished: Annotated[
        int,
        Option(
            10_000, "finished task records kept per queue (oldest dropped)", check=at_least(0), metavar="N"
        ),
    ]
    outbox_table: Annotated[
        str,
        Option(
            DEFAULT_OUTBOX_TABLE,
            "the SQL table of the transactional outbox: enqueue_in writes it, the relay reads it",
            check=sql_identifier,
            metavar="NAME",
        ),
    ]


class ServerOptions(ClientOptions, total=False):
    """The settings of the consumers and the shared services (``Server`` and the pool)."""

    concurrency: Annotated[int, Option(1, "tasks one consumer runs at once", check=at_least(1), metavar="N")]
    sync_concurrency: Annotated[
        int,
        Option(
            DEFAULT_SYNC_CONCURRENCY,
            "threads one consumer runs sync (plain def) tasks in; more wait for a free thread",
            check=at_least(1),
            metavar="N",
        ),
    ]
    queue_weights: Annotated[
        dict[str, int] | None,
        Option(
            None,
            "claim shares of queues with work: a queue of weight w is claimed from w times as often, "
            "e.g. emails=3,reports=1 (others 1; default: round-robin)",
            check=check_weights,
            parse=parse_weights,
            metavar="Q=W,...",
        ),
    ]
    max_claim: Annotated[
        int, Option(512, "most tasks a consumer claims in one round trip", check=at_least(1), metavar="N")
    ]
    heartbeat_ttl: Annotated[
        float,
        Option(
            30.0, "seconds a consumer stays registered without a heartbeat", check=at_least(0.5), metavar="S"
        ),
    ]
    grace: Annotated[
        float,
        Option(10.0, "seconds running tasks get to finish at a stop", check=at_least(0.0), metavar="S"),
    ]
    wait_for_redis: Annotated[
        float,
        Option(
            0.0,
            "seconds a start waits for Redis to answer before giving up (0: give up at once)",
            check=at_least(0.0),
            metavar="S",
        ),
    ]
    outbox_url: Annotated[
        str | None,
        Option(
            None,
            "relay the transactional outbox of this database (a SQLAlchemy URL, PostgreSQL or "
            "MariaDB/MySQL) to Redis: tasks written with enqueue_in run once their transaction "
            "committed (default: no relay)",
            check=sql_url,
            secret=True,
            metavar="URL",
        ),
    ]
    outbox_batch: Annotated[
        int, Option(500, "outbox rows the relay moves in one transaction", check=at_least(1), metavar="N")
    ]
    outbox_poll: Annotated[
        float,
        Option(
            0.2,
            "seconds between two looks at an empty outbox (PostgreSQL's NOTIFY wakes the relay at once)",
            check=positive,
            metavar="S",
        ),
    ]
    web_port: Annotated[
        int | None,
        Option(3030, "port of /live /ready /admin /metrics (0: any free port; off: none)", check=_port,
               parse=_port_text, metavar="PORT"),
    ]  # fmt: skip
    web_host: Annotated[str, Option("127.0.0.1", "address the web server binds", metavar="HOST")]
    web_hosts: Annotated[
        str | None,
        Option(
            None,
            "Host names /admin and /metrics answer to, comma-separated, * for any "
            "(default: localhost, 127.0.0.1, ::1 and web_host)",
            metavar="NAMES",
        ),
    ]
    admin_username: Annotated[
        str | None, Option(None, "user name of HTTP Basic Auth on /admin and /metrics", check=_not_empty)
    ]
    admin_password: Annotated[
        str | None,
        Option(
            None,
            "password of HTTP Basic Auth on /admin and /metrics (keep it in the environment)",
            check=_not_empty,
            secret=True,
        ),
    ]
    fence_ttl: Annotated[
        float,
        Option(
            7 * 24 * 3600.0,
            "seconds a job's fence key outlives its last raise (7 days)",
            check=positive,
            metavar="S",
        ),
    ]
    keep_dead: Annotated[
        int, Option(10_000, "dead letters kept per queue (oldest dropped)", check=at_least(0), metavar="N")
    ]
    keep_failed: Annotated[
        int,
        Option(
            1_000,
            "failed tasks kept per queue with their traceback, for retry_failed (oldest dropped)",
            check=at_least(0),
            metavar="N",
        ),
    ]
    burst: Annotated[
        bool,
        Option(
            False,
            "burst mode: serve until every queue of the app is empty (nothing pending, scheduled or "
            "in flight), then stop as on SIGTERM and exit 0 (batch runs, tests)",
        ),
    ]
    burst_timeout: Annotated[
        float | None,
        Option(
            None,
            "burst mode: stop after this many seconds even if tasks are left (a task scheduled far "
            "ahead, say), saying what is left, with exit code 5 (default: none, wait for them)",
            check=positive,
            metavar="S",
        ),
    ]
    link: Annotated[
        str, Option("lean", "hot-path connection: lean or redis-py (benchmarks)", check=_link, flag=False)
    ]


class PoolOptions(ServerOptions, total=False):
    """Settings only the pool has."""

    procs: Annotated[
        int, Option(_cpu_count, "child processes (default: CPU count)", check=at_least(1), metavar="N")
    ]
    hang_timeout: Annotated[
        float | None,
        Option(None, "kill a child whose loop is silent this long (default: heartbeat TTL)", check=positive,
               metavar="S"),
    ]  # fmt: skip
    log_level: Annotated[
        str,
        Option("INFO", "logging level of the pool", check=_log_level,
               choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")),
    ]  # fmt: skip
    log_format: Annotated[
        str,
        Option("text", "log lines of the pool: text, or json (one object per line, with the task's "
               "jid, queue, operation, attempt, token and duration)", check=_log_format,
               choices=("text", "json")),
    ]  # fmt: skip
    data_dir: Annotated[
        str | None,
        Option(
            None, "data directory of the embedded Redis (default: ~/.local/share/fencekit)", metavar="DIR"
        ),
    ]
    max_procs: Annotated[
        int | None,
        Option(
            None,
            "autoscaling: grow the pool up to N children while work waits (scale_backlog), and back "
            "toward --procs once it stays low for scale_cooldown (default: a fixed pool of --procs)",
            check=at_least(1),
            metavar="N",
        ),
    ]
    scale_backlog: Annotated[
        int,
        Option(
            100,
            "autoscaling: tasks waiting (pending and due) per child above which the pool grows",
            check=at_least(1),
            metavar="N",
        ),
    ]
    scale_cooldown: Annotated[
        float,
        Option(
            15.0,
            "autoscaling: seconds the backlog must stay low before the pool shrinks (a child "
            "scaled down finishes its tasks first, as a recycled one does)",
            check=positive,
            metavar="S",
        ),
    ]
    scale_lag: Annotated[
        float,
        Option(
            0.25,
            "autoscaling: also grow by one child while tasks wait and every child's event loop runs "
            "this many seconds late (loops busy with CPU work); 0: the backlog alone decides",
            check=at_least(0),
            metavar="S",
        ),
    ]
    max_jobs: Annotated[
        int | None,
        Option(
            None,
            "replace a child after it claimed this many tasks: it finishes them and exits, a new one "
            "takes its slot; no task fails or spends an attempt (default: never)",
            check=at_least(1),
            metavar="N",
        ),
    ]
    max_jobs_jitter: Annotated[
        int,
        Option(
            0,
            "add a random 0..N to each child's max_jobs, so that children are not all replaced at once",
            check=at_least(0),
            metavar="N",
        ),
    ]
    max_memory: Annotated[
        float | None,
        Option(
            None,
            "replace a child whose resident memory is above this many MB (checked every 2 s), the way "
            "max_jobs does (default: never)",
            check=positive,
            metavar="MB",
        ),
    ]


class ClientSettings(UrlOption, ClientOptions):
    """Resolved settings of a ``Client``: every key present."""


class ServerSettings(UrlOption, ServerOptions):
    """Resolved settings of a ``Server``: every key present."""


class PoolSettings(UrlOption, PoolOptions):
    """Resolved settings of the pool (supervisor and children): every key present."""


def resolve_connecting(kind: type, redis_url: str | None, options: Mapping[str, Any], owner: str) -> Any:
    """:func:`resolve` for a part that connects (``Client``, ``SyncClient``, ``Server``): with no
    Redis URL given (argument or ``FENCEKIT_REDIS_URL``), the embedded Redis of the data directory,
    started if none runs (:func:`fencekit._redis.embedded.default_url`) -- never whatever answers
    on the default port."""
    explicit = with_url(redis_url, options)
    settings = resolve(kind, explicit, owner=owner)
    if not given(kind, "redis_url", explicit):
        from fencekit._redis.embedded import default_url as embedded_url

        settings["redis_url"] = embedded_url()
    return settings
