"""Which key of the published fencekit 0.1-0.6 becomes which key of ours: the rules, no I/O.

The package ``fencekit`` 0.1-0.6 on PyPI (another author, the same import
name) keeps, with ``O`` its prefix (``fencekit`` by default)::

    O:idem:<K>            "pending:<owner>" | "done", EX ttl   IdempotencyGuard
    O:idem:<K>:result     JSON memo, same expiry (0.3+)        IdempotencyGuard
    O:lock:<R>            owner id, PX lease                   DistributedLock
    O:fence:seq:<R>       INCR counter, last token issued      DistributedLock
    O:fence:max:<R>       highest token accepted               FenceGate

0.1 to 0.6.1 share these names and values (0.1 and 0.2 have no memo key);
only their code around them changed. Ours (:mod:`fencekit._redis.keys`, ``P``
our prefix) puts the name in a Cluster hash tag: ``P:idem:{K}``,
``P:idem:{K}:result``, ``P:lock:{R}``, ``P:lock:{R}:seq``, ``P:fence:{R}``;
a name that already carries a tag keeps it. The value formats of markers,
memos and counters are the same; our lock holds ``"<token>:<owner>"``.

Telling old keys from ours when both prefixes are equal (``P:idem:*`` matches
both): our keys are exactly those whose name part is the image of our
tagging (:func:`ours_shaped`). An untagged name can only be old; a tagged
one is either ours or an old key whose name carried braces, and such an old
idempotency or lock key already sits at the very name ours uses, with a
value ours reads the same way (a held lock stays held), so it is left in
place. Old counters (``O:fence:seq:…``, ``O:fence:max:…``) are carried
even when their name could be one of our fences (a resource ``seq:{x}``):
taking the maximum can only refuse more, never let a fence go backwards,
and such a source is never deleted.

An old memo ``O:idem:<K>:result`` and an old marker of a key ending in
``:result`` have the same shape of name; the value tells them apart (a
marker is ``done`` or ``pending:…``, which no JSON text is), so names
ending in ``:result`` are classified by :func:`idem_key_of` with their value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from fencekit._redis.keys import KeySpace, _tagged, validate_prefix
from fencekit.errors import ConfigError

__all__ = [
    "KINDS",
    "SUPPORTED_VERSIONS",
    "Move",
    "Plan",
    "check_prefixes",
    "idem_key_of",
    "is_marker",
    "ours_shaped",
    "supported_version",
]

#: The releases of the published package whose layout this module reads.
SUPPORTED_VERSIONS = ("0.1", "0.2", "0.3", "0.4", "0.5", "0.6")
_RELEASES = frozenset(("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.6.1"))

Kind = Literal["fence", "seq", "lock", "idem"]
#: The kinds of old keys, in the order they are carried: fences and counters
#: first, so a lock or a marker is never carried before the token counters.
KINDS: tuple[Kind, ...] = ("fence", "seq", "lock", "idem")

_RESULT = ":result"
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def supported_version(text: str) -> str:
    """The series (``"0.6"``) of ``--from`` ``text``, or ConfigError listing what is supported."""
    value = text.strip()
    if value.startswith("v"):
        value = value[1:]
    if value in SUPPORTED_VERSIONS:
        return value
    if value in _RELEASES:
        return value.rsplit(".", 1)[0] if value.count(".") == 2 else value
    raise ConfigError(
        f"--from {text!r} is not a supported version; supported: "
        f"{', '.join(SUPPORTED_VERSIONS)} (or a release of them: {', '.join(sorted(_RELEASES))})"
    )


def check_prefixes(old: str, new: str) -> tuple[str, str]:
    """``(old, new)`` checked: the old prefix as 0.6 allowed it, ours as we do.

    Refused: our prefix inside the old key space (``--prefix fencekit:lock``
    with ``--old-prefix fencekit``), where our keys would read as old ones.
    """
    if not isinstance(old, str) or not old or any(ch.isspace() for ch in old):
        raise ConfigError(f"--old-prefix must be a non-empty name without whitespace, got {old!r}")
    new = validate_prefix(new)
    if old != new:
        for area in ("idem", "lock", "fence"):
            if (new + ":").startswith(f"{old}:{area}:"):
                raise ConfigError(
                    f"--prefix {new!r} lies inside the old key space {old}:{area}:*; choose another prefix"
                )
    return old, new


def scan_pattern(old: str, kind: Kind) -> str:
    """The SCAN MATCH pattern of one kind of old key (the prefix glob-escaped)."""
    base = _GLOB_SPECIAL.sub(r"\\\1", old)
    return {
        "fence": f"{base}:fence:max:*",
        "seq": f"{base}:fence:seq:*",
        "lock": f"{base}:lock:*",
        "idem": f"{base}:idem:*",
    }[kind]


def ours_shaped(name: str) -> bool:
    """True when ``name`` is what our key builder makes of some name (``_tagged(x) == name``).

    Either ``name`` carries a tag (``_tagged(name) == name``) or it is
    ``"{" + x + "}"`` for an untagged ``x`` (which happens only when ``x``
    begins with ``}``, the one input our tagging is not idempotent on).
    """
    if _tagged(name) == name:
        return True
    if len(name) > 2 and name[0] == "{" and name[-1] == "}":
        inner = name[1:-1]
        return _tagged(inner) != inner
    return False


def is_marker(value: str) -> bool:
    """True for an idempotency marker value (``done`` or ``pending:<owner>``)."""
    return value == "done" or value.startswith("pending:")


def idem_key_of(rest: str, value: str | None) -> str | None:
    """The idempotency key whose marker or memo ``O:idem:<rest>`` is, given its value.

    A name not ending in ``:result`` is a marker. One ending in ``:result``
    is a marker when its value is one, else the memo of the key before the
    suffix. ``None`` when it cannot be told (the key vanished and the name is
    ambiguous): the next run sees it again.
    """
    if not rest.endswith(_RESULT) or len(rest) == len(_RESULT):
        return rest
    if value is None:
        return None
    return rest if is_marker(value) else rest[: -len(_RESULT)]


@dataclass(frozen=True, slots=True)
class Move:
    """One script call: carry ``source`` (a 0.6 name, for the report) of ``kind`` over ``keys``.

    ``script_kind`` is the ``upgrade_move.lua`` kind; ``deletable`` is False
    when the source might be a key of ours (it is then never deleted).
    """

    kind: Kind
    source: str
    script_kind: str
    keys: tuple[str, ...]
    deletable: bool


class Plan:
    """The moves for old prefix ``old`` and our prefix ``new`` (both checked by :func:`check_prefixes`)."""

    __slots__ = ("_ours", "new", "old", "same")

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = check_prefixes(old, new)
        self.same = self.old == self.new
        self._ours = KeySpace(self.new)

    def rest(self, kind: Kind, key: str) -> str | None:
        """The name part of old key ``key`` of ``kind`` (``None`` if it is not one)."""
        head = {
            "fence": f"{self.old}:fence:max:",
            "seq": f"{self.old}:fence:seq:",
            "lock": f"{self.old}:lock:",
            "idem": f"{self.old}:idem:",
        }[kind]
        if not key.startswith(head) or len(key) == len(head):
            return None
        return key[len(head) :]

    def needs_value(self, kind: Kind, key: str) -> bool:
        """True when ``key`` can only be classified with its value (an idem name ending ``:result``)."""
        rest = self.rest(kind, key)
        return kind == "idem" and rest is not None and rest.endswith(_RESULT) and len(rest) > len(_RESULT)

    def move(self, kind: Kind, key: str, value: str | None = None) -> Move | str:
        """The :class:`Move` for old key ``key``, or why there is none.

        Reasons: ``"ours"`` (ours, or an old key already at our name),
        ``"foreign"`` (not a name of the old layout, or one our names refuse),
        ``"gone"`` (an ambiguous ``:result`` name that vanished before it was read).
        """
        rest = self.rest(kind, key)
        if rest is None:
            return "foreign"
        try:
            if kind == "idem":
                name = idem_key_of(rest, value)
                if name is None:
                    return "gone"
                if self.same and ours_shaped(name):
                    return "ours"
                old_marker = f"{self.old}:idem:{name}"
                keys: tuple[str, ...] = (
                    old_marker,
                    old_marker + _RESULT,
                    self._ours.idempotency(name),
                    self._ours.idempotency_result(name),
                )
                return Move(kind, old_marker, "idem", keys, True)
            if kind == "lock":
                if self.same and ours_shaped(rest):
                    return "ours"
                keys = (key, f"{self.old}:fence:seq:{rest}", self._ours.lock(rest))
                return Move(kind, key, "lock", keys, True)
            target = self._ours.lock_seq(rest) if kind == "seq" else self._ours.fence(rest)
            area = "seq" if kind == "seq" else "max"
            deletable = not (self.same and ours_shaped(f"{area}:{rest}"))
            return Move(kind, key, "counter", (key, target), deletable)
        except ConfigError:
            return "foreign"
