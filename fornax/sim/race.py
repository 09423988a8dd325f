"""Happens-before race detection over one device's hardware queues.

Every participant — each hardware queue of the device, and the host — keeps a
*vector clock*: a map from participant to the number of its events known to
have happened.  The orderings the device really enforces build the clocks:

- a packet starts from its queue's clock (queues are in order) and advances
  the queue's own entry;
- a packet carries the host's clock at submission (the host's program order);
- waiting on a timeline semaphore joins the clock of the packet that signalled
  the awaited value (the semaphore keeps it with the value);
- a host wait joins the clock of the awaited signal, and a device-wide drain
  joins every queue's clock.

Packet A *happens before* packet B when B's clock has seen A's event
(``B.clock[A.queue] >= A.epoch``).  Every executed packet reports the byte
ranges it read and wrote; two accesses to overlapping ranges, at least one a
write, by packets not ordered either way, are a :class:`Race`.

The check is per access *range* (one per kernel buffer argument or copy
side), never per byte, and looks only at ranges that overlap (a sorted index
of range starts).  An access that is ordered before a later access covering
it is dropped, and everything the host has seen complete is dropped once the
device is idle, so the set of live ranges stays small.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

HOST = -1          # the host's participant id in a vector clock

Clock = dict[int, int]


def join(into: Clock, other: Clock) -> None:
    """``into`` becomes the element-wise maximum of both clocks."""
    for k, v in other.items():
        if into.get(k, 0) < v:
            into[k] = v


@dataclass(eq=False, slots=True)
class Access:
    """One range a packet read or wrote."""

    lo: int
    hi: int
    mode: str                  # "read" or "write"
    name: str                  # the kernel parameter or copy side ("dst", "src")
    record: object             # the timeline Record of the packet
    queue: int
    queue_label: str
    epoch: int                 # the packet's own entry in its clock

    def covers(self, other: "Access") -> bool:
        return self.lo <= other.lo and other.hi <= self.hi

    def describe(self) -> dict:
        r = self.record
        return {"label": r.label, "kind": r.kind, "queue": self.queue, "queue_label": self.queue_label,
                "engine": r.engine, "access": self.mode, "param": self.name,
                "range": [self.lo, self.hi], "start_s": r.start, "end_s": r.end}


@dataclass
class Race:
    """Two unordered packets whose accesses overlap, at least one of them a write."""

    device: int
    kind: str                  # "write-write" or "read-write"
    lo: int                    # the overlapping byte range [lo, hi)
    hi: int
    first: Access              # the access that started first in simulated time
    second: Access

    @property
    def at(self) -> float:
        """Simulated time at which both packets had started."""
        return max(self.first.record.start, self.second.record.start)

    def to_dict(self) -> dict:
        return {"device": self.device, "kind": self.kind, "range": [self.lo, self.hi],
                "bytes": self.hi - self.lo, "at_s": self.at,
                "first": self.first.describe(), "second": self.second.describe(),
                "message": self.message()}

    def message(self) -> str:
        def who(a: Access) -> str:
            r = a.record
            return (f"{r.kind} {r.label!r} ({a.mode} of {a.name}) on queue {a.queue} "
                    f"[{a.queue_label}] at {r.start * 1e6:.3f}-{r.end * 1e6:.3f} µs")
        return (f"{self.kind} race on device {self.device}, bytes [{self.lo:#x}, {self.hi:#x}): "
                f"{who(self.first)} and {who(self.second)} are not ordered by any event, "
                "wait or host synchronisation")


class RaceDetector:
    """Vector clocks for one device's queues and the host, and the access history."""

    MAX_REPORTED = 1000

    def __init__(self, device: int = 0):
        self.device = device
        self.host_clock: Clock = {HOST: 0}
        self.queue_clocks: dict[int, Clock] = {}
        self.races: list[Race] = []
        self.races_total = 0
        self._starts: list[tuple[int, int]] = []        # sorted (lo, serial) of live accesses
        self._live: dict[int, Access] = {}               # serial -> access
        self._serial = 0
        self._max_len = 0
        self._pairs: set[tuple[int, int]] = set()

    # -- clocks -------------------------------------------------------------
    def host_event(self) -> Clock:
        """A host submission: advance the host's entry and return a copy to carry."""
        self.host_clock[HOST] += 1
        return dict(self.host_clock)

    def start_packet(self, queue: int, carried: Clock, waited: list[Clock]) -> Clock:
        """The clock of a packet about to run on ``queue``; it becomes the queue's clock."""
        clock = dict(self.queue_clocks.get(queue, {}))
        join(clock, carried)
        for c in waited:
            join(clock, c)
        clock[queue] = clock.get(queue, 0) + 1
        self.queue_clocks[queue] = clock
        return clock

    def host_join(self, clock: Clock | None) -> None:
        if clock:
            join(self.host_clock, clock)

    def host_join_all(self) -> None:
        for c in self.queue_clocks.values():
            join(self.host_clock, c)

    # -- accesses -----------------------------------------------------------
    def observe(self, record, clock: Clock, queue: int, queue_label: str,
                reads=(), writes=()) -> None:
        """Check one executed packet's accesses against every unordered earlier one."""
        epoch = clock[queue]
        new = [Access(int(lo), int(hi), "read", name, record, queue, queue_label, epoch)
               for lo, hi, name in reads if hi > lo]
        new += [Access(int(lo), int(hi), "write", name, record, queue, queue_label, epoch)
                for lo, hi, name in writes if hi > lo]
        if not new:
            return
        starts, live, bisect_left = self._starts, self._live, bisect.bisect_left
        for acc in new:
            a_lo, a_hi, a_write = acc.lo, acc.hi, acc.mode == "write"
            window = bisect_left(starts, (a_lo - self._max_len, -1))
            end = bisect_left(starts, (a_hi, -1), window)
            if window == end:
                continue
            stale = None
            for lo, serial in starts[window:end]:
                old = live[serial]
                if old.hi <= a_lo or old.record is record:
                    continue
                if clock.get(old.queue, 0) >= old.epoch:       # ordered before this packet
                    # the new access stands in for an older one it covers (any later
                    # access racing with the old one races with the new one too)
                    if a_lo <= old.lo and old.hi <= a_hi and (a_write or old.mode == "read"):
                        if stale is None:
                            stale = []
                        stale.append((lo, serial))
                elif a_write or old.mode == "write":
                    self._report(old, acc)
            if stale is not None:
                for key in stale:
                    self._remove(key)
        for acc in new:
            self._serial += 1
            bisect.insort(starts, (acc.lo, self._serial))
            live[self._serial] = acc
            if acc.hi - acc.lo > self._max_len:
                self._max_len = acc.hi - acc.lo

    def _remove(self, key: tuple[int, int]) -> None:
        i = bisect.bisect_left(self._starts, key)
        if i < len(self._starts) and self._starts[i] == key:
            del self._starts[i]
        self._live.pop(key[1], None)

    def _report(self, old: Access, new: Access) -> None:
        pair = (id(old.record), id(new.record))
        if pair in self._pairs:
            return
        self._pairs.add(pair)
        self.races_total += 1
        if len(self.races) >= self.MAX_REPORTED:
            return
        first, second = sorted((old, new), key=lambda a: a.record.start)
        kind = "write-write" if old.mode == new.mode == "write" else "read-write"
        self.races.append(Race(self.device, kind, max(old.lo, new.lo), min(old.hi, new.hi),
                               first, second))

    def prune(self) -> None:
        """Drop accesses the host has seen complete (call only while no work is pending)."""
        keep = [(lo, s) for lo, s in self._starts
                if self.host_clock.get(self._live[s].queue, 0) < self._live[s].epoch]
        for lo, s in self._starts:
            if self.host_clock.get(self._live[s].queue, 0) >= self._live[s].epoch:
                self._live.pop(s)
        self._starts = keep
        if not keep:
            self._max_len = 0
            self._pairs.clear()
