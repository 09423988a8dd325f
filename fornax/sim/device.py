"""One simulated device: a chip spec, its memory and its timeline."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .cost import KernelCost, copy_cost, gemm_counters, kernel_cost
from .execute import Counters, execute
from .faults import DeviceLost, ExecutionError, FaultInjector, FaultPlan, SimError
from .isa import Program
from .memory import AddressSpace, DeviceMemory
from .power import PowerModel
from .race import Race
from .replay import ReplayCache
from .spec import ChipSpec
from .timeline import Timeline
from .topology import Topology

if TYPE_CHECKING:
    from .chip import Chip
    from .layout import Partition


class Device:
    def __init__(self, spec: ChipSpec, index: int = 0, meta: bool = False,
                 replays: ReplayCache | None = None):
        self.spec = spec
        self.index = index
        #: shape-only mode: memory is accounted but never backed, copies move no bytes,
        #: kernels are priced from their estimate (``Program.meta["estimate"]``), not executed
        self.meta = meta
        self.memory = DeviceMemory(spec.hbm_bytes, spec.page_size, index, meta=meta)
        self.timeline = Timeline(spec.copy_engines)
        self.timeline.race_detector.device = index
        self.memory.clock = lambda: self.timeline.host_time     # stamps memory.usage_log
        self.kernels_executed = 0
        self.bytes_copied = {"h2d": 0, "d2h": 0, "d2d": 0}
        self.power = PowerModel(spec)   # energy, temperature and clock along the timeline
        self.topology: Topology | None = None        # the fabric joining this device to others (Topology.connect)
        self.peer_bytes = 0
        self.injector: FaultInjector | None = None   # fault injection; None: off, zero cost
        #: set when the device is lost, until reset: a lost device, or on a partitioned chip the
        #: fault of another partition that took this one down with it
        self.lost: SimError | None = None
        #: the partition this device is, and the chip it shares (``fornax.sim.chip``); None: a whole chip
        self.partition: Partition | None = None
        self.chip: Chip[Device] | None = None
        self.ecc_corrected = 0
        self.resets = 0
        #: the record/replay recordings of the kernels this device runs (``fornax.sim.replay``);
        #: the devices of one composed stack share one cache, so its memory bound holds for the
        #: whole stack however many devices it simulates
        self.replays = replays if replays is not None else ReplayCache()

    @property
    def races(self) -> list[Race]:
        """Data races the happens-before detector found on this device (``fornax.sim.race``)."""
        return self.timeline.races

    # -- faults and reset ------------------------------------------------------
    def inject(self, plan: FaultPlan | None) -> FaultInjector | None:
        """Attach a fault plan (None detaches it); operations from now on consult it."""
        self.injector = None if plan is None else FaultInjector(plan, self.index)
        return self.injector

    def begin(self, op: str, label: str = "", context: int = 0) -> None:
        """An operation (``kernel``, ``copy``, ``peer``) starts: raise if the device is
        lost or the fault plan hits it.  Called before the operation has any effect."""
        if self.lost is not None:
            raise DeviceLost(f"device {self.index} is lost ({self.lost}); reset it first")
        if self.injector is None:
            return
        before = self.injector.ecc_corrected
        fault = self.injector.next(op, label, context)
        self.ecc_corrected += self.injector.ecc_corrected - before
        if fault is not None:
            if isinstance(fault, DeviceLost):     # kind "device_lost"
                self.lost = fault
            if self.chip is not None:             # a fault whose scope is the chip downs every partition
                self.chip.spread(self, fault)
            raise fault

    def reset_group(self) -> list[Device]:
        """The devices a reset of this one resets: itself, or on a partitioned chip with a
        chip-wide fault pending every partition of the chip (the driver destroys their
        contexts first)."""
        return self.chip.reset_group(self) if self.chip is not None else [self]

    def reset(self) -> None:
        """Hardware reset: clear the lost state and every failed or pending hardware queue,
        of every device :meth:`reset_group` names.  (Contexts and their memory are the
        driver's to destroy first.)"""
        for dev in self.chip.reset(self) if self.chip is not None else [self]:
            dev.lost = None
            for q in dev.timeline.queues:
                q.failure = None
                q.pending.clear()
            dev.resets += 1

    def stats(self) -> dict[str, Any]:
        return {"kernels_executed": self.kernels_executed, "bytes_copied": dict(self.bytes_copied),
                "peer_bytes": self.peer_bytes, "ecc_corrected": self.ecc_corrected,
                "lost": self.lost is not None, "resets": self.resets,
                "faults": [] if self.injector is None else [vars(r) for r in self.injector.log]}

    def run_kernel(self, space: AddressSpace, program: Program, grid: tuple[int, int, int],
                   args: dict[str, Any]) -> tuple[Counters, KernelCost]:
        """Execute a kernel functionally and price it.  Called when its packet runs."""
        self.begin("kernel", program.name, space.context)
        if self.meta:
            counters = estimate_counters(program, grid, args)
        else:
            counters = execute(program, grid, args, space, self.replays)
        self.kernels_executed += 1
        return counters, self.power.run_kernel(self._price(counters, program.meta), self.timeline.now)

    def _price(self, counters: Counters, meta: dict[str, Any] | None) -> KernelCost:
        """:func:`kernel_cost` of a launch; a replayed launch (``fornax.sim.replay``) carries
        its recording's memo, where the price of the same work and footprint is kept."""
        memo = counters.pricing
        if memo is None:
            return kernel_cost(self.spec, counters, meta)
        try:
            key = (tuple((meta or {}).get("tile") or ()), counters.footprint_bytes)
            hit = memo.get(key)
        except TypeError:                  # an unhashable tile: kernel_cost says what is wrong
            return kernel_cost(self.spec, counters, meta)
        if hit is not None and hit[0] is self.spec and isinstance(hit[1], KernelCost):
            return hit[1]
        cost = kernel_cost(self.spec, counters, meta)
        if len(memo) >= 64:                # footprints that keep changing: keep the memo small
            memo.clear()
        memo[key] = (self.spec, cost)
        return cost

    def account_kernel(self, counters: Counters, meta: dict[str, Any] | None = None,
                       start: float | None = None) -> KernelCost:
        """Price a kernel at the clock the power and thermal state allows, and account its
        energy; ``start`` defaults to the start of the packet running now."""
        cost = kernel_cost(self.spec, counters, meta)
        return self.power.run_kernel(cost, self.timeline.now if start is None else start)

    def copy_duration(self, nbytes: int, direction: str) -> float:
        """Price a copy; call it before moving the data (a fault stops the copy)."""
        self.begin("copy", f"{direction} {nbytes}B")
        self.bytes_copied[direction] += nbytes
        duration = copy_cost(self.spec, nbytes, direction)
        self.power.run_copy(nbytes, direction, self.timeline.now, duration)
        return duration

    def peer_copy_duration(self, nbytes: int, dst_index: int) -> float:
        """Duration of a copy from this device to device ``dst_index`` over the fabric."""
        if self.topology is None:
            raise ValueError(f"device {self.index} is not connected to a topology")
        self.begin("peer", f"peer {self.index}->{dst_index} {nbytes}B")
        self.peer_bytes += nbytes
        return self.topology.peer_copy_time(nbytes, self.index, dst_index)


def _per_output(c: Counters, est: dict[str, Any], outputs: int) -> None:
    """Work a shape-generic kernel does per output element (``per_output``: vector FLOPs per
    dtype, bytes read, and bytes written, which replace the counted writes), times ``outputs``;
    plus ``bytes_read_per_instance`` (a uniform load each program instance makes)."""
    per = est.get("per_output")
    if not per:
        return
    for dt, f in per.get("vector_flops", {}).items():
        c.add_flops(c.vector_flops, dt, float(f) * outputs)
    for dt, f in per.get("vector_flops_per_instance", {}).items():   # e.g. index arithmetic
        c.add_flops(c.vector_flops, dt, float(f) * c.instances)
    c.bytes_read += int(float(per.get("bytes_read", 0)) * outputs)
    c.bytes_read += int(per.get("bytes_read_per_instance", 0)) * c.instances
    if "bytes_written" in per:
        c.bytes_written = int(float(per["bytes_written"]) * outputs)


def estimate_counters(program: Program, grid: tuple[int, int, int], args: dict[str, Any]) -> Counters:
    """The counters a kernel's attached estimate predicts for this launch (shape-only mode).

    ``kind = "counters"``: counts fixed at code generation (footprints relative
    to each pointer argument); ``kind = "gemm"``: a tiled GEMM priced by
    :func:`~fornax.sim.cost.gemm_counters`, its sizes either baked in or
    named scalar arguments, plus any fused epilogue's work; ``kind = "outputs"``: a
    shape-generic elementwise pass over ``grid[2] x m x n`` outputs (``per_output`` work).
    A ``"counters"`` estimate may carry ``per_slice`` (``axis`` plus counters and footprint
    growth): the counts given are for a launch one slice wide along that grid axis (a kernel
    generic over, say, its batch) and grow by ``per_slice`` with every further slice.
    """
    est = program.meta.get("estimate")
    if not isinstance(est, dict):
        raise ExecutionError(f"kernel {program.name!r} carries no cost estimate, so a shape-only "
                             "(meta) device cannot price it; its generator must attach one")

    def size(v: str | int) -> int:
        return int(args[v]) if isinstance(v, str) else int(v)

    if est.get("kind") == "gemm":
        batch = grid[2] if est["batch"] == "grid" else int(est["batch"])
        c = gemm_counters(size(est["m"]), size(est["n"]), size(est["k"]), batch, est["dtype"],
                          tuple(est["tile"]), bool(est.get("b_batched")), clamp=False,
                          sparse=bool(est.get("sparse")))
        epi = est.get("epilogue")
        if epi:
            for dt, f in epi["vector_flops"].items():
                c.add_flops(c.vector_flops, dt, f)
            c.bytes_read += int(epi["bytes_read"])
            c.bytes_written = int(epi["bytes_written"])
        _per_output(c, est, batch * size(est["m"]) * size(est["n"]))
    elif est.get("kind") == "outputs":
        c = Counters(instances=grid[0] * grid[1] * grid[2])
        _per_output(c, est, grid[2] * size(est["m"]) * size(est["n"]))
    else:
        c = Counters(instances=int(est["instances"]), matrix_flops=dict(est["matrix_flops"]),
                     vector_flops=dict(est["vector_flops"]), bytes_read=int(est["bytes_read"]),
                     bytes_written=int(est["bytes_written"]),
                     instructions=int(est.get("instructions", 0)))
    step = est.get("per_slice") or {}
    extra = grid[int(step["axis"])] - 1 if step else 0
    if extra:
        c.instances += int(step["instances"]) * extra
        for table, key in ((c.matrix_flops, "matrix_flops"), (c.vector_flops, "vector_flops")):
            for dt, f in step.get(key, {}).items():
                c.add_flops(table, dt, float(f) * extra)
        c.bytes_read += int(step["bytes_read"]) * extra
        c.bytes_written += int(step["bytes_written"]) * extra
    for ranges, key in ((c.read_ranges, "read"), (c.write_ranges, "write")):
        if key in est:
            grow = step.get(key, {})
            ranges.clear()
            ranges.update({p: (int(args[p]) + lo, int(args[p]) + hi + extra * int(grow.get(p, 0)))
                           for p, (lo, hi) in est[key].items()})
        else:  # gemm_counters lays its buffers out from address 0: rebase on the arguments
            ranges.update({p: (int(args[p]), int(args[p]) + hi - lo) for p, (lo, hi) in ranges.items()})
    return c
