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

import bisect
import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypedDict

from . import memory as _memory
from .faults import DeviceHang, SimError
from .race import Clock, Race, RaceDetector, Span

_ids = itertools.count(1)


def _value_of(entry: tuple[int, object]) -> int:
    return entry[0]


class _Notes(TypedDict):
    """What the running packet's work reported (see :meth:`Timeline.annotate`)."""

    reads: list[Span]
    writes: list[Span]
    args: dict[str, Any]


class Semaphore:
    """A monotonic 64-bit counter with the simulated time at which each value was reached."""

    MAX = (1 << 64) - 1

    def __init__(self, label: str = "", initial: int = 0):
        self.id = next(_ids)
        self.label = label or f"sem{self.id}"
        self.value = initial
        self.failure: SimError | None = None
        self._history: list[tuple[int, float]] = [(initial, 0.0)]
        self._clocks: list[tuple[int, Clock]] = [(initial, {})]   # (value, signaller's vector clock)

    def signal(self, value: int, at: float, clock: Clock | None = None) -> None:
        if not 0 <= value <= self.MAX:
            raise ValueError(f"semaphore value {value} is outside the 64-bit range")
        if value < self.value:
            raise ValueError(
                f"timeline semaphore {self.label} is monotonic: cannot signal {value} "
                f"after it reached {self.value}")
        self.value = value
        self._history.append((value, at))
        if clock is not None:
            self._clocks.append((value, clock))

    def fail(self, error: SimError, at: float, clock: Clock | None = None) -> None:
        """Complete with an error: every waiter for any value sees ``error``."""
        if self.failure is None:
            self.failure = error
        self.value = self.MAX
        self._history.append((self.MAX, at))
        if clock is not None:
            self._clocks.append((self.MAX, clock))

    def clock_at(self, value: int) -> Clock | None:
        """Vector clock of the signal that first reached ``value`` (for race detection)."""
        i = bisect.bisect_left(self._clocks, value, key=_value_of)
        return self._clocks[i][1] if i < len(self._clocks) else None

    def reached_at(self, value: int) -> float | None:
        """Simulated time at which the semaphore first reached ``value`` (None if not yet)."""
        if value > self.value:
            return None
        # the values only grow, so the first one at or past ``value`` is found by bisection
        return self._history[bisect.bisect_left(self._history, value, key=_value_of)][1]


@dataclass(slots=True)
class Packet:
    engine: str                                   # "compute", "copy", a peer link or a media engine
    work: Callable[[], float]                     # runs the functional effect, returns duration (s)
    label: str = ""
    kind: str = "kernel"
    waits: list[tuple[Semaphore, int]] = field(default_factory=list)
    signals: list[tuple[Semaphore, int]] = field(default_factory=list)
    submitted_at: float = 0.0
    host_clock: Clock = field(default_factory=dict)   # the host's vector clock at submission
    # (semaphore, value) pairs signalled when the packet STARTS; they carry no vector clock,
    # so waiting on one orders start times only (no happens-before for the race detector)
    start_signals: list[tuple[Semaphore, int]] = field(default_factory=list)


@dataclass(slots=True)
class Record:
    """One executed packet, for reports and traces.  A long-lived process keeps up to
    ``record_limit`` of them, so a record holds its byte ranges as tuples rather than lists:
    the cyclic collector stops tracking a tuple of plain values, where it walks every list."""

    label: str
    kind: str
    queue: int
    engine: str
    start: float
    end: float
    error: str | None = None
    reads: Sequence[Span] = ()      # (lo, hi, name) byte ranges the work read
    writes: Sequence[Span] = ()     # ... and wrote
    args: dict[str, Any] = field(default_factory=dict)       # what the work reported (grid, bytes, bound)
    clock: Clock = field(default_factory=dict)      # vector clock (race detection)


class HardwareQueue:
    """An in-order hardware queue: packets start in submission order, one after another.

    ``priority`` orders queues whose next packets are ready when an engine frees up: the
    lower number goes first (every family counts that way), as a hardware scheduler
    dispatches a higher-priority queue's pending work first.  Nothing running is preempted.
    """

    def __init__(self, timeline: "Timeline", qid: int, label: str, priority: int = 0):
        self.timeline = timeline
        self.id = qid
        self.label = label
        self.priority = int(priority)
        self.pending: deque[Packet] = deque()
        self.last_end = 0.0
        self.failure: SimError | None = None
        self.retiring = False            # released: leaves the timeline once drained

    def submit(self, packet: Packet) -> None:
        packet.submitted_at = self.timeline.host_time
        packet.host_clock = self.timeline.race_detector.host_event()
        self.pending.append(packet)


class Timeline:
    """Simulated time for one device: engines, queues and the lazy scheduler."""

    def __init__(self, copy_engines: int = 2):
        self.host_time = 0.0
        self.engines: dict[str, float] = {"compute": 0.0}
        for i in range(copy_engines):
            self.engines[f"copy{i}"] = 0.0
        self.queues: list[HardwareQueue] = []
        self._queue_ids = itertools.count()
        self.retired_labels: dict[int, str] = {}    # released queues' labels, for traces
        self.records: list[Record] = []
        # a long-lived user (the torch eager device) bounds the history: past the limit the
        # oldest half goes, counted in records_dropped (None keeps every record)
        self.record_limit: int | None = None
        self.records_dropped = 0
        self._last_end = -math.inf   # the latest end of any record (records are only appended)
        self.now = 0.0              # start of the packet running now (the power model reads it)
        self.race_detector = RaceDetector()
        self.stepping = 0            # > 0 while a packet's work runs (see step)
        self._logs: list[tuple[float, int, _memory.WriteLog]] = []   # heap by packet end time
        self._log_seq = itertools.count()
        self._log: _memory.WriteLog | None = None
        self._notes: _Notes | None = None

    @property
    def races(self) -> list[Race]:
        """Data races found so far (:class:`fornax.sim.race.Race`)."""
        return self.race_detector.races

    def add_engine(self, name: str) -> None:
        """Add an engine that packets name exactly (a peer link: ``peer``, ``peer5``, ...; a
        media engine: ``media0``, ...)."""
        self.engines.setdefault(name, 0.0)

    def create_queue(self, label: str = "", priority: int = 0) -> HardwareQueue:
        qid = next(self._queue_ids)
        q = HardwareQueue(self, qid, label or f"hwq{qid}", priority)
        self.queues.append(q)
        return q

    def remove_queue(self, q: HardwareQueue) -> None:
        """Release a hardware queue: now if it is idle, else once its last packet has run."""
        q.retiring = True
        if not q.pending and q in self.queues:
            self._retire(q)

    def _retire(self, q: HardwareQueue) -> None:
        self.queues.remove(q)
        self.race_detector.retire(q.id)
        if len(self.retired_labels) >= 4096:         # a churning process: keep the newest
            self.retired_labels.pop(next(iter(self.retired_labels)))
        self.retired_labels[q.id] = q.label

    # -- scheduling -------------------------------------------------------
    def _engine_for(self, packet: Packet) -> str:
        if packet.engine == "compute":
            return "compute"
        if packet.engine.startswith(("peer", "media")) and packet.engine in self.engines:
            return packet.engine          # a peer link or a media engine is named exactly
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

    def step(self, before: float | None = None) -> bool:
        """Run the runnable packet that can start earliest (and before ``before``, if given).

        False if none can run.  Memory written by packets that ended at or before
        the start is committed first; this packet's own writes wait in its log.
        :attr:`stepping` is non-zero while a packet's work runs, so that a caller reached
        from inside it (a finaliser run by the garbage collector that frees memory) can
        defer what would synchronise instead of re-entering the timeline.
        """
        self.stepping += 1
        try:
            return self._step(before)
        finally:
            self.stepping -= 1

    def _step(self, before: float | None) -> bool:
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
            # the earliest start wins; among packets that could start at the same moment
            # (ready before the engine frees up), the higher-priority queue's
            if best is None or start < best[0] or (start == best[0] and q.priority < best[1].priority):
                best = (start, q, packet, engine)
        if best is None or (before is not None and best[0] >= before):
            return False
        start, q, packet, engine = best
        q.pending.popleft()
        if q.retiring and not q.pending:
            self._retire(q)
        self._commit(start)
        waits = packet.waits
        clock = self.race_detector.start_packet(
            q.id, packet.host_clock, [c for c in (s.clock_at(v) for s, v in waits) if c] if waits else [])
        self._notes, self._log = {"reads": [], "writes": [], "args": {}}, None
        failure = q.failure
        if failure is None and waits:
            failure = next((s.failure for s, _ in waits if s.failure), None)
        duration, error = 0.0, None
        self.now = start
        for sem, value in packet.start_signals:
            sem.signal(max(value, sem.value), start)
        if failure is None:
            try:
                duration = float(self._run_work(packet))
            except SimError as exc:
                failure = exc
                error = str(exc)
                duration = getattr(exc, "elapsed_s", 0.0)   # a watchdog timeout takes its time
        end = start + duration
        self.engines[engine] = end
        q.last_end = end
        notes = self._notes
        record = Record(packet.label, packet.kind, q.id, engine, start, end, error,
                        tuple(notes["reads"]), tuple(notes["writes"]), notes["args"], clock)
        self.records.append(record)
        if self.record_limit is not None and len(self.records) > self.record_limit:
            drop = len(self.records) - self.record_limit // 2
            del self.records[:drop]
            self.records_dropped += drop
        if end > self._last_end:
            self._last_end = end
        self._finish(record, q, clock)
        if failure is not None:
            q.failure = failure
            for sem, _ in packet.signals:
                sem.fail(failure, end, clock)
        else:
            for sem, value in packet.signals:
                sem.signal(max(value, sem.value), end, clock)   # a late, lower signal never rolls back
        return True

    def wait(self, sem: Semaphore, value: int) -> None:
        """Host waits until ``sem`` reaches ``value``; runs device work as needed."""
        while sem.value < value:
            if not self.step():
                raise DeviceHang(
                    f"watchdog: host waits for {sem.label} >= {value} (now {sem.value}) "
                    f"but no submitted work can signal it; "
                    f"{sum(len(q.pending) for q in self.queues)} packet(s) are blocked")
        reached = sem.reached_at(value)
        self.host_time = max(self.host_time, reached or 0.0)
        self._host_sync(sem.clock_at(value))
        if sem.failure is not None:
            raise sem.failure

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
            self.host_time = max(self.host_time, self._last_end)
        self._host_sync(None, every_queue=True)

    # -- memory effects and happens-before -------------------------------------
    def annotate(self, reads: Iterable[Span] = (), writes: Iterable[Span] = (), **args: Any) -> None:
        """Called by a running packet's work: byte ranges ``(lo, hi, name)`` it read and
        wrote (for race detection) and values for traces (grid, bytes, bound, ...)."""
        if self._notes is not None:
            self._notes["reads"].extend(reads)
            self._notes["writes"].extend(writes)
            self._notes["args"].update(args)

    def _run_work(self, packet: Packet) -> float:
        self._log = _memory.begin_capture()
        try:
            return packet.work()
        finally:
            _memory.end_capture()

    def _finish(self, record: Record, q: HardwareQueue, clock: Clock) -> None:
        """``record`` holds the running packet's notes; queue its writes, check its accesses."""
        log = self._log
        self._notes, self._log = None, None
        if log is not None and len(log):
            heapq.heappush(self._logs, (record.end, next(self._log_seq), log))
        self.race_detector.observe(record, clock, q.id, q.label, record.reads, record.writes)

    def _commit(self, until: float) -> None:
        """Apply the writes of every packet that ended at or before ``until``, in end order."""
        while self._logs and self._logs[0][0] <= until:
            heapq.heappop(self._logs)[2].commit()

    def _host_sync(self, clock: Clock | None, every_queue: bool = False) -> None:
        """The host returns from a wait at ``host_time``: run what starts before it (so no
        packet reads memory from its future), commit memory up to it, join clocks."""
        while self.step(before=self.host_time):
            pass
        self._commit(self.host_time)
        if every_queue:
            self.race_detector.host_join_all()
        else:
            self.race_detector.host_join(clock)
        if not any(q.pending for q in self.queues):
            self.race_detector.prune()

    # -- several devices ---------------------------------------------------------
    def next_start(self) -> float | None:
        """When the packet :meth:`step` would run next starts (None if none can run now)."""
        best = None
        for q in self.queues:
            if q.pending:
                ready = self._ready_time(q, q.pending[0])
                if ready is not None:
                    start = max(ready, self.engines[self._engine_for(q.pending[0])])
                    best = start if best is None else min(best, start)
        return best

    def commit_until(self, t: float) -> None:
        """Apply the memory writes of this timeline's packets that ended by ``t`` (a peer
        copy's writes land in another device's memory, so its readers commit them)."""
        self._commit(t)

    @property
    def busy_time(self) -> float:
        """Simulated time at which the last executed packet ended."""
        return self._last_end if self.records else 0.0


def run_together(timelines: list[Timeline], done: Callable[[], bool]) -> bool:
    """Run the packets of several devices' timelines in one simulated-time order until
    ``done()`` (True) or nothing can run (False).  Packets of one device wait on
    semaphores another device signals (a peer copy and its consumer); before each packet
    starts, every timeline's writes that ended by then are committed, so a packet sees
    what other devices wrote before it and nothing after."""
    while not done():
        best = None
        for tl in timelines:
            t = tl.next_start()
            if t is not None and (best is None or t < best[0]):
                best = (t, tl)
        if best is None:
            return False
        for tl in timelines:
            tl.commit_until(best[0])
        best[1].step()
    return True
