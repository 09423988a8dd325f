"""The driver seam: devices, contexts, raw memory, modules, queues, launch.

:class:`Driver` and :class:`Queue` are the Protocols the runtime seam calls.
:class:`DriverBase` and :class:`QueueBase` hold the policy every family
shares (validation, the sticky-error rule, module loading by format rule,
fault mapping); a vendor supplies its facts (``vendor.toml``: API call
names, error codes, formats and their load rules, arch names) and small
hooks: how to decode its binary container, how its queues put work on the
hardware (streams, AQL packets, command lists), and how it describes a
device in its own vocabulary.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ..sim.device import Device
from ..sim.faults import InvalidProgram, PageFault, SimError
from ..sim.isa import Program
from ..sim.memory import AddressSpace, MemoryKind
from ..sim.timeline import HardwareQueue, Packet, Semaphore
from .binary import ContainerError, KernelBinary
from .errors import ErrorTable, FornaxError

_handles = itertools.count(0x1000)


@dataclass(frozen=True)
class DeviceProperties:
    index: int
    name: str
    target: str                      # the family's arch name: sm_90, gfx942, ...
    compute_units: int
    simd_width: int
    memory_bytes: int
    native: dict                     # the same device in the family's own vocabulary


@dataclass(eq=False)
class Context:
    handle: int
    device: Device
    space: AddressSpace
    sticky: FornaxError | None = None
    live: bool = True
    queues: list = field(default_factory=list)     # every queue created in this context


@dataclass(eq=False)
class Module:
    handle: int
    context: Context
    binary: KernelBinary
    kernels: dict[str, Program]
    load_s: float                    # simulated time the load took (JIT / IL build)
    how: str                         # "loaded", "jit", "built"


@dataclass(frozen=True)
class Marker:
    """A point on a queue's timeline: reached when ``sem`` reaches ``value``."""

    sem: Semaphore
    value: int


@dataclass
class KernelRecord:
    name: str
    grid: tuple[int, int, int]
    duration_s: float
    flops: float
    bytes: int
    bound: str


@runtime_checkable
class Queue(Protocol):
    """An ordered queue of device work (a stream, an AQL queue, a command list)."""

    flavour: str

    def launch(self, module: Module, entry: str, grid: tuple[int, int, int], args: dict) -> None: ...
    def copy_h2d(self, dst: int, src: np.ndarray) -> None: ...
    def copy_d2h(self, dst: np.ndarray, src: int) -> None: ...
    def copy_d2d(self, dst: int, src: int, nbytes: int) -> None: ...
    def record(self) -> Marker: ...
    def wait(self, marker: Marker) -> None: ...
    def synchronize(self) -> None: ...


@runtime_checkable
class Driver(Protocol):
    vendor: str

    def device_count(self) -> int: ...
    def properties(self, index: int) -> DeviceProperties: ...
    def loadable_formats(self, index: int) -> tuple[str, ...]: ...
    def create_context(self, index: int) -> Context: ...
    def destroy_context(self, ctx: Context) -> None: ...
    def allocate(self, ctx: Context, nbytes: int, kind: str = "device") -> int: ...
    def free(self, ctx: Context, address: int) -> None: ...
    def load_module(self, ctx: Context, binary: KernelBinary) -> Module: ...
    def create_queue(self, ctx: Context) -> Queue: ...
    def synchronize(self, ctx: Context) -> None: ...
    def report(self) -> dict: ...


def arch_number(target: str) -> int | None:
    """The numeric generation in an arch name (``sm_90`` -> 90, ``compute_80`` -> 80)."""
    m = re.search(r"(\d+)$", target)
    return int(m.group(1)) if m else None


class DriverBase:
    """Shared driver policy.  Vendors subclass it and set the hooks below."""

    seam = "driver"
    vendor = "base"
    facts: dict = {}
    queue_class: type["QueueBase"]

    # -- vendor hooks -----------------------------------------------------
    def decode_image(self, binary: KernelBinary) -> dict[str, Program]:
        """Parse the family's container into kernels; raise ContainerError or InvalidProgram."""
        raise NotImplementedError

    def native_properties(self, device: Device, target: str) -> dict:
        raise NotImplementedError

    # -- shared -------------------------------------------------------------
    def __init__(self, devices: list[Device]):
        d = self.facts["driver"]
        e = self.facts["errors"]
        self.errors = ErrorTable(e["api"], e["codes"], e["conditions"], seam="driver",
                                 vendor=self.vendor, hex=e.get("hex", False))
        self.calls: dict[str, str] = d["calls"]
        self.formats: dict[str, dict] = d["formats"]
        self.sticky_conditions = set(e.get("sticky", ()))
        self.devices = list(devices)
        self.contexts: list[Context] = []
        self.counts = {"contexts": 0, "modules_loaded": 0, "jit_compiles": 0, "il_builds": 0,
                       "launches": 0, "copies": 0, "h2d_bytes": 0, "d2h_bytes": 0, "d2d_bytes": 0,
                       "allocations": 0}
        self.kernel_log: list[KernelRecord] = []
        self.module_load_s = 0.0

    def fail(self, condition: str, message: str, *, call: str | None = None,
             hint: str | None = None, address: int | None = None) -> FornaxError:
        name = self.errors.faults.get(condition) or self.errors.faults["unknown"]
        return self.errors.error(name, message, op=self.calls.get(call, call), hint=hint,
                                 address=address)

    def fault(self, ctx: Context, exc: SimError, call: str) -> FornaxError:
        """Map a simulator fault; make the context sticky if this family does so."""
        err = self.errors.from_fault(exc, op=self.calls.get(call, call),
                                     hint=self._fault_hint(exc))
        if exc.kind in self.sticky_conditions:
            ctx.sticky = err
        return err

    def _fault_hint(self, exc: SimError) -> str | None:
        if isinstance(exc, PageFault):
            return "check kernel indexing and buffer sizes; the context must be destroyed or reset"
        return None

    def check(self, ctx: Context, call: str) -> None:
        if not isinstance(ctx, Context) or not ctx.live:
            raise self.fail("invalid_context", "the context was destroyed or is not a context",
                            call=call)
        if ctx.sticky is not None:
            raise self.errors.error(
                ctx.sticky.code.name,
                f"the context is unusable after an earlier error ({ctx.sticky.message})",
                op=self.calls.get(call, call), hint="destroy the context (or reset the device)")

    def _device(self, index: int, call: str) -> Device:
        if not isinstance(index, int) or not 0 <= index < len(self.devices):
            raise self.fail("invalid_device",
                            f"device ordinal {index!r} is out of range (0..{len(self.devices) - 1})",
                            call=call)
        return self.devices[index]

    def device_count(self) -> int:
        return len(self.devices)

    def target(self, index: int) -> str:
        dev = self._device(index, "device_get")
        arch = self.facts["driver"]["arch"]
        return arch.get(dev.spec.name, arch["default"])

    def properties(self, index: int) -> DeviceProperties:
        dev = self._device(index, "device_get")
        target = self.target(index)
        return DeviceProperties(index, dev.spec.description, target, dev.spec.compute_units,
                                self.facts["driver"]["simd_width"], dev.spec.hbm_bytes,
                                self.native_properties(dev, target))

    def loadable_formats(self, index: int) -> tuple[str, ...]:
        self._device(index, "device_get")
        return tuple(self.formats)

    # -- contexts and memory ----------------------------------------------
    def create_context(self, index: int) -> Context:
        dev = self._device(index, "create_context")
        ctx = Context(next(_handles), dev, dev.memory.create_space())
        self.contexts.append(ctx)
        self.counts["contexts"] += 1
        return ctx

    def destroy_context(self, ctx: Context) -> None:
        if not isinstance(ctx, Context) or not ctx.live:
            raise self.fail("invalid_context", "context already destroyed", call="destroy_context")
        ctx.device.memory.destroy_space(ctx.space)
        ctx.live = False

    def allocate(self, ctx: Context, nbytes: int, kind: str = "device") -> int:
        self.check(ctx, "allocate")
        if not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise self.fail("invalid_value", f"allocation size must be a positive integer, got {nbytes!r}",
                            call="allocate")
        try:
            mem_kind = MemoryKind(kind)
        except ValueError:
            raise self.fail("invalid_value", f"unknown memory kind {kind!r} "
                            f"(device, host_pinned, managed)", call="allocate") from None
        try:
            mapping = ctx.space.map(int(nbytes), mem_kind)
        except SimError as exc:
            mem = ctx.device.memory
            raise self.fail("out_of_memory", str(exc), call="allocate",
                            hint=f"{mem.used} of {mem.capacity} bytes in use, peak {mem.peak}; "
                                 "free buffers or use a larger spec") from None
        self.counts["allocations"] += 1
        return mapping.va

    def free(self, ctx: Context, address: int) -> None:
        self.check(ctx, "free")
        try:
            ctx.space.unmap(address)
        except PageFault as exc:
            raise self.fail("invalid_value", f"{address:#x} is not the start of a live allocation "
                            f"({exc.detail})", call="free", address=address) from None

    # -- modules ------------------------------------------------------------
    def load_module(self, ctx: Context, binary: KernelBinary) -> Module:
        self.check(ctx, "load_module")
        if not isinstance(binary, KernelBinary):
            raise self.fail("invalid_value", f"expected a KernelBinary, got {type(binary).__name__}",
                            call="load_module")
        rule = self.formats.get(binary.format)
        if rule is None:
            raise self.fail("unsupported_format",
                            f"cannot load a {binary.format} image; this driver loads "
                            f"{', '.join(self.formats)}", call="load_module",
                            hint="compose a compiler/library whose formats this driver loads")
        index = self.devices.index(ctx.device)
        device_target = self.target(index)
        how, cost = "loaded", 0.0
        if rule["rule"] == "exact" and binary.target != device_target:
            raise self.fail("no_binary_for_device",
                            f"{binary.format} image is built for {binary.target}, the device is "
                            f"{device_target}", call="load_module",
                            hint=f"rebuild for {device_target}")
        if rule["rule"] == "virtual":
            have, need = arch_number(device_target), arch_number(binary.target)
            if have is None or need is None or need > have:
                raise self.fail("no_binary_for_device",
                                f"{binary.format} for {binary.target} needs a device of that "
                                f"generation or newer; the device is {device_target}",
                                call="load_module")
            how = "jit"
        elif rule["rule"] == "il":
            how = "built"
        try:
            kernels = self.decode_image(binary)
        except (ContainerError, InvalidProgram, UnicodeDecodeError) as exc:
            condition = "build_failure" if how in ("jit", "built") else "corrupt_image"
            raise self.fail(condition, f"{binary.format} image rejected: {exc}", call="load_module",
                            hint="the binary is corrupt or was not produced for this format") from None
        if how != "loaded":
            cost = rule.get("build_s_per_kib", 0.0) * len(binary.data) / 1024 + rule.get("build_s", 0.0)
            self.counts["jit_compiles" if how == "jit" else "il_builds"] += 1
        self.counts["modules_loaded"] += 1
        self.module_load_s += cost
        return Module(next(_handles), ctx, binary, kernels, cost, how)

    # -- queues ---------------------------------------------------------------
    def create_queue(self, ctx: Context) -> "QueueBase":
        self.check(ctx, "create_queue")
        return self.queue_class(self, ctx)

    def synchronize(self, ctx: Context) -> None:
        self.check(ctx, "synchronize")
        try:
            ctx.device.timeline.drain()
        except SimError as exc:
            raise self.fault(ctx, exc, "synchronize") from None
        # a context synchronise reports a fault of any of its queues' work (cuCtxSynchronize)
        failure = next((q.hwq.failure for q in ctx.queues if q.hwq.failure is not None), None)
        if failure is not None:
            raise self.fault(ctx, failure, "synchronize")

    def report(self) -> dict:
        return {
            "vendor": self.vendor,
            "api": self.facts["driver"]["api"],
            "devices": [self.target(i) for i in range(len(self.devices))],
            "loadable_formats": list(self.formats),
            **self.counts,
            "kernels_executed": len(self.kernel_log),
            "module_load_s": self.module_load_s,
        }


class QueueBase:
    """Shared queue policy: validation, completion tracking, host waits.

    A vendor queue implements :meth:`_submit` — how a packet reaches the
    hardware in that family (a stream push, an AQL packet and a doorbell, a
    command-list append and execute).
    """

    flavour = "queue"

    def __init__(self, driver: DriverBase, ctx: Context):
        self.driver = driver
        self.ctx = ctx
        self.device = ctx.device
        self.hwq: HardwareQueue = ctx.device.timeline.create_queue(f"{driver.vendor}:{self.flavour}")
        ctx.queues.append(self)
        self.sem = Semaphore(f"{self.flavour}{self.hwq.id}")
        self.submitted = 0
        self._pending_waits: list[tuple[Semaphore, int]] = []

    # -- vendor hook ------------------------------------------------------------
    def _submit(self, packet: Packet) -> None:
        raise NotImplementedError

    def _push(self, engine: str, work, label: str, kind: str, also_signal=()) -> None:
        self.submitted += 1
        packet = Packet(engine, work, label, kind, waits=self._pending_waits,
                        signals=[(self.sem, self.submitted), *also_signal])
        self._pending_waits = []
        self._submit(packet)

    # -- work -------------------------------------------------------------------
    def launch(self, module: Module, entry: str, grid, args: dict) -> None:
        d = self.driver
        d.check(self.ctx, "launch")
        if not isinstance(module, Module) or module.context is not self.ctx:
            raise d.fail("invalid_handle", "the module is not loaded in this queue's context",
                         call="launch")
        program = module.kernels.get(entry)
        if program is None:
            raise d.fail("kernel_not_found", f"no kernel named {entry!r} in the module "
                         f"(it has {', '.join(module.kernels) or 'none'})", call="get_function")
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(tuple(grid)))
        spec = self.device.spec
        if len(grid) != 3 or any(g <= 0 or g > m for g, m in zip(grid, spec.max_grid)):
            raise d.fail("invalid_value", f"grid {grid} is outside the device limits "
                         f"{spec.max_grid}", call="launch")
        group = int(program.meta.get("group_size", d.facts["driver"]["simd_width"]))
        if group > spec.max_group_size:
            raise d.fail("invalid_group_size", f"kernel {entry!r} needs work-groups of {group} lanes; "
                         f"the device allows {spec.max_group_size}", call="launch")
        missing = [p.name for p in program.params if p.name not in args]
        if missing:
            raise d.fail("invalid_value", f"kernel {entry!r} is missing argument(s) "
                         f"{', '.join(missing)}", call="launch")
        d.counts["launches"] += 1
        self._dispatch(program, entry, grid, dict(args))

    def _kernel_work(self, program: Program, entry: str, grid: tuple[int, int, int], args: dict):
        """The functional effect and cost of one kernel, run when its packet executes."""
        d, space, device = self.driver, self.ctx.space, self.device

        def work() -> float:
            counters, cost = device.run_kernel(space, program, grid, args)
            flops = sum(counters.matrix_flops.values()) + sum(counters.vector_flops.values())
            d.kernel_log.append(KernelRecord(entry, grid, cost.duration_s, flops,
                                             counters.bytes_read + counters.bytes_written, cost.bound))
            return cost.duration_s

        return work

    def _dispatch(self, program: Program, entry: str, grid: tuple[int, int, int], args: dict) -> None:
        """How a validated launch reaches the hardware; families may encode packets here."""
        self._push("compute", self._kernel_work(program, entry, grid, args), entry, "kernel")

    def _check_range(self, address: int, nbytes: int, call: str) -> None:
        try:
            self.ctx.space.resolve(int(address), int(nbytes), "copy")
        except PageFault as exc:
            raise self.driver.fail("invalid_value", f"copy of {nbytes} bytes at {int(address):#x} is "
                                   f"outside device memory: {exc.detail}", call=call,
                                   address=int(address)) from None

    def copy_h2d(self, dst: int, src: np.ndarray) -> None:
        d = self.driver
        d.check(self.ctx, "copy_h2d")
        data = np.ascontiguousarray(src).tobytes()        # staged at submit, as pageable memory is
        self._check_range(dst, len(data), "copy_h2d")
        d.counts["copies"] += 1
        d.counts["h2d_bytes"] += len(data)
        space, device = self.ctx.space, self.device

        def work() -> float:
            space.write(int(dst), data)
            return device.copy_duration(len(data), "h2d")

        self._push("copy", work, f"h2d {len(data)}B", "copy")

    def copy_d2h(self, dst: np.ndarray, src: int) -> None:
        d = self.driver
        d.check(self.ctx, "copy_d2h")
        if not (isinstance(dst, np.ndarray) and dst.flags.c_contiguous and dst.flags.writeable):
            raise d.fail("invalid_value", "the host destination must be a writable contiguous array",
                         call="copy_d2h")
        nbytes = dst.nbytes
        self._check_range(src, nbytes, "copy_d2h")
        d.counts["copies"] += 1
        d.counts["d2h_bytes"] += nbytes
        space, device = self.ctx.space, self.device
        out = dst.reshape(-1).view(np.uint8)

        def work() -> float:
            out[:] = np.frombuffer(space.read(int(src), nbytes), dtype=np.uint8)
            return device.copy_duration(nbytes, "d2h")

        self._push("copy", work, f"d2h {nbytes}B", "copy")

    def copy_d2d(self, dst: int, src: int, nbytes: int) -> None:
        d = self.driver
        d.check(self.ctx, "copy_d2d")
        self._check_range(src, nbytes, "copy_d2d")
        self._check_range(dst, nbytes, "copy_d2d")
        d.counts["copies"] += 1
        d.counts["d2d_bytes"] += nbytes
        space, device = self.ctx.space, self.device

        def work() -> float:
            space.write(int(dst), space.read(int(src), nbytes))
            return device.copy_duration(nbytes, "d2d")

        self._push("copy", work, f"d2d {nbytes}B", "copy")

    # -- ordering ---------------------------------------------------------------
    def record(self) -> Marker:
        return Marker(self.sem, self.submitted)

    def wait(self, marker: Marker) -> None:
        """Later work on this queue starts only after ``marker`` is reached."""
        self._pending_waits.append((marker.sem, marker.value))

    def synchronize(self) -> None:
        d = self.driver
        d.check(self.ctx, "synchronize")
        if self._pending_waits:
            self._push("compute", lambda: 0.0, "wait", "barrier")
        try:
            self.device.timeline.wait(self.sem, self.submitted)
        except SimError as exc:
            raise d.fault(self.ctx, exc, "synchronize") from None
