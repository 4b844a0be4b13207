"""The consumer's bookkeeping between two turns: outcomes waiting to be sent, and what a turn carried.

Finished tasks do not talk to Redis themselves: they record their outcome
here -- an ack (grouped per queue, sent in that queue's next ``ack_claim``)
or a settle call (retry, fail, requeue) -- and the consumer's loop sends
everything at once in its next turn (:meth:`Outbox.take`). A turn that
fails is put back (:meth:`Outbox.restore`) so its outcomes go out with the
next one: an ack that did land the first time is refused the second time and
counted as fenced out, never as processed twice.

No I/O here, so the rules are unit-tested without Redis.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fencekit._redis.scripts import Call, RecordedAck, StagedWrite

__all__ = ["AckClaim", "Outbox", "Settle", "Turn"]


@dataclass(slots=True)
class Settle:
    """A retry, fail or requeue of one delivery (its script call is built already)."""

    queue: str
    token: int
    call: Call


@dataclass(slots=True)
class AckClaim:
    """One queue's ``ack_claim`` in a turn: the deliveries it acknowledges, how many tasks it claims.

    ``recorded``: those of ``acks`` whose result lands in their record, in the same order;
    ``writes``: the fenced writes staged by those jobs, which land with their acks."""

    queue: str
    acks: list[int]
    want: int
    recorded: list[RecordedAck] = field(default_factory=list)
    writes: list[StagedWrite] = field(default_factory=list)


@dataclass(slots=True)
class Turn:
    """What one round trip carries: ``items[i]`` is sent as ``calls[i]``; then one ``has_work``
    call per entry of ``probes`` (the queues found empty it asks about, in its keys' order)."""

    items: list[Settle | AckClaim] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    probes: list[tuple[str, ...]] = field(default_factory=list)

    @property
    def claims(self) -> bool:
        """True if the turn claims tasks (a lost reply then leaves unknown tasks in flight)."""
        return any(isinstance(i, AckClaim) and i.want for i in self.items)

    @property
    def settles(self) -> bool:
        """True if the turn finishes any delivery (then a durable consumer WAITs for replicas)."""
        return any(isinstance(i, Settle) or i.acks for i in self.items)

    def tokens(self, queue: str) -> set[int]:
        """The deliveries of ``queue`` whose outcome this turn sends."""
        out: set[int] = set()
        for item in self.items:
            if item.queue == queue:
                if isinstance(item, Settle):
                    out.add(item.token)
                else:
                    out.update(item.acks)
        return out


class AckClaimCall(Protocol):
    """Builds one queue's ``ack_claim`` call: queue, want, plain acks, recorded acks, staged writes."""

    def __call__(
        self,
        queue: str,
        want: int,
        acks: Sequence[int],
        recorded: Sequence[RecordedAck],
        writes: Sequence[StagedWrite] = (),
        /,
    ) -> Call: ...


class Outbox:
    """Outcomes waiting for the next turn, and the jid of each (for log lines).

    ``ack_claim(queue, want, plain, recorded)`` builds the script call of one
    queue's ack and claim (``plain``: the tokens of acks without a record;
    ``recorded``: those whose result lands in a record); the outbox decides
    what goes into a turn, not how a call is spelled.
    """

    __slots__ = ("_ack_claim", "_acks", "_jids", "_recorded", "_settles", "_writes")

    def __init__(self, queues: Iterable[str], ack_claim: AckClaimCall) -> None:
        self._acks: dict[str, list[int]] = {q: [] for q in queues}
        # Per queue, the recorded acks among _acks[queue], in the same order: no lookup per ack.
        self._recorded: dict[str, list[RecordedAck]] = {q: [] for q in self._acks}
        self._writes: dict[str, list[StagedWrite]] = {q: [] for q in self._acks}
        self._settles: list[Settle] = []
        self._jids: dict[tuple[str, int], str | None] = {}
        self._ack_claim = ack_claim

    def __bool__(self) -> bool:
        """True while any outcome waits to be sent."""
        return bool(self._settles) or any(self._acks.values())

    def ack(
        self,
        queue: str,
        token: int,
        jid: str | None,
        recorded: RecordedAck | None = None,
        writes: list[StagedWrite] | None = None,
    ) -> None:
        """Delivery ``token`` of ``queue`` succeeded: acknowledge it in the queue's next ack_claim.

        ``recorded``: its result lands in the task's record with the ack; ``writes``: its
        staged fenced writes land with it.
        """
        self._jids[(queue, token)] = jid
        if recorded is not None:
            self._recorded[queue].append(recorded)
        if writes:
            self._writes[queue] += writes
        self._acks[queue].append(token)

    def settle(self, queue: str, token: int, call: Call, jid: str | None) -> None:
        """Delivery ``token`` ends with ``call`` (retry, fail or requeue) in the next turn."""
        self._jids[(queue, token)] = jid
        self._settles.append(Settle(queue, token, call))

    def jid(self, queue: str, token: int) -> str | None:
        """The jid of an outcome, if it is still waiting or in a turn (for a log line)."""
        return self._jids.get((queue, token))

    def outcomes(self) -> set[tuple[str, int]]:
        """Every (queue, token) whose outcome waits or is in a turn."""
        return set(self._jids)

    def done(self, queue: str, token: int) -> str | None:
        """Forget the outcome of ``token`` (its reply came back); returns its jid."""
        return self._jids.pop((queue, token), None)

    def take(self, claim_queue: str | None, want: int) -> Turn:
        """Everything waiting, plus a claim of ``want`` tasks of ``claim_queue``, as one turn.

        Settles go first, then one ``ack_claim`` per queue that has acks or
        is the one to claim from, in the order the queues were given.
        """
        turn = Turn()
        for item in self._settles:
            turn.items.append(item)
            turn.calls.append(item.call)
        self._settles = []
        for queue, acks in self._acks.items():
            wanted = want if queue == claim_queue else 0
            if not acks and not wanted:
                continue
            self._acks[queue] = []
            recorded = self._recorded[queue]
            if not recorded:
                plain, recorded = acks, []
            else:
                self._recorded[queue] = []
                if len(recorded) == len(acks):  # every ack keeps a record: the default
                    plain = []
                else:
                    kept = {r.token for r in recorded}
                    plain = [t for t in acks if t not in kept]
            writes = self._writes[queue]
            if not writes:
                turn.items.append(AckClaim(queue, acks, wanted, recorded))
                turn.calls.append(self._ack_claim(queue, wanted, plain, recorded))
                continue
            self._writes[queue] = []
            turn.items.append(AckClaim(queue, acks, wanted, recorded, writes))
            turn.calls.append(self._ack_claim(queue, wanted, plain, recorded, writes))
        return turn

    def restore(self, turn: Turn) -> None:
        """Keep the outcomes of a turn that failed for the next one (acks first, as they were)."""
        for item in turn.items:
            if isinstance(item, Settle):
                self._settles.append(item)
            else:
                self.restore_acks(item)

    def restore_settle(self, item: Settle) -> None:
        """Put back one settle that did not run (a cluster's slot was moving): it goes with the next turn."""
        self._settles.append(item)

    def restore_acks(self, item: AckClaim) -> None:
        """Put back the acks of one ``ack_claim`` whose script failed."""
        self._acks[item.queue][:0] = item.acks
        self._recorded[item.queue][:0] = item.recorded
        self._writes[item.queue][:0] = item.writes

    def waiting(self, queue: str) -> set[int]:
        """The deliveries of ``queue`` whose outcome waits for a later turn."""
        return set(self._acks[queue]) | {s.token for s in self._settles if s.queue == queue}
