"""Driver queues: :class:`QueueBase`, the shared policy of a queue of device work.

Validation, completion tracking through a timeline semaphore, host waits, and the
functional effect and cost of each launch and copy.  A vendor queue implements
:meth:`QueueBase._submit` — how a packet reaches the hardware in that family (a
stream push, an AQL packet and a doorbell, a command-list append and execute).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ...sim.device import Device
from ...sim.faults import PageFault, SimError
from ...sim.isa import Program
from ...sim.memory import defer
from ...sim.timeline import HardwareQueue, Packet, Semaphore
from .core import is_int
from .kernel_log import KernelRecord
from .memory import DriverMemory
from .protocol import Context, HostArray, KernelArgs, Marker, Module

#: a packet's functional effect: runs when the packet executes, returns its duration (s)
Work = Callable[[], float]

_NO_BYTES = np.empty(0, dtype=np.uint8)


def _host_bytes(src: np.ndarray, held: bool) -> np.ndarray:
    """The bytes of ``src`` in C order, flat: ``src`` itself where it is C-contiguous and
    ``held`` (the caller keeps it unchanged until the copy is done), else a copy taken now."""
    data = np.ascontiguousarray(src)
    if not held and np.may_share_memory(data, src):
        data = data.copy()
    return data.reshape(-1).view(np.uint8)


class QueueBase:
    """Shared queue policy: validation, completion tracking, host waits.

    A vendor queue implements :meth:`_submit` — how a packet reaches the
    hardware in that family (a stream push, an AQL packet and a doorbell, a
    command-list append and execute).
    """

    flavour = "queue"

    def __init__(self, driver: DriverMemory, ctx: Context):
        self.driver = driver
        self.ctx = ctx
        self.device: Device = ctx.device
        self.hwq: HardwareQueue = ctx.device.timeline.create_queue(f"{driver.vendor}:{self.flavour}")
        ctx.queues.append(self)
        self.sem = Semaphore(f"{self.flavour}{self.hwq.id}")
        self.destroyed = False
        self.submitted = 0
        self._pending_waits: list[tuple[Semaphore, int]] = []
        #: share of the spec's launch latency charged to kernels dispatched now (the runtime
        #: lowers it while it replays a captured graph: one graph launch, cheap nodes)
        self.launch_scale = 1.0
        #: launches validated before: (module id, entry, grid, argument names) -> (module,
        #: program, padded grid); what the checks read is fixed for a loaded module's kernel
        self._validated: dict[tuple[Any, ...], tuple[Module, Program, tuple[int, int, int]]] = {}

    # -- vendor hooks -----------------------------------------------------------
    def _submit(self, packet: Packet) -> None:
        raise NotImplementedError

    def release(self) -> None:
        """The queue is destroyed: give back what the family's queue holds in its context
        (work already submitted has read everything it needs)."""

    def _push(self, engine: str, work: Work, label: str, kind: str,
              also_signal: Iterable[tuple[Semaphore, int]] = (),
              copy: tuple[str, int] | None = None) -> None:
        # ``submitted`` counts a packet only once it is on the hardware queue: the garbage
        # collector can run a finaliser while the packet is built or submitted, and a free
        # that synchronises waits for ``submitted`` (which must not name this packet yet)
        if self.destroyed:
            raise self.driver.fail("invalid_handle", f"{self.flavour} {self.hwq.id} was destroyed",
                                   call="destroy_queue", hint="create a new queue")
        if copy is not None and self.driver.collector is not None:   # a profiler subscribes
            work = self.driver.collector.copy_work(self, work, copy[0], copy[1])
        value = self.submitted + 1
        waits, self._pending_waits = self._pending_waits, []
        packet = Packet(engine, work, label, kind, waits=waits, signals=[(self.sem, value), *also_signal])
        self._submit(packet)
        self.submitted = value

    # -- work -------------------------------------------------------------------
    def launch(self, module: Module, entry: str, grid: Sequence[int], args: KernelArgs) -> None:
        d = self.driver
        d.check(self.ctx, "launch")
        try:
            key: tuple[Any, ...] | None = (id(module), entry, tuple(grid), tuple(args))
            seen = self._validated.get(key) if key is not None else None
        except TypeError:                 # an unhashable grid or argument name: check it all
            key, seen = None, None
        if seen is not None and seen[0] is module and module.loaded and \
                module.context is self.ctx and module.kernels.get(entry) is seen[1]:
            # the same loaded kernel, grid and argument names as a launch checked before
            d.counts["launches"] += 1
            self._dispatch(seen[1], entry, seen[2], dict(args))
            return
        if not isinstance(module, Module) or module.context is not self.ctx or not module.loaded:
            raise d.fail("invalid_handle", "the module is not loaded in this queue's context",
                         call="launch")
        program = module.kernels.get(entry)
        if program is None:
            raise d.fail("kernel_not_found", f"no kernel named {entry!r} in the module "
                         f"(it has {', '.join(module.kernels) or 'none'})", call="get_function")
        padded = tuple(int(g) for g in grid) + (1,) * (3 - len(tuple(grid)))
        spec = self.device.spec
        if len(padded) != 3 or any(g <= 0 or g > m for g, m in zip(padded, spec.max_grid)):
            raise d.fail("invalid_value", f"grid {padded} is outside the device limits "
                         f"{spec.max_grid}", call="launch")
        group = int(program.meta.get("group_size", d.facts["driver"]["simd_width"]))
        if group > spec.max_group_size:
            raise d.fail("invalid_group_size", f"kernel {entry!r} needs work-groups of {group} lanes; "
                         f"the device allows {spec.max_group_size}", call="launch")
        regs = int(program.meta.get("registers", 0))       # 32-bit registers per lane
        if regs * group > spec.registers_per_unit:
            raise d.fail("out_of_registers", f"kernel {entry!r} needs {regs} registers per lane x "
                         f"{group} lanes = {regs * group}; a compute unit has "
                         f"{spec.registers_per_unit}", call="launch",
                         hint="launch smaller work-groups or build the kernel with fewer registers")
        smem = int(program.meta.get("shared_memory", 0))   # bytes per work-group
        if smem > spec.shared_memory_per_unit:
            raise d.fail("out_of_shared_memory", f"kernel {entry!r} needs {smem} bytes of shared "
                         f"memory per work-group; a compute unit has {spec.shared_memory_per_unit}",
                         call="launch", hint="use a smaller tile")
        missing = [p.name for p in program.params if p.name not in args]
        if missing:
            raise d.fail("invalid_value", f"kernel {entry!r} is missing argument(s) "
                         f"{', '.join(missing)}", call="launch")
        d.counts["launches"] += 1
        if key is not None:
            if len(self._validated) >= 4096:
                self._validated.clear()
            self._validated[key] = (module, program, (padded[0], padded[1], padded[2]))
        self._dispatch(program, entry, (padded[0], padded[1], padded[2]), dict(args))

    def _kernel_work(self, program: Program, entry: str, grid: tuple[int, int, int],
                     args: KernelArgs) -> Work:
        """The functional effect and cost of one kernel, run when its packet executes."""
        # what the launch path took is fixed at dispatch: the share of the launch latency
        # saved, and this launch's number (it runs later, in queue order)
        col = self.driver.collector
        return _KernelWork(self, program, entry, grid, args, 1.0 - self.launch_scale,
                           self.driver.counts["launches"], 0 if col is None else col.correlation())

    def prefetch(self, address: int, nbytes: int) -> None:
        """Migrate managed memory to the device ahead of use, in queue order, on a copy
        engine (cuMemPrefetchAsync, hipMemPrefetchAsync, zeCommandListAppendMemoryPrefetch).
        Where the family's device reads managed memory remotely it moves nothing."""
        d, call = self.driver, "prefetch"
        d.check(self.ctx, call)
        lo, hi = int(address), int(address) + int(nbytes)
        if nbytes <= 0 or not any(d._regions(self.ctx.space, lo, hi)):
            raise d.fail("invalid_value", f"{nbytes} bytes at {lo:#x} are not managed memory",
                         call=call, address=lo, hint="prefetch applies to managed allocations")
        space, device = self.ctx.space, self.device

        def work() -> float:
            if d.managed_policy(device) != "migrate":
                return 0.0
            moved = sum(d._migrate(r, a, b, True)[1] for r, a, b in list(d._regions(space, lo, hi)))
            d.counts["managed_prefetch_bytes"] += moved
            t = moved / device.spec.host_link_bandwidth
            d.managed_migration_s += t
            return t

        self._push("copy", work, f"prefetch {nbytes}B", "copy")

    def _dispatch(self, program: Program, entry: str, grid: tuple[int, int, int],
                  args: KernelArgs) -> None:
        """How a validated launch reaches the hardware; families may encode packets here."""
        self._push("compute", self._kernel_work(program, entry, grid, args), entry, "kernel")

    def check_marker(self, marker: object, call: str = "wait") -> Marker:
        if not isinstance(marker, Marker):
            raise self.driver.fail("invalid_handle", f"expected an event/marker recorded on a queue, "
                                   f"got {type(marker).__name__}", call=call)
        return marker

    def _check_range(self, address: int, nbytes: int, call: str) -> None:
        if not is_int(address) or not is_int(nbytes) or nbytes < 0:
            raise self.driver.fail("invalid_value", f"a copy needs an integer device address and size, "
                                   f"got address {address!r} and size {nbytes!r}", call=call)
        try:
            self.ctx.space.resolve(int(address), int(nbytes), "copy")
        except PageFault as exc:
            raise self.driver.fail("invalid_value", f"copy of {nbytes} bytes at {int(address):#x} is "
                                   f"outside device memory: {exc.detail}", call=call,
                                   address=int(address)) from None

    def copy_h2d(self, dst: int, src: HostArray, host_rate: float = 1.0, held: bool = False) -> None:
        """``host_rate``: share of the host link's bandwidth the host side sustains (1 for
        pinned memory; below 1 for pageable memory staged through a bounce buffer).
        ``held``: the caller keeps ``src`` unchanged (and alive) until the copy has completed
        and been waited for, so the copy reads ``src`` itself when it runs instead of a
        staging copy taken now; the bytes that land are the same."""
        d = self.driver
        d.check(self.ctx, "copy_h2d")
        meta = self.device.meta            # shape-only: priced and counted, no bytes move
        if not meta and not isinstance(src, np.ndarray):
            raise d.fail("invalid_value", f"the host source must be a numpy array, got "
                         f"{type(src).__name__}", call="copy_h2d")
        # staged at submit, as pageable memory is (only a shape-only device takes a shape): one
        # copy of the bytes, in C order, which the deferred write keeps until it lands
        data = _host_bytes(src, held) if isinstance(src, np.ndarray) and not meta else _NO_BYTES
        size = int(src.nbytes) if meta else int(data.size)
        self._check_range(dst, size, "copy_h2d")
        d.counts["copies"] += 1
        d.counts["h2d_bytes"] += size
        space, device = self.ctx.space, self.device

        def work() -> float:
            duration = device.copy_duration(size, "h2d")     # first: a fault stops the copy
            duration += (1.0 / host_rate - 1.0) * size / device.spec.host_link_bandwidth
            if not meta:
                space.write(int(dst), data, owned=True)
            device.timeline.annotate(writes=[(int(dst), int(dst) + size, "dst")],
                                     bytes=size, direction="h2d")
            return duration

        self._push("copy", work, f"h2d {size}B", "copy", copy=("h2d", size))

    def copy_d2h(self, dst: HostArray, src: int, host_rate: float = 1.0) -> None:
        d = self.driver
        d.check(self.ctx, "copy_d2h")
        meta = self.device.meta            # shape-only: dst may be a shape descriptor; no bytes move
        if not meta and not (isinstance(dst, np.ndarray) and dst.flags.c_contiguous
                             and dst.flags.writeable):
            raise d.fail("invalid_value", "the host destination must be a writable contiguous array",
                         call="copy_d2h")
        nbytes = dst.nbytes
        self._check_range(src, nbytes, "copy_d2h")
        d.counts["copies"] += 1
        d.counts["d2h_bytes"] += nbytes
        space, device = self.ctx.space, self.device
        out = dst.reshape(-1).view(np.uint8) if isinstance(dst, np.ndarray) and not meta else None

        def work() -> float:
            duration = device.copy_duration(nbytes, "d2h")
            duration += (1.0 / host_rate - 1.0) * nbytes / device.spec.host_link_bandwidth
            # the host buffer fills when the copy completes, like device memory does
            if not meta:
                defer(np.copyto, out, np.frombuffer(space.read(int(src), nbytes), dtype=np.uint8))
            device.timeline.annotate(reads=[(int(src), int(src) + nbytes, "src")],
                                     bytes=nbytes, direction="d2h")
            return duration

        self._push("copy", work, f"d2h {nbytes}B", "copy", copy=("d2h", nbytes))

    def copy_d2d(self, dst: int, src: int, nbytes: int) -> None:
        d = self.driver
        d.check(self.ctx, "copy_d2d")
        self._check_range(src, nbytes, "copy_d2d")
        self._check_range(dst, nbytes, "copy_d2d")
        d.counts["copies"] += 1
        d.counts["d2d_bytes"] += nbytes
        space, device = self.ctx.space, self.device

        def work() -> float:
            duration = device.copy_duration(nbytes, "d2d")
            if not device.meta:          # the bytes read are a copy of their own: the write keeps it
                space.write(int(dst), space.read(int(src), nbytes), owned=True)
            device.timeline.annotate(reads=[(int(src), int(src) + nbytes, "src")],
                                     writes=[(int(dst), int(dst) + nbytes, "dst")],
                                     bytes=nbytes, direction="d2d")
            return duration

        self._push("copy", work, f"d2d {nbytes}B", "copy", copy=("d2d", nbytes))

    def copy_peer(self, dst_ctx: Context, dst: int, src: int, nbytes: int,
                  link: int | None = None) -> None:
        """Copy ``nbytes`` from ``src`` in this queue's context to ``dst`` in ``dst_ctx`` on
        another device, over the fabric's link (a peer-link engine of this device's
        timeline; a collective's channel part names its ``link``), priced by the
        topology.  Like a peer memcpy it needs no peer access."""
        d, call = self.driver, "copy_peer"
        d.check(self.ctx, call)
        d.check(dst_ctx, call)
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise d.fail("invalid_value", f"copy size must be a positive integer, got {nbytes!r}",
                         call=call)
        nbytes = int(nbytes)
        a, b = d.devices.index(self.device), d.devices.index(dst_ctx.device)
        if a == b:
            raise d.fail("invalid_value", f"both contexts are on device {a}; a peer copy is "
                         "between two devices", call=call, hint="use a device-to-device copy")
        if not d.can_access_peer(a, b):
            raise d.fail("peer_access_unsupported", f"no fabric joins device {a} and device {b}",
                         call=call, hint="compose the stack with devices > 1")
        self._check_range(src, nbytes, call)
        try:
            dst_ctx.space.resolve(int(dst), nbytes, "copy")
        except PageFault as exc:
            raise d.fail("invalid_value", f"copy of {nbytes} bytes to {int(dst):#x} on device {b} is "
                         f"outside its memory: {exc.detail}", call=call, address=int(dst)) from None
        device = self.device
        topology = device.topology
        if topology is None:            # can_access_peer said a fabric joins the two devices
            raise d.fail("peer_access_unsupported", f"device {a} is on no fabric", call=call)
        try:
            engine = topology.egress(a, b, None if link is None else int(link))
        except ValueError as exc:
            raise d.fail("invalid_value", str(exc), call=call) from None
        d.counts["copies"] += 1
        d.counts["peer_bytes"] += nbytes
        src_space, dst_space = self.ctx.space, dst_ctx.space

        def work() -> float:
            duration = device.peer_copy_duration(nbytes, b)     # first: a fault stops the copy
            if not device.meta:                                 # shape-only: priced, no bytes move
                dst_space.write(int(dst), src_space.read(int(src), nbytes), owned=True)
            device.timeline.annotate(reads=[(int(src), int(src) + nbytes, "src")],
                                     writes=[(int(dst), int(dst) + nbytes, "dst")],
                                     bytes=nbytes, direction=f"peer {a}->{b}")
            return duration

        self._push(engine, work, f"peer {a}->{b} {nbytes}B", "copy", copy=("peer", nbytes))

    def enqueue(self, work: Work, label: str, kind: str = "collective", engine: str = "compute") -> None:
        """An operation whose effect ``work`` runs when the device reaches it and returns its
        simulated duration (the Queue Protocol's ``enqueue``)."""
        self.driver.check(self.ctx, "launch")
        self._push(engine, work, label, kind)

    # -- ordering ---------------------------------------------------------------
    def record(self) -> Marker:
        return Marker(self.sem, self.submitted)

    def wait(self, marker: Marker) -> None:
        """Later work on this queue starts only after ``marker`` is reached."""
        self.check_marker(marker)
        self._pending_waits.append((marker.sem, marker.value))

    def waiting(self) -> list[Marker]:
        return [Marker(sem, value) for sem, value in self._pending_waits]

    def synchronize(self) -> None:
        d = self.driver
        d.check(self.ctx, "synchronize")
        if self._pending_waits:
            self._push("compute", lambda: 0.0, "wait", "barrier")
        try:
            self.device.timeline.wait(self.sem, self.submitted)
        except SimError as exc:
            raise d.fault(self.ctx, exc, "synchronize") from None


class _KernelWork:
    """One kernel's functional effect and cost (:meth:`QueueBase._kernel_work`), called when its
    packet runs: one object per launch (a closure over the same values made one per value)."""

    __slots__ = ("queue", "program", "entry", "grid", "args", "saved", "seq", "correlation")

    def __init__(self, queue: QueueBase, program: Program, entry: str, grid: tuple[int, int, int],
                 args: KernelArgs, saved: float, seq: int, correlation: int = 0):
        self.queue, self.program, self.entry, self.grid, self.args = queue, program, entry, grid, args
        self.saved, self.seq, self.correlation = saved, seq, correlation

    def __call__(self) -> float:
        q = self.queue
        d, space, device = q.driver, q.ctx.space, q.device
        program, grid = self.program, self.grid
        counters, cost = device.run_kernel(space, program, grid, self.args)
        # migrations / remote reads of managed memory (none to look for without managed memory)
        extra = d.managed_device_access(
            device, space, [*counters.read_ranges.values(), *counters.write_ranges.values()]
        ) if d._managed else 0.0
        duration = cost.duration_s - self.saved * cost.launch_s
        flops = sum(counters.matrix_flops.values()) + sum(counters.vector_flops.values())
        d.kernel_log.append(KernelRecord(self.entry, grid, duration, flops,
                                         counters.bytes_read + counters.bytes_written, cost.bound,
                                         self.seq))
        device.timeline.annotate(
            reads=[(lo, hi, name) for name, (lo, hi) in counters.read_ranges.items()],
            writes=[(lo, hi, name) for name, (lo, hi) in counters.write_ranges.items()],
            grid=grid, flops=flops, bytes=counters.bytes_read + counters.bytes_written,
            bound=cost.bound)
        if d.collector is not None:       # a profiler subscribes: the kernel's activity record
            d.collector.kernel(q, self.entry, grid, self.seq, self.correlation, counters, cost,
                               duration + extra)
        return duration + extra
