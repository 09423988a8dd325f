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
from ..sim.memory import AddressSpace, MemoryKind, defer
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
    def copy_peer(self, dst_ctx: Context, dst: int, src: int, nbytes: int) -> None: ...
    def record(self) -> Marker: ...
    def wait(self, marker: Marker) -> None: ...
    def synchronize(self) -> None: ...


@runtime_checkable
class Driver(Protocol):
    vendor: str

    def device_count(self) -> int: ...
    def properties(self, index: int) -> DeviceProperties: ...
    def memory_info(self, index: int) -> tuple[int, int]:
        """(free, total) bytes of device memory, as cuMemGetInfo reports them."""
        dev = self._device(index, "memory_info")
        return dev.memory.capacity - dev.memory.used, dev.memory.capacity

    def loadable_formats(self, index: int) -> tuple[str, ...]: ...
    def create_context(self, index: int) -> Context: ...
    def destroy_context(self, ctx: Context) -> None: ...
    def allocate(self, ctx: Context, nbytes: int, kind: str = "device") -> int: ...
    def free(self, ctx: Context, address: int) -> None: ...
    def load_module(self, ctx: Context, binary: KernelBinary) -> Module: ...
    def create_queue(self, ctx: Context) -> Queue: ...
    def synchronize(self, ctx: Context) -> None: ...
    def can_access_peer(self, index: int, peer: int) -> bool: ...
    def enable_peer_access(self, ctx: Context, peer_ctx: Context) -> None: ...
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
        self.lost_conditions = set(e.get("lost", ()))     # faults that lose the whole device
        self.lost: dict[int, FornaxError] = {}            # device index -> the error that lost it
        self.devices = list(devices)
        self.contexts: list[Context] = []
        self.counts = {"contexts": 0, "modules_loaded": 0, "jit_compiles": 0, "il_builds": 0,
                       "launches": 0, "copies": 0, "h2d_bytes": 0, "d2h_bytes": 0, "d2d_bytes": 0,
                       "allocations": 0, "peer_bytes": 0}
        self.kernel_log: list[KernelRecord] = []
        self.counts["resets"] = 0
        self.peer_rule: str | None = d.get("peer", {}).get("rule")    # "explicit" or "query"
        self._peer_enabled: set[tuple[int, int]] = set()   # (context handle, peer context handle)
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
        if exc.kind in self.lost_conditions:
            self.lost[self.devices.index(ctx.device)] = err
        elif exc.kind in self.sticky_conditions:
            ctx.sticky = err
        return err

    def _fault_hint(self, exc: SimError) -> str | None:
        if exc.kind in self.lost_conditions:
            return f"the device is unusable until it is reset ({self.calls.get('reset', 'reset')})"
        if isinstance(exc, PageFault):
            return "check kernel indexing and buffer sizes; the context must be destroyed or reset"
        if exc.kind in self.sticky_conditions:
            return "the context must be destroyed (or the device reset)"
        return None

    def _check_lost(self, dev: Device, call: str) -> None:
        """A lost device fails every call with the code that lost it, until reset."""
        index = self.devices.index(dev)
        lost = self.lost.get(index)
        if lost is None and dev.lost is not None:
            lost = self.errors.from_fault(dev.lost, op=self.calls.get(call, call),
                                          hint=self._fault_hint(dev.lost))
            self.lost[index] = lost
        if lost is not None:
            raise self.errors.error(
                lost.code.name, f"device {index} is unusable after an earlier error ({lost.message})",
                op=self.calls.get(call, call),
                hint=f"reset the device ({self.calls.get('reset', 'reset')})")

    def check(self, ctx: Context, call: str) -> None:
        if not isinstance(ctx, Context) or not ctx.live:
            raise self.fail("invalid_context", "the context was destroyed or is not a context",
                            call=call)
        self._check_lost(ctx.device, call)
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
        self._check_lost(dev, "create_context")
        ctx = Context(next(_handles), dev, dev.memory.create_space())
        if self.peer_rule == "query":
            # no enable call in this family: contexts reach every peer the query allows
            for other in self.contexts:
                if other.live and self.can_access_peer(index, self.devices.index(other.device)):
                    ctx.space.grant_peer(other.space)
                    other.space.grant_peer(ctx.space)
        self.contexts.append(ctx)
        self.counts["contexts"] += 1
        return ctx

    def destroy_context(self, ctx: Context) -> None:
        if not isinstance(ctx, Context) or not ctx.live:
            raise self.fail("invalid_context", "context already destroyed", call="destroy_context")
        ctx.device.memory.destroy_space(ctx.space)
        ctx.live = False
        for other in self.contexts:
            other.space.revoke_peer(ctx.space)
        self._peer_enabled = {p for p in self._peer_enabled if ctx.handle not in p}

    def reset(self, index: int) -> None:
        """Reset device ``index`` (the family's call is ``[driver.calls] reset``): destroy
        every context on it and all their mappings, clear its lost state and failed
        hardware queues.  Old handles and addresses are invalid; new contexts work."""
        dev = self._device(index, "reset")
        for ctx in list(self.contexts):
            if ctx.device is dev and ctx.live:
                self.destroy_context(ctx)
        dev.reset()
        self.lost.pop(index, None)
        self.counts["resets"] += 1

    # -- peer access ----------------------------------------------------------
    def can_access_peer(self, index: int, peer: int) -> bool:
        """Whether device ``index`` can reach device ``peer``'s memory over a fabric."""
        dev = self._device(index, "can_access_peer")
        other = self._device(peer, "can_access_peer")
        return dev is not other and dev.topology is not None and dev.topology is other.topology

    def enable_peer_access(self, ctx: Context, peer_ctx: Context) -> None:
        """Let ``ctx`` (its kernels and copies) access memory of ``peer_ctx`` on another
        device.  One direction only; the family's ``[driver.peer] rule`` decides whether
        this call exists ("explicit") or access simply follows the query ("query")."""
        call = "enable_peer_access"
        self.check(ctx, call)
        self.check(peer_ctx, call)
        if self.peer_rule != "explicit":
            query = self.calls.get("can_access_peer", "can_access_peer")
            raise self.fail("not_supported", f"{self.facts['driver']['api']} has no call to enable "
                            "peer access", call=call,
                            hint=f"ask {query}; where it says yes, access needs no enable call")
        a, b = self.devices.index(ctx.device), self.devices.index(peer_ctx.device)
        if a == b:
            raise self.fail("invalid_device", f"both contexts are on device {a}; peer access is "
                            "between two devices", call=call)
        if not self.can_access_peer(a, b):
            raise self.fail("peer_access_unsupported", f"device {a} cannot access device {b} "
                            "(no fabric joins them)", call=call,
                            hint="compose the stack with devices > 1 so a topology joins them")
        if (ctx.handle, peer_ctx.handle) in self._peer_enabled:
            raise self.fail("peer_access_already_enabled", f"peer access from device {a} to "
                            f"device {b} is already enabled for this context", call=call)
        ctx.space.grant_peer(peer_ctx.space)
        self._peer_enabled.add((ctx.handle, peer_ctx.handle))

    def disable_peer_access(self, ctx: Context, peer_ctx: Context) -> None:
        """Undo :meth:`enable_peer_access` for this one direction."""
        call = "disable_peer_access"
        self.check(ctx, call)
        self.check(peer_ctx, call)
        if self.peer_rule != "explicit":
            raise self.fail("not_supported", f"{self.facts['driver']['api']} has no call to disable "
                            "peer access", call=call)
        if (ctx.handle, peer_ctx.handle) not in self._peer_enabled:
            raise self.fail("peer_access_not_enabled", "peer access to that context was never "
                            "enabled from this context", call=call)
        ctx.space.revoke_peer(peer_ctx.space)
        self._peer_enabled.discard((ctx.handle, peer_ctx.handle))

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
            "ecc_corrected": sum(d.ecc_corrected for d in self.devices),
            "devices_lost": sorted(self.lost),
            "races": [r.to_dict() for d in self.devices for r in d.timeline.races],
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
            device.timeline.annotate(
                reads=[(lo, hi, name) for name, (lo, hi) in counters.read_ranges.items()],
                writes=[(lo, hi, name) for name, (lo, hi) in counters.write_ranges.items()],
                grid=list(grid), flops=flops, bytes=counters.bytes_read + counters.bytes_written,
                bound=cost.bound)
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
        meta = self.device.meta            # shape-only: priced and counted, no bytes move
        data = b"" if meta else np.ascontiguousarray(src).tobytes()  # staged at submit, as pageable memory is
        size = int(src.nbytes) if meta else len(data)
        self._check_range(dst, size, "copy_h2d")
        d.counts["copies"] += 1
        d.counts["h2d_bytes"] += size
        space, device = self.ctx.space, self.device

        def work() -> float:
            duration = device.copy_duration(size, "h2d")     # first: a fault stops the copy
            if not meta:
                space.write(int(dst), data)
            device.timeline.annotate(writes=[(int(dst), int(dst) + size, "dst")],
                                     bytes=size, direction="h2d")
            return duration

        self._push("copy", work, f"h2d {size}B", "copy")

    def copy_d2h(self, dst: np.ndarray, src: int) -> None:
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
        out = None if meta else dst.reshape(-1).view(np.uint8)

        def work() -> float:
            duration = device.copy_duration(nbytes, "d2h")
            # the host buffer fills when the copy completes, like device memory does
            if not meta:
                defer(np.copyto, out, np.frombuffer(space.read(int(src), nbytes), dtype=np.uint8))
            device.timeline.annotate(reads=[(int(src), int(src) + nbytes, "src")],
                                     bytes=nbytes, direction="d2h")
            return duration

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
            duration = device.copy_duration(nbytes, "d2d")
            if not device.meta:
                space.write(int(dst), space.read(int(src), nbytes))
            device.timeline.annotate(reads=[(int(src), int(src) + nbytes, "src")],
                                     writes=[(int(dst), int(dst) + nbytes, "dst")],
                                     bytes=nbytes, direction="d2d")
            return duration

        self._push("copy", work, f"d2d {nbytes}B", "copy")

    def copy_peer(self, dst_ctx: Context, dst: int, src: int, nbytes: int) -> None:
        """Copy ``nbytes`` from ``src`` in this queue's context to ``dst`` in ``dst_ctx`` on
        another device, over the fabric's link (a peer-link engine of this device's
        timeline), priced by the topology.  Like a peer memcpy it needs no peer access."""
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
        d.counts["copies"] += 1
        d.counts["peer_bytes"] += nbytes
        src_space, dst_space, device = self.ctx.space, dst_ctx.space, self.device

        def work() -> float:
            duration = device.peer_copy_duration(nbytes, b)     # first: a fault stops the copy
            dst_space.write(int(dst), src_space.read(int(src), nbytes))
            device.timeline.annotate(reads=[(int(src), int(src) + nbytes, "src")],
                                     writes=[(int(dst), int(dst) + nbytes, "dst")],
                                     bytes=nbytes, direction=f"peer {a}->{b}")
            return duration

        self._push(device.topology.egress(a, b), work, f"peer {a}->{b} {nbytes}B", "copy")

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
