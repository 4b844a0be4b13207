"""Flow control between and within queues (docs/guides/flow.md): queue weights and rate limits.

Within a queue, priorities are decided by the claim script (``lua/_prio.lua``).
Between queues a consumer claims, each turn, from the next queue that may have
work in a fixed rotation; :func:`weighted_order` builds that rotation. Without
weights it is the queues once each (today's round-robin); with
``queue_weights`` a queue of weight ``w`` appears ``w`` times, spread out
(smooth weighted round-robin, as nginx does), so when several queues have
work a queue of weight ``w`` is claimed from ``w`` times as often. A turn
claims up to the free slots from its queue, so the shares are of claim turns:
with every queue busy and the same free slots per turn, of claimed tasks too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from fencekit.errors import ConfigError, PayloadError
from fencekit.jobs import codec

if TYPE_CHECKING:
    from fencekit._redis.keys import QueueKeys
    from fencekit.jobs.worker import WorkerSpec

__all__ = [
    "MAX_WEIGHT",
    "Debounce",
    "FlowKeys",
    "Rate",
    "check_weights",
    "concurrency_key",
    "debounce_of",
    "debounce_options",
    "flow_keys",
    "flow_specs",
    "key_options",
    "parse_rate",
    "parse_weights",
    "weighted_order",
]

MAX_WEIGHT = 100
"""The largest weight: the rotation holds sum(weights) entries."""


def check_weights(value: Mapping[str, int]) -> dict[str, int]:
    """The ``queue_weights`` setting checked: queue name -> an int from 1 to MAX_WEIGHT.

    Raises ValueError completing "queue_weights must ...".
    """
    out: dict[str, int] = {}
    for queue, weight in value.items():
        if not isinstance(queue, str) or not queue:
            raise ValueError(f"name queues by non-empty strings, got {queue!r}")
        if type(weight) is not int or not 1 <= weight <= MAX_WEIGHT:
            raise ValueError(f"give each queue an int weight from 1 to {MAX_WEIGHT}, got {queue}={weight!r}")
        out[queue] = weight
    return out


def parse_weights(text: str) -> dict[str, int] | None:
    """``emails=3,reports=1`` (a flag or ``FENCEKIT_QUEUE_WEIGHTS``); empty or ``off``: None."""
    if text.strip().lower() in ("", "none", "off"):
        return None
    out: dict[str, int] = {}
    for part in text.split(","):
        queue, sep, weight = part.strip().partition("=")
        if not sep or not queue.strip():
            raise ValueError(f"be QUEUE=WEIGHT pairs separated by commas, got {text!r}")
        try:
            out[queue.strip()] = int(weight)
        except ValueError:
            raise ValueError(f"give each queue an int weight, got {part.strip()!r}") from None
    return out


def weighted_order(queues: Sequence[str], weights: Mapping[str, int] | None) -> list[str]:
    """The rotation of claim turns: each queue ``weights.get(q, 1)`` times, interleaved.

    Smooth weighted round-robin: at each step every queue gains its weight,
    the one with the most credit goes next and pays the total, so 3:1 gives
    a, a, b, a rather than a, a, a, b.
    """
    if not weights or all(weights.get(q, 1) == 1 for q in queues):
        return list(queues)
    w = {q: weights.get(q, 1) for q in queues}
    total = sum(w.values())
    credit = dict.fromkeys(queues, 0)
    order: list[str] = []
    for _ in range(total):
        for q in queues:
            credit[q] += w[q]
        best = max(queues, key=lambda q: credit[q])
        credit[best] -= total
        order.append(best)
    return order


# rate limits -----------------------------------------------------------------------

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|m|h)\s*$")
_PER = {"s": 1.0, "m": 60.0, "h": 3600.0}


class Rate(NamedTuple):
    """A worker's ``rate_limit``: tasks per second and the bucket's size (its burst)."""

    per_second: float
    burst: int


def parse_rate(value: object) -> Rate:
    """``"100/s"``, ``"30/m"``, ``"500/h"`` as a :class:`Rate`; ValueError says why not.

    The burst -- how many tasks may start at once after the operation was
    idle -- is a tenth of a second's worth, at least 1: ``"50/s"`` allows 5 at
    once, then one every 20 ms; ``"30/m"`` allows 1 at once, then one every 2 s.
    """
    match = _RATE.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"must be a rate such as '100/s', '30/m' or '500/h', got {value!r}")
    per_second = float(match.group(1)) / _PER[match.group(2)]
    if not 0 < per_second <= 1_000_000:
        raise ValueError(f"must be above 0 and at most 1000000/s, got {value!r}")
    return Rate(per_second, max(1, math.ceil(per_second / 10)))


def flow_specs(registry: Iterable[WorkerSpec], qkeys: Mapping[str, QueueKeys]) -> dict[str, str]:
    """The claim spec of each served queue with a rate-limited or concurrency-keyed worker.

    The rest have none: their claims are sent exactly as before.
    """
    specs = list(registry)
    out = {}
    for queue, qk in qkeys.items():
        mine = [w for w in specs if w.queue == queue]
        limited = [[w.operation, w.rate.per_second, w.rate.burst] for w in mine if w.rate]
        keyed = {w.operation: w.max_concurrency for w in mine if w.max_concurrency}
        weights: dict[str, int] = {}
        for w in mine:
            for key, weight in ((w.keys.weights or {}) if w.keys else {}).items():
                if weights.setdefault(key, weight) != weight:
                    raise ConfigError(
                        f"queue {queue!r}: its workers give the fair key {key!r} two weights "
                        f"({weights[key]} and {weight}); give it one"
                    )
        if not limited and not keyed and not weights:
            continue
        spec: dict[str, object] = {}
        if limited:
            spec["p"], spec["r"] = qk.rate_prefix(), limited
        if keyed:
            spec["cp"], spec["c"] = qk.base(), keyed
        if weights:
            spec["w"] = weights
        out[queue] = orjson.dumps(spec).decode()
    return out


def concurrency_key(spec: WorkerSpec, params: dict[str, Any]) -> str | None:
    """The concurrency key a producer puts in a task of ``spec`` (None: the worker has none).

    The worker's ``concurrency_key`` function, applied to the params; its
    result as a string (an int tenant id is fine). A key that is not a valid
    key (empty, spaces, quotes) is a PayloadError at enqueue.
    """
    if spec.key_of is None:
        return None
    key = spec.key_of(params)
    return key if isinstance(key, str) else str(key)


@dataclass(frozen=True, slots=True)
class FlowKeys:
    """A worker's ``fair_key`` and ``rate_key`` (functions of the params, applied by producers) and
    its ``fair_weights`` (fair key -> turns in a row, sent with its queue's claims)."""

    fair: Callable[[dict[str, Any]], object] | None = None
    rate: Callable[[dict[str, Any]], object] | None = None
    weights: Mapping[str, int] | None = None


def flow_keys(fair: object, rate_key: object, weights: object, rated: bool, name: str) -> FlowKeys | None:
    """The worker ``name``'s ``fair_key``, ``rate_key`` and ``fair_weights`` checked (ConfigError);
    ``rated``: it sets a ``rate_limit`` (a ``rate_key`` divides it)."""
    if fair is None and rate_key is None and weights is None:
        return None
    for label, value in (("fair_key", fair), ("rate_key", rate_key)):
        if value is not None and not callable(value):
            raise ConfigError(f"worker {name}: attribute {label!r} must be a function of the params")
    if rate_key is not None and not rated:
        raise ConfigError(f"worker {name}: attribute 'rate_key' needs 'rate_limit' (the rate each key gets)")
    if weights is not None:
        if not isinstance(weights, Mapping) or not all(
            codec.is_ckey(k) and type(v) is int and 1 <= v <= MAX_WEIGHT for k, v in weights.items()
        ):
            raise ConfigError(
                f"worker {name}: attribute 'fair_weights' must map fair keys ({codec.CKEY_RULE}) "
                f"to int weights from 1 to {MAX_WEIGHT}, got {weights!r}"
            )
        weights = dict(weights)
    return FlowKeys(fair, rate_key, weights)  # type: ignore[arg-type]


def key_options(spec: WorkerSpec, params: dict[str, Any]) -> dict[str, Any]:
    """The ``fair_key`` and ``rate_key`` a producer puts in a task of ``spec`` ({} when the worker
    sets neither): its functions applied to the params, as strings."""
    keys = spec.keys
    if keys is None:
        return {}
    out: dict[str, Any] = {}
    for name, function in (("fair_key", keys.fair), ("rate_key", keys.rate)):
        if function is not None:
            key = function(params)
            out[name] = key if isinstance(key, str) else str(key)
    return out


def debounce_options(spec: WorkerSpec, params: dict[str, Any]) -> dict[str, Any]:
    """The debounce fields a producer puts in a task of ``spec`` ({} when the worker has none): the
    worker's ``debounce_key`` function applied to the params (as a string), its window and its
    longest wait."""
    if spec.debounce is None:
        return {}
    key = spec.debounce.key_of(params)
    return {
        "debounce_key": key if isinstance(key, str) else str(key),
        "debounce": spec.debounce.window,
        "debounce_max": spec.debounce.most,
    }


@dataclass(frozen=True, slots=True)
class Debounce:
    """A worker's debounce: the key function of the params, the window and the longest wait (s)."""

    key_of: Callable[[dict[str, Any]], object]
    window: float
    most: float | None = None


def debounce_of(key_of: object, window: object, most: object, name: str) -> Debounce | None:
    """The worker ``name``'s ``debounce_key``, ``debounce`` and ``debounce_max`` checked (ConfigError)."""
    if key_of is None:
        if window is not None or most is not None:
            raise ConfigError(
                f"worker {name}: attribute 'debounce' needs 'debounce_key' (a function of the params)"
            )
        return None
    if not callable(key_of):
        raise ConfigError(f"worker {name}: attribute 'debounce_key' must be a function of the params")
    try:
        seconds = codec.seconds_in(window, "debounce", zero=False)
        longest = codec.seconds_in(most, "debounce_max", zero=False) if most is not None else None
    except PayloadError as exc:
        raise ConfigError(f"worker {name}: attribute {exc}") from None
    if longest is not None and longest < seconds:
        raise ConfigError(f"worker {name}: attribute 'debounce_max' must be at least 'debounce'")
    return Debounce(key_of, seconds, longest)
