"""The device timeline: engines, hardware queues and 64-bit timeline semaphores.

Work reaches the device as *packets* on *hardware queues*.  A packet may wait
on (semaphore, value) pairs, runs on one engine (compute or a copy engine) and
signals (semaphore, value) pairs when it completes.  The 64-bit timeline
semaphore is the one ordering primitive; vendor events, signals and fences are
veneers over it.  A failed packet signals its semaphores with the failure as
payload, so whoever waits on them sees the error.

Execution is lazy, like a real device seen from the host: submitting returns
at once, and packets run in simulated-time order when the host waits.  A wait
that no submitted work can ever satisfy is a hang, which the watchdog turns
into a :class:`DeviceHang` instead of blocking the process.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .faults import DeviceHang, SimError

_ids = itertools.count(1)


class Semaphore:
    """A monotonic 64-bit counter with the simulated time at which each value was reached."""

    MAX = (1 << 64) - 1

    def __init__(self, label: str = "", initial: int = 0):
        self.id = next(_ids)
        self.label = label or f"sem{self.id}"
        self.value = initial
        self.failure: SimError | None = None
        self._history: list[tuple[int, float]] = [(initial, 0.0)]

    def signal(self, value: int, at: float) -> None:
        if not 0 <= value <= self.MAX:
            raise ValueError(f"semaphore value {value} is outside the 64-bit range")
        if value < self.value:
            raise ValueError(
                f"timeline semaphore {self.label} is monotonic: cannot signal {value} "
                f"after it reached {self.value}")
        self.value = value
        self._history.append((value, at))

    def fail(self, error: SimError, at: float) -> None:
        """Complete with an error: every waiter for any value sees ``error``."""
        if self.failure is None:
            self.failure = error
        self.value = self.MAX
        self._history.append((self.MAX, at))

    def reached_at(self, value: int) -> float | None:
        """Simulated time at which the semaphore first reached ``value`` (None if not yet)."""
        for v, t in self._history:
            if v >= value:
                return t
        return None


@dataclass
class Packet:
    engine: str                                   # "compute" or "copy"
    work: Callable[[], float]                     # runs the functional effect, returns duration (s)
    label: str = ""
    kind: str = "kernel"
    waits: list[tuple[Semaphore, int]] = field(default_factory=list)
    signals: list[tuple[Semaphore, int]] = field(default_factory=list)
    submitted_at: float = 0.0


@dataclass
class Record:
    """One executed packet, for reports and traces."""

    label: str
    kind: str
    queue: int
    engine: str
    start: float
    end: float
    error: str | None = None


class HardwareQueue:
    """An in-order hardware queue: packets start in submission order, one after another."""

    def __init__(self, timeline: "Timeline", qid: int, label: str):
        self.timeline = timeline
        self.id = qid
        self.label = label
        self.pending: deque[Packet] = deque()
        self.last_end = 0.0
        self.failure: SimError | None = None

    def submit(self, packet: Packet) -> None:
        packet.submitted_at = self.timeline.host_time
        self.pending.append(packet)


class Timeline:
    """Simulated time for one device: engines, queues and the lazy scheduler."""

    def __init__(self, copy_engines: int = 2):
        self.host_time = 0.0
        self.engines: dict[str, float] = {"compute": 0.0}
        for i in range(copy_engines):
            self.engines[f"copy{i}"] = 0.0
        self.queues: list[HardwareQueue] = []
        self.records: list[Record] = []

    def create_queue(self, label: str = "") -> HardwareQueue:
        q = HardwareQueue(self, len(self.queues), label or f"hwq{len(self.queues)}")
        self.queues.append(q)
        return q

    # -- scheduling -------------------------------------------------------
    def _engine_for(self, packet: Packet) -> str:
        if packet.engine == "compute":
            return "compute"
        copies = [e for e in self.engines if e.startswith("copy")]
        return min(copies, key=lambda e: self.engines[e]) if copies else "compute"

    def _ready_time(self, q: HardwareQueue, packet: Packet) -> float | None:
        start = max(q.last_end, packet.submitted_at)
        for sem, value in packet.waits:
            t = sem.reached_at(value)
            if t is None:
                return None
            start = max(start, t)
        return start

    def step(self) -> bool:
        """Run the runnable packet that can start earliest.  False if none can run."""
        best = None
        for q in self.queues:
            if not q.pending:
                continue
            packet = q.pending[0]
            ready = self._ready_time(q, packet)
            if ready is None:
                continue
            engine = self._engine_for(packet)
            start = max(ready, self.engines[engine])
            if best is None or start < best[0]:
                best = (start, q, packet, engine)
        if best is None:
            return False
        start, q, packet, engine = best
        q.pending.popleft()
        failure = q.failure or next((s.failure for s, _ in packet.waits if s.failure), None)
        duration, error = 0.0, None
        if failure is None:
            try:
                duration = float(packet.work())
            except SimError as exc:
                failure = exc
                error = str(exc)
        end = start + duration
        self.engines[engine] = end
        q.last_end = end
        self.records.append(Record(packet.label, packet.kind, q.id, engine, start, end, error))
        if failure is not None:
            q.failure = failure
            for sem, _ in packet.signals:
                sem.fail(failure, end)
        else:
            for sem, value in packet.signals:
                sem.signal(max(value, sem.value), end)   # a late, lower signal never rolls back
        return True

    def wait(self, sem: Semaphore, value: int) -> None:
        """Host waits until ``sem`` reaches ``value``; runs device work as needed."""
        while sem.value < value:
            if not self.step():
                raise DeviceHang(
                    f"watchdog: host waits for {sem.label} >= {value} (now {sem.value}) "
                    f"but no submitted work can signal it; "
                    f"{sum(len(q.pending) for q in self.queues)} packet(s) are blocked")
        if sem.failure is not None:
            raise sem.failure
        reached = sem.reached_at(value)
        self.host_time = max(self.host_time, reached or 0.0)

    def drain(self) -> None:
        """Run everything that can run (a device-wide synchronise)."""
        while self.step():
            pass
        blocked = [q for q in self.queues if q.pending]
        if blocked:
            raise DeviceHang(
                f"watchdog: {sum(len(q.pending) for q in blocked)} packet(s) on "
                f"{', '.join(q.label for q in blocked)} wait for signals nothing will send")
        if self.records:
            self.host_time = max(self.host_time, max(r.end for r in self.records))

    @property
    def busy_time(self) -> float:
        """Simulated time at which the last executed packet ended."""
        return max((r.end for r in self.records), default=0.0)
