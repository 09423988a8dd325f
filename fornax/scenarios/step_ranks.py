"""Every rank's timeline of the shape-only training step (:func:`fornax.scenarios.llm.simulate_step`).

The step's ranks form a ``tp x dp`` grid: ``tp`` consecutive devices (within a
node) hold one tensor-parallel copy of the model, and ``dp`` such copies
(across nodes) run data-parallel.  Rank ``r`` is device ``r``; its
tensor-parallel group is ``r // tp``'s block, its data-parallel group the
devices with the same ``r % tp``.

Each device gets its own **compute stream** and separate **communication
queues** (one for the tensor-parallel all-reduces, one for the data-parallel
gradient buckets), on the fabric engine each collective's ring uses
(``Topology.egress``: the node's links, or the NIC between nodes).  A
collective joins its group: it starts on every member at the moment the last
member has arrived (its compute stream reached the call and the engine is
free), and takes the ring all-reduce time over the group's devices from the
topology (``2(k-1)`` phases of ``n/k`` bytes, node tier included).  A
tensor-parallel all-reduce is consumed by the next op of the step, so the
compute stream waits for it; a data-parallel bucket (the gradients finished
since the previous backward all-reduce, DDP-style) is consumed only by the
optimizer after the step, so the backward pass runs on while it moves.

**How it is simulated.**  Rank 0 runs for real through the stack: the step's
graph is compiled once, loaded on device 0 and launched on its stream, every
kernel priced by device 0's cost and power models.  Every other rank holds a
shard of the same shapes, so it runs the same plan: its compute stream
*replays* rank 0's kernels and copies in order -- each kernel's cost (what
the cost model priced before the clock) is accounted by that device's own
power model at its own start time -- on its own timeline, with its own
collectives.  A run of back-to-back kernels between two collectives is one
packet on a replaying rank's timeline (its trace shows the run, not each
kernel): the in-order stream runs them one after another with nothing else on
the compute engine, so their times are the same either way.  The ranks advance collective by collective: each runs up to
its next call, the group's start is the latest arrival, and the run goes on.
Ranks other than 0 allocate no memory (their buffers have rank 0's shapes,
so their peak equals rank 0's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..layers.driver import Marker
from ..layers.errors import FornaxError
from ..sim.cost import KernelCost
from ..sim.timeline import HardwareQueue, Packet, Record, Semaphore, Timeline


class CostTap:
    """Device 0's power model, noting the cost of every kernel before it is accounted (the
    cost the other ranks' power models account in turn)."""

    def __init__(self, power: Any):
        self.power = power
        self.costs: list[KernelCost] = []

    def run_kernel(self, cost: KernelCost, start: float) -> KernelCost:
        self.costs.append(cost)
        return self.power.run_kernel(cost, start)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.power, name)


@dataclass
class Point:
    """One collective call of the step: its kind (``tp`` or ``dp``), its bytes, and where rank
    0's compute stream reached it."""

    kind: str
    nbytes: int
    marker: Marker
    label: str
    #: each group's start semaphore (signalled at the group's start), by group index
    starts: dict[int, Semaphore] = field(default_factory=dict)


@dataclass
class _Rank:
    """A replaying rank's queues on its device's timeline."""

    timeline: Timeline
    compute: HardwareQueue
    comm: dict[str, HardwareQueue]
    progress: Semaphore                    # the compute stream's packets done
    done: Semaphore                        # the tensor-parallel all-reduces done
    submitted: int = 0
    waits: list[tuple[Semaphore, int]] = field(default_factory=list)   # before its next packet


class StepRanks:
    """The ranks of one step over ``stack``'s devices: the collective handler rank 0's plan
    calls, and the replay that runs the other ranks alongside (see the module doc)."""

    def __init__(self, stack: Any, tp: int, buckets: Callable[[int], int]):
        self.stack = stack
        self.topology = stack.topology
        self.devices = stack.config.devices
        self.tp, self.dp = tp, self.devices // tp
        self.buckets = buckets               # tp call index -> dp bucket bytes issued with it (0: none)
        self.points: list[Point] = []
        self.tp_calls = 0
        self._ring: dict[tuple[tuple[int, ...], int], float] = {}
        dev0 = stack.devices[0]
        self.tl0 = dev0.timeline
        self._queues0: dict[str, HardwareQueue] = {}
        self._done0 = Semaphore("rank0-tp-done")
        self.ranks: dict[int, _Rank] = {}
        self.last_end: dict[tuple[int, str], float] = {}
        self.replayed = 0                    # rank 0's compute records replayed so far
        self.costs_used = 0
        self.tap: CostTap | None = None
        self.compute_queue: int | None = None

    # -- groups ---------------------------------------------------------------------------------
    def group(self, kind: str, r: int) -> tuple[int, ...]:
        if kind == "tp":
            base = r - r % self.tp
            return tuple(range(base, base + self.tp))
        return tuple(range(r % self.tp, self.devices, self.tp))

    def group_index(self, kind: str, r: int) -> int:
        return r // self.tp if kind == "tp" else r % self.tp

    def engine(self, kind: str, r: int) -> str:
        g = self.group(kind, r)
        return self.topology.egress(r, g[(g.index(r) + 1) % len(g)])

    def ring_time(self, group: tuple[int, ...], nbytes: int) -> float:
        """Ring all-reduce of ``nbytes`` over ``group``'s devices: ``2(k-1)`` phases, each
        member sending ``nbytes/k`` to its successor, priced by the topology."""
        key = (group, nbytes)
        if key not in self._ring:
            k = len(group)
            one = self.topology.phase_time([(group[i], group[(i + 1) % k], nbytes / k)
                                            for i in range(k)]) if k > 1 else 0.0
            self._ring[key] = 2 * (k - 1) * one
        return self._ring[key]

    # -- rank 0: the collective handler ------------------------------------------------------------
    def _queue0(self, kind: str) -> HardwareQueue:
        if kind not in self._queues0:
            self._queues0[kind] = self.tl0.create_queue(f"collective:{kind}:all_reduce")
        return self._queues0[kind]

    def __call__(self, runtime: Any, step: Any, ptrs: dict) -> None:
        """Rank 0's ``all_reduce`` of the plan: a tensor-parallel collective on its
        communication queue (and, in the backward pass, a data-parallel bucket)."""
        if step.ranks != self.tp:
            raise FornaxError(f"all_reduce over {step.ranks} ranks, but the step's tensor-parallel "
                              f"groups have {self.tp}", seam="framework", op=step.routine)
        queue = runtime.default_stream().queue
        if self.compute_queue is None:
            self.compute_queue = queue.hwq.id
        produced = queue.record()
        nbytes = int(step.nbytes)
        x, y = int(ptrs["x"]), int(ptrs["y"])
        self.tp_calls += 1
        point = self._point0("tp", nbytes, produced, reads=(x, y))
        queue.wait(Marker(self._done0, self.tp_calls))
        point.label = f"all_reduce {nbytes}B (tp ring, {self.tp} ranks)"
        bucket = self.buckets(self.tp_calls - 1) if self.dp > 1 else 0
        if bucket:
            self._point0("dp", bucket, produced)

    def finish0(self, runtime: Any, bucket: int) -> None:
        """After rank 0's last op: the last data-parallel bucket, and a marker at the end."""
        queue = runtime.default_stream().queue
        end = queue.record()
        if self.dp > 1 and bucket:
            self._point0("dp", bucket, end)
        self.points.append(Point("end", 0, end, "end of the step"))

    def _point0(self, kind: str, nbytes: int, produced: Marker,
                reads: tuple[int, int] | None = None) -> Point:
        group = self.group(kind, 0)
        point = Point(kind, nbytes, produced, f"all_reduce {nbytes}B ({kind} ring, {len(group)} ranks)")
        start = point.starts.setdefault(0, Semaphore(f"{kind}-join{len(self.points)}-g0"))
        duration = self.ring_time(group, nbytes)
        dev = self.stack.devices[0]
        signals = [(self._done0, self.tp_calls)] if kind == "tp" else []
        sent = 2 * (len(group) - 1) * nbytes // len(group)

        def work() -> float:
            dev.begin("peer", point.label)
            dev.peer_bytes += sent
            if reads is not None:
                x, y = reads
                dev.timeline.annotate(reads=[(x, x + nbytes, "x")], writes=[(y, y + nbytes, "y")],
                                      bytes=nbytes, algorithm="ring", ranks=len(group))
            return duration

        self._queue0(kind).submit(Packet(self.engine(kind, 0), work, point.label, "collective",
                                         waits=[(produced.sem, produced.value), (start, 1)],
                                         signals=signals))
        self.points.append(point)
        return point

    # -- the other ranks: replay ----------------------------------------------------------------------
    def _rank(self, r: int) -> _Rank:
        if r not in self.ranks:
            tl = self.stack.devices[r].timeline
            comm = {k: tl.create_queue(f"collective:{k}:all_reduce") for k in ("tp", "dp")}
            self.ranks[r] = _Rank(tl, tl.create_queue(f"rank{r}:compute (replay of rank 0's plan)"),
                                  comm, Semaphore(f"rank{r}-compute"), Semaphore(f"rank{r}-tp-done"))
        return self.ranks[r]

    def _segment(self) -> list[tuple[Record, KernelCost | None]]:
        """Rank 0's compute-stream records since the last call, each kernel with its cost."""
        recs = self.tl0.records
        out: list[tuple[Record, KernelCost | None]] = []
        assert self.tap is not None
        while self.replayed < len(recs):
            rec = recs[self.replayed]
            self.replayed += 1
            if rec.queue != self.compute_queue:
                continue
            cost = None
            if rec.kind == "kernel":
                cost = self.tap.costs[self.costs_used]
                self.costs_used += 1
            out.append((rec, cost))
        return out

    def _replay(self, r: int, seg: list[tuple[Record, KernelCost | None]]) -> None:
        """Rank 0's segment on rank ``r``'s compute stream: each copy a packet, each run of
        back-to-back kernels one packet that accounts every kernel's cost with the device's
        power model at the kernel's own start (in order, as the in-order stream runs them)."""
        rk = self._rank(r)
        dev = self.stack.devices[r]
        tl = rk.timeline
        i = 0
        while i < len(seg):
            rec, cost = seg[i]
            work: Callable[..., float]
            if cost is None:
                work = _fixed(rec.end - rec.start)
                label, kind, engine = rec.label, rec.kind, rec.engine
                i += 1
            else:
                j = i
                while j < len(seg) and seg[j][1] is not None:
                    j += 1
                work = _kernels(dev, tl, [c for _, c in seg[i:j] if c is not None])
                label = f"{j - i} kernel(s) of rank 0's plan: {rec.label} .. {seg[j - 1][0].label}"
                kind, engine = "kernel", "compute"
                i = j
            rk.submitted += 1
            waits, rk.waits = rk.waits, []
            rk.compute.submit(Packet(engine, work, label, kind, waits=waits,
                                     signals=[(rk.progress, rk.submitted)]))

    @staticmethod
    def _run_until(tl: Timeline, sem: Semaphore, value: int, who: str) -> float:
        while sem.value < value:
            if not tl.step():
                raise FornaxError(f"{who}: the step's timeline stalled before its next collective",
                                  seam="framework")
        t = sem.reached_at(value)
        return 0.0 if t is None else t

    def _arrive(self, marker: Marker) -> dict[int, float]:
        """Run rank 0 up to ``marker``, replay what it ran on every other rank, and run each of
        them that far: when each rank's compute stream arrives there."""
        arrivals = {0: self._run_until(self.tl0, marker.sem, marker.value, "rank 0")}
        seg = self._segment()
        for r in range(1, self.devices):
            self._replay(r, seg)
            rk = self.ranks[r]
            arrivals[r] = self._run_until(rk.timeline, rk.progress, rk.submitted, f"rank {r}")
        return arrivals

    def run(self) -> None:
        """Run every rank collective by collective (rank 0's work is already submitted)."""
        arrivals: dict[int, float] = {}
        prev: Point | None = None
        tp_seen = 0
        for point in self.points:
            if prev is None or point.marker is not prev.marker:   # a dp bucket shares its tp call's
                arrivals = self._arrive(point.marker)
            prev = point
            if point.kind == "end":
                break
            if point.kind == "tp":
                tp_seen += 1
            self._join(point, arrivals, tp_seen)
        for d in self.stack.devices:
            d.timeline.drain()

    def _join(self, point: Point, arrivals: dict[int, float], tp_seen: int) -> None:
        """Start ``point``'s collective on every group at its last member's arrival (the
        member's engine free too) and submit it on every member but rank 0 (already queued)."""
        kind = point.kind
        groups: dict[int, tuple[int, ...]] = {}
        for r in range(self.devices):
            groups.setdefault(self.group_index(kind, r), self.group(kind, r))
        for members in groups.values():
            engines = {m: self.engine(kind, m) for m in members}
            start = max(max(arrivals[m], self.last_end.get((m, engines[m]), 0.0)) for m in members)
            duration = self.ring_time(members, point.nbytes)
            sent = 2 * (len(members) - 1) * point.nbytes // len(members)
            for m in members:
                self.last_end[(m, engines[m])] = start + duration
                if m == 0:
                    point.starts[0].signal(1, start)
                else:
                    self._collective(m, kind, point, start, duration, sent, tp_seen)

    def _collective(self, r: int, kind: str, point: Point, start: float, duration: float,
                    sent: int, tp_seen: int) -> None:
        rk = self.ranks[r]
        dev = self.stack.devices[r]
        sem = Semaphore(f"rank{r}-{kind}-join")
        sem.signal(1, start)

        def work() -> float:
            dev.begin("peer", point.label)
            dev.peer_bytes += sent
            return duration

        signals = [(rk.done, tp_seen)] if kind == "tp" else []
        rk.comm[kind].submit(Packet(self.engine(kind, r), work, point.label, "collective",
                                    waits=[(rk.progress, rk.submitted), (sem, 1)], signals=signals))
        if kind == "tp":                                 # the next op consumes its result
            rk.waits.append((rk.done, tp_seen))


def _fixed(duration: float) -> Callable[[], float]:
    """A replayed copy: rank 0's duration (the same bytes over the same link)."""
    return lambda: duration


def _kernels(dev: Any, tl: Timeline, costs: list[KernelCost]) -> Callable[[], float]:
    """A replayed run of kernels: each cost accounted by ``dev``'s power model at its start."""
    def work() -> float:
        t = start = tl.now
        for c in costs:
            t += dev.power.run_kernel(c, t).duration_s
        dev.kernels_executed += len(costs)
        tl.annotate(kernels=len(costs))
        return t - start
    return work
