"""A shared-memory board between the supervisor and its children.

One ``memfd`` mapping, inherited by forked children and passed by fd to
exec'd ones. The supervisor writes two header fields, the time of its last
successful heartbeat and how many times it saw Redis lose its data; each
child owns a slot where its *event loop* writes a timestamp every
:data:`TICK` seconds plus its state and progress. A side thread could answer
for a process whose loop is stuck, so the loop itself writes (gunicorn's
heartbeat file, without the file system).

Times are ``time.monotonic()``, which is one clock for every process of the
machine (CLOCK_MONOTONIC), and keeps running while a process is stopped.
"""

from __future__ import annotations

import mmap
import os
import struct

from fencekit.queue.histogram import DEFAULT_BUCKETS, DurationHistogram

TICK = 0.5

STARTING, READY, STOPPING = 0, 1, 2

_HEADER = struct.Struct("dq")  # supervisor: last heartbeat that reached Redis, data losses seen
_BEAT = struct.Struct("d")
# tick, state, pid, tasks processed, tasks running, duration sum, counts per bucket (+Inf last)
_SLOT = struct.Struct(f"dqqqqd{len(DEFAULT_BUCKETS) + 1}q")
_RESETS = struct.Struct("q")


_ZEROS = (0,) * (len(DEFAULT_BUCKETS) + 1)


class Board:
    """The shared mapping (see the module docstring)."""

    def __init__(self, slots: int, fd: int | None = None) -> None:
        self.slots = slots
        self.size = _HEADER.size + slots * _SLOT.size
        if fd is None:
            fd = os.memfd_create("fencekit-board", 0)  # inheritable by default: not O_CLOEXEC
            os.ftruncate(fd, self.size)
        self.fd = fd
        self._map = mmap.mmap(fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    # supervisor side -------------------------------------------------------
    def set_beat_ok(self, when: float) -> None:
        _BEAT.pack_into(self._map, 0, when)

    def set_resets(self, resets: int) -> None:
        _RESETS.pack_into(self._map, _BEAT.size, resets)

    def reset_slot(self, slot: int, now: float) -> None:
        _SLOT.pack_into(self._map, self._offset(slot), now, STARTING, 0, 0, 0, 0.0, *_ZEROS)

    def read_slot(self, slot: int) -> tuple[float, int, int, int]:
        tick, state, pid, settled = _SLOT.unpack_from(self._map, self._offset(slot))[:4]
        return tick, state, pid, settled

    def read_running(self, slot: int) -> int:
        """How many tasks child ``slot`` ran at its last tick."""
        return int(_SLOT.unpack_from(self._map, self._offset(slot))[4])

    def read_durations(self, slot: int) -> DurationHistogram:
        """The job-duration histogram child ``slot`` last published."""
        fields = _SLOT.unpack_from(self._map, self._offset(slot))
        return DurationHistogram.from_counts(fields[6:], fields[5])

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
        durations: DurationHistogram,
        running: int = 0,
    ) -> None:
        _SLOT.pack_into(
            self._map,
            self._offset(slot),
            now,
            state,
            pid,
            settled,
            running,
            durations.sum,
            *durations.counts,
        )

    def _offset(self, slot: int) -> int:
        if not 0 <= slot < self.slots:
            raise IndexError(f"slot {slot} out of range 0..{self.slots - 1}")
        return _HEADER.size + slot * _SLOT.size

    def close(self) -> None:
        self._map.close()
        os.close(self.fd)
