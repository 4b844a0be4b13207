"""A shared-memory board between the supervisor and its children.

One ``memfd`` mapping, inherited by forked children and passed by fd to
exec'd ones. The supervisor writes two header fields, the time of its last
successful heartbeat and how many times it saw Redis lose its data; each
child owns a slot where its *event loop* writes a timestamp every
:data:`TICK` seconds plus its state, its progress and how late its ticks came
(its loop lag, which autoscaling reads). A side thread could answer
for a process whose loop is stuck, so the loop itself writes (gunicorn's
heartbeat file, without the file system).

Times are ``time.monotonic()``, which is one clock for every process of the
machine (CLOCK_MONOTONIC), and keeps running while a process is stopped.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Sequence

from fencekit.jobs.histogram import DEFAULT_BUCKETS, DurationHistogram, QueueDurations

TICK = 0.5

STARTING, READY, STOPPING = 0, 1, 2

_HEADER = struct.Struct("dq")  # supervisor: last heartbeat that reached Redis, data losses seen
_BEAT = struct.Struct("d")
_RESETS = struct.Struct("q")
LAG_WINDOW = 4
"""A child's loop lag is the most its last this many ticks came late (2 s of ticks)."""

# tick, state, pid, tasks processed, tasks running, loop lag; then per queue: duration sum, counts per bucket
_SLOT_HEAD = struct.Struct("dqqqqd")
_WIDTH = len(DEFAULT_BUCKETS) + 1  # counts per histogram, +Inf last
_ZEROS = (0,) * _WIDTH


class Board:
    """The shared mapping (see the module docstring).

    ``queues``: the queues whose job durations each slot holds, one histogram
    each, in this order (the supervisor and its children pass the same list).
    """

    def __init__(self, slots: int, queues: Sequence[str] = (), fd: int | None = None) -> None:
        self.slots = slots
        self.queues = tuple(queues)
        self._slot = struct.Struct(_SLOT_HEAD.format + ("d" + f"{_WIDTH}q") * len(self.queues))
        self.size = _HEADER.size + slots * self._slot.size
        if fd is None:
            fd = os.memfd_create("fencekit-board", 0)  # inheritable by default: not O_CLOEXEC
            os.ftruncate(fd, self.size)
        self.fd = fd
        self._map = mmap.mmap(fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._blank = (0.0, *_ZEROS) * len(self.queues)

    # supervisor side -------------------------------------------------------
    def set_beat_ok(self, when: float) -> None:
        _BEAT.pack_into(self._map, 0, when)

    def set_resets(self, resets: int) -> None:
        _RESETS.pack_into(self._map, _BEAT.size, resets)

    def reset_slot(self, slot: int, now: float) -> None:
        self._slot.pack_into(self._map, self._offset(slot), now, STARTING, 0, 0, 0, 0.0, *self._blank)

    def read_slot(self, slot: int) -> tuple[float, int, int, int]:
        tick, state, pid, settled = _SLOT_HEAD.unpack_from(self._map, self._offset(slot))[:4]
        return tick, state, pid, settled

    def read_running(self, slot: int) -> int:
        """How many tasks child ``slot`` ran at its last tick."""
        return int(_SLOT_HEAD.unpack_from(self._map, self._offset(slot))[4])

    def read_lag(self, slot: int) -> float:
        """Seconds child ``slot``'s event loop ran late at its last ticks (a loop busy with CPU work)."""
        return float(_SLOT_HEAD.unpack_from(self._map, self._offset(slot))[5])

    def read_durations(self, slot: int) -> QueueDurations:
        """The per-queue job-duration histograms child ``slot`` last published."""
        fields = self._slot.unpack_from(self._map, self._offset(slot))
        by_queue: dict[str, DurationHistogram] = {}
        at = len(_SLOT_HEAD.format)  # one field per format character: all are 8 bytes
        for queue in self.queues:
            counts = fields[at + 1 : at + 1 + _WIDTH]
            if any(counts):
                by_queue[queue] = DurationHistogram.from_counts(counts, fields[at])
            at += 1 + _WIDTH
        return QueueDurations(by_queue)

    # child side ------------------------------------------------------------
    def beat_ok(self) -> float:
        return float(_BEAT.unpack_from(self._map, 0)[0])

    def resets(self) -> int:
        """How many times the supervisor saw Redis lose its data."""
        return int(_RESETS.unpack_from(self._map, _BEAT.size)[0])

    def tick(
        self,
        slot: int,
        now: float,
        state: int,
        pid: int,
        settled: int,
        durations: QueueDurations,
        running: int = 0,
        lag: float = 0.0,
    ) -> None:
        histograms: list[float | int] = []
        for queue in self.queues:
            histogram = durations.get(queue)
            histograms.append(histogram.sum)
            histograms += histogram.counts
        self._slot.pack_into(
            self._map, self._offset(slot), now, state, pid, settled, running, lag, *histograms
        )

    def _offset(self, slot: int) -> int:
        if not 0 <= slot < self.slots:
            raise IndexError(f"slot {slot} out of range 0..{self.slots - 1}")
        return _HEADER.size + slot * self._slot.size

    def close(self) -> None:
        self._map.close()
        os.close(self.fd)
