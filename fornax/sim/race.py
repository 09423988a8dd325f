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
side), never per byte.  The history is a shadow memory: for each queue and
mode (read, write), an :class:`~fornax.sim.intervals.IntervalMap` from byte
ranges to the *latest* access of that queue there.  That is enough, because a
queue is in order: a later packet that is not ordered after some older access
of queue ``q`` is not ordered after the latest one over the same bytes either.
A write also clears its queue's reads under it (a later writer that races with
such a read races with the write).  A new access is checked against the other
queues' maps only, over the bytes it touches, so a long loop of overlapping
strided writes stays linear; everything the host has seen complete is dropped
once the device is idle.

A queue's own accesses are never checked against its own history, so a packet's
ranges wait in a list until another queue's access is checked against them (or
the list grows long): only then are they painted into the maps, in order.  A
single stream's work, the common case, is dropped at the next idle host sync
without ever being painted; the maps end up exactly as painting at once leaves
them (``tests/sim/test_race_history.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from .intervals import IntervalMap

HOST = -1          # the host's participant id in a vector clock

Clock = dict[int, int]
#: a byte range an access touched, and the parameter (or copy side) it belongs to
Span = tuple[int, int, str]


class Packet(Protocol):
    """What the detector reads of an executed packet (a timeline ``Record`` is one)."""

    @property
    def label(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def engine(self) -> str: ...
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...


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
    record: Packet             # the timeline Record of the packet
    queue: int
    queue_label: str
    epoch: int                 # the packet's own entry in its clock

    def covers(self, other: "Access") -> bool:
        return self.lo <= other.lo and other.hi <= self.hi

    def describe(self) -> dict[str, Any]:
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

    def to_dict(self) -> dict[str, Any]:
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
    #: a queue's unpainted packets past which they are painted (bounds what waits)
    MAX_PENDING = 1024

    def __init__(self, device: int = 0):
        self.device = device
        self.host_clock: Clock = {HOST: 0}
        self.queue_clocks: dict[int, Clock] = {}
        self.races: list[Race] = []
        self.races_total = 0
        self._shadow: dict[tuple[int, str], IntervalMap[Access]] = {}   # (queue, mode) -> latest accesses
        #: queue -> its observed packets not yet painted into ``_shadow``, in order:
        #: (record, queue label, epoch, reads, writes)
        self._pending: dict[int, list[tuple[Packet, str, int, Iterable[Span], Iterable[Span]]]] = {}
        self._pairs: set[tuple[int, int]] = set()
        self._retired: set[int] = set()      # released queues, forgotten once the host saw them end

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
    def observe(self, record: Packet, clock: Clock, queue: int, queue_label: str,
                reads: Iterable[Span] = (), writes: Iterable[Span] = ()) -> None:
        """Check one executed packet's accesses against every unordered earlier one."""
        if not reads and not writes:
            return
        epoch = clock[queue]
        if any(q != queue for q in self._pending) or any(q != queue for q, _ in self._shadow):
            self._check(record, clock, queue, queue_label, epoch, reads, writes)
        pending = self._pending.setdefault(queue, [])
        pending.append((record, queue_label, epoch, reads, writes))
        if len(pending) > self.MAX_PENDING:
            self._paint(queue)

    def _check(self, record: Packet, clock: Clock, queue: int, queue_label: str, epoch: int,
               reads: Iterable[Span], writes: Iterable[Span]) -> None:
        """Check the accesses against the other queues' histories (painted first)."""
        for q in [q for q in self._pending if q != queue]:
            self._paint(q)
        for acc in self._accesses(record, queue, queue_label, epoch, reads, writes):
            a_write = acc.mode == "write"
            for (q, mode), shadow in self._shadow.items():
                if q == queue or not (a_write or mode == "write"):
                    continue                    # same queue: in order; two reads never race
                seen = clock.get(q, 0)
                for lo, hi, old in shadow.overlapping(acc.lo, acc.hi):
                    if old.epoch > seen and old.record is not record:
                        self._report(old, acc, max(lo, acc.lo), min(hi, acc.hi))

    @staticmethod
    def _accesses(record: Packet, queue: int, queue_label: str, epoch: int,
                  reads: Iterable[Span], writes: Iterable[Span]) -> list[Access]:
        new = [Access(int(lo), int(hi), "read", name, record, queue, queue_label, epoch)
               for lo, hi, name in reads if hi > lo]
        new += [Access(int(lo), int(hi), "write", name, record, queue, queue_label, epoch)
                for lo, hi, name in writes if hi > lo]
        return new

    def _paint(self, queue: int, after: int = 0) -> None:
        """Paint ``queue``'s waiting packets (those past epoch ``after``) into its maps, in order."""
        for record, label, epoch, reads, writes in self._pending.pop(queue, ()):
            if epoch <= after:
                continue
            for acc in self._accesses(record, queue, label, epoch, reads, writes):
                self._shadow.setdefault((queue, acc.mode), IntervalMap()).assign(acc.lo, acc.hi, acc)
                if acc.mode == "write" and (queue, "read") in self._shadow:
                    self._shadow[(queue, "read")].assign(acc.lo, acc.hi, None)

    def _report(self, old: Access, new: Access, lo: int, hi: int) -> None:
        pair = (id(old.record), id(new.record))
        if pair in self._pairs:
            return
        self._pairs.add(pair)
        self.races_total += 1
        if len(self.races) >= self.MAX_REPORTED:
            return
        first, second = sorted((old, new), key=lambda a: a.record.start)
        kind = "write-write" if old.mode == new.mode == "write" else "read-write"
        self.races.append(Race(self.device, kind, lo, hi, first, second))

    def retire(self, queue: int) -> None:
        """``queue`` was released and has run its last packet: once the host has seen that
        packet end (and so every later submission is ordered after it), :meth:`prune`
        drops the queue from every clock, so clocks do not grow with every queue a long
        process ever made."""
        self._retired.add(queue)

    def prune(self) -> None:
        """Drop accesses the host has seen complete (call only while no work is pending)."""
        for q in list(self._pending):
            # a packet the host has seen end is dropped below once painted: painting it
            # would only cover older pieces, all of them seen and dropped too
            self._paint(q, after=self.host_clock.get(q, 0))
        for key, shadow in list(self._shadow.items()):
            seen = self.host_clock.get(key[0], 0)
            shadow.drop_if(lambda a: a.epoch <= seen)
            if not len(shadow):
                del self._shadow[key]
        if not self._shadow:
            self._pairs.clear()
        for q in [q for q in self._retired
                  if self.host_clock.get(q, 0) >= self.queue_clocks.get(q, {}).get(q, 0)
                  and (q, "read") not in self._shadow and (q, "write") not in self._shadow]:
            self._retired.discard(q)
            self.queue_clocks.pop(q, None)
            self.host_clock.pop(q, None)
            for c in self.queue_clocks.values():
                c.pop(q, None)

    @property
    def live(self) -> int:
        """How many access pieces the history holds."""
        for q in list(self._pending):
            self._paint(q)
        return sum(len(m) for m in self._shadow.values())
