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
import threading
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ..sim.device import Device
from ..sim.faults import InvalidProgram, PageFault, SimError
from ..sim.isa import Program
from ..sim.memory import AddressSpace, MemoryKind, defer
from ..sim.timeline import HardwareQueue, Packet, Semaphore
from ..sim.verify import IllTypedProgram, check_module
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
    entry: str = ""                  # a fat bundle's chosen image, "format:target"
    build_log: str = ""              # the JIT / IL build log (empty when the build said nothing)
    loaded: bool = True              # False once unloaded (or its context destroyed)


@dataclass(eq=False)
class ManagedRegion:
    """A managed (unified / shared USM) allocation and where each of its granules lives."""

    space: AddressSpace
    va: int
    size: int
    granule: int
    on_device: np.ndarray            # one bool per migration granule


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
    launch: int = 0          # the driver's launch number (counts["launches"] when it was launched)


class KernelLog(list):
    """The driver's kernel records, oldest first.  A long-lived process bounds it with
    ``limit``: past it the oldest half goes, and ``dropped``/``dropped_flops`` keep count,
    so :attr:`total` and :attr:`flops` still cover every kernel that ran."""

    def __init__(self, limit: int | None = None):
        super().__init__()
        self.limit = limit
        self.dropped = 0
        self.dropped_flops = 0.0

    def append(self, record: KernelRecord) -> None:
        super().append(record)
        if self.limit is not None and len(self) > self.limit:
            drop = len(self) - self.limit // 2
            self.dropped_flops += sum(r.flops for r in self[:drop])
            del self[:drop]
            self.dropped += drop

    @property
    def total(self) -> int:
        return self.dropped + len(self)

    @property
    def flops(self) -> float:
        return self.dropped_flops + sum(r.flops for r in self)


@runtime_checkable
class Queue(Protocol):
    """An ordered queue of device work (a stream, an AQL queue, a command list)."""

    flavour: str

    def launch(self, module: Module, entry: str, grid: tuple[int, int, int], args: dict) -> None: ...
    def copy_h2d(self, dst: int, src: np.ndarray, host_rate: float = 1.0) -> None: ...
    def copy_d2h(self, dst: np.ndarray, src: int, host_rate: float = 1.0) -> None: ...
    def copy_d2d(self, dst: int, src: int, nbytes: int) -> None: ...
    def copy_peer(self, dst_ctx: Context, dst: int, src: int, nbytes: int) -> None: ...
    def record(self) -> Marker: ...
    def wait(self, marker: Marker) -> None: ...
    def synchronize(self) -> None: ...


@runtime_checkable
class Driver(Protocol):
    """Devices, contexts, raw memory, modules and queues.  Errors carry the family's driver
    code; a fault the family makes sticky leaves its context unusable until destroyed, one
    that loses the device fails every call until :meth:`reset`.  ``counts``, ``kernel_log``
    and ``module_load_s`` are the statistics the report reads."""

    vendor: str
    counts: dict
    kernel_log: list
    module_load_s: float

    def device_count(self) -> int: ...
    def properties(self, index: int) -> DeviceProperties: ...
    def memory_info(self, index: int) -> tuple[int, int]: ...
    def loadable_formats(self, index: int) -> tuple[str, ...]: ...
    def create_context(self, index: int) -> Context: ...
    def destroy_context(self, ctx: Context) -> None: ...
    def allocate(self, ctx: Context, nbytes: int, kind: str = "device") -> int: ...
    def free(self, ctx: Context, address: int) -> None: ...
    def load_module(self, ctx: Context, binary: KernelBinary) -> Module: ...
    def host_read(self, ctx: Context, address: int, nbytes: int) -> bytes: ...
    def host_write(self, ctx: Context, address: int, data) -> None: ...
    def create_queue(self, ctx: Context) -> Queue: ...
    def synchronize(self, ctx: Context) -> None: ...
    def can_access_peer(self, index: int, peer: int) -> bool: ...
    def enable_peer_access(self, ctx: Context, peer_ctx: Context) -> None: ...
    def report(self) -> dict: ...
    def destroy_queue(self, queue: Queue) -> None: ...
    def unload_module(self, module: Module) -> None: ...
    def handles(self) -> dict[str, int]: ...
    def is_lost(self, index: int) -> bool: ...
    def reset(self, index: int) -> None: ...
    def target(self, index: int) -> str:
        """The device's arch name in the family's vocabulary (sm_90, gfx942, ...)."""
    def device_spec(self, index: int):
        """The simulated chip spec behind device ``index``."""
    def managed_policy(self, device) -> str:
        """How kernels reach managed memory: "migrate" or "remote"."""


def is_int(value) -> bool:
    """An integer address or size (numpy integers count; bools do not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


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
        self.contexts: list[Context] = []                 # live contexts
        self.modules: dict[int, Module] = {}              # live modules by handle
        self.counts = {"contexts": 0, "modules_loaded": 0, "jit_compiles": 0, "il_builds": 0,
                       "launches": 0, "copies": 0, "h2d_bytes": 0, "d2h_bytes": 0, "d2d_bytes": 0,
                       "allocations": 0, "peer_bytes": 0}
        self.kernel_log = KernelLog()
        self.counts["resets"] = 0
        self.peer_rule: str | None = d.get("peer", {}).get("rule")    # "explicit" or "query"
        self._peer_enabled: set[tuple[int, int]] = set()   # (context handle, peer context handle)
        self.module_load_s = 0.0
        # which context a call without one uses: "thread" (a per-thread stack, as cuCtx*),
        # "device" (the thread's device's primary context, as hipSetDevice) or "explicit"
        self.context_rule: str = d.get("contexts", {}).get("current", "explicit")
        self._tls = threading.local()
        self._primary: dict[int, Context] = {}
        self.managed_facts: dict = d.get("managed", {})
        self._managed: dict[int, ManagedRegion] = {}
        self.counts.update({"managed_migrations_h2d": 0, "managed_migrations_d2h": 0,
                            "managed_bytes_h2d": 0, "managed_bytes_d2h": 0,
                            "managed_faults": 0, "managed_prefetch_bytes": 0,
                            "managed_remote_bytes": 0})
        self.managed_migration_s = 0.0
        self.last_build_log = ""

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

    def is_lost(self, index: int) -> bool:
        """Whether device ``index`` is lost (every call fails until :meth:`reset`)."""
        dev = self._device(index, "reset")
        return index in self.lost or dev.lost is not None

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

    def memory_info(self, index: int) -> tuple[int, int]:
        """(free, total) bytes of device memory, as cuMemGetInfo reports them."""
        dev = self._device(index, "memory_info")
        return dev.memory.capacity - dev.memory.used, dev.memory.capacity

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

    def device_spec(self, index: int):
        """The device's chip spec (what a library's autotuner prices candidate kernels with)."""
        return self._device(index, "device_get").spec

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
        if self.context_rule == "thread":
            self._stack().append(ctx)          # cuCtxCreate makes the new context current
        return ctx

    def destroy_context(self, ctx: Context) -> None:
        if not isinstance(ctx, Context) or not ctx.live:
            raise self.fail("invalid_context", "context already destroyed", call="destroy_context")
        ctx.device.memory.destroy_space(ctx.space)
        ctx.live = False
        if ctx in self.contexts:
            self.contexts.remove(ctx)
        for module in [m for m in self.modules.values() if m.context is ctx]:
            module.loaded = False
            del self.modules[module.handle]
        for q in list(ctx.queues):
            q.destroyed = True
            q.device.timeline.remove_queue(q.hwq)
        ctx.queues.clear()
        stack = self._stack()
        if ctx in stack:
            stack.remove(ctx)                  # destroying a current context pops it
        self._managed = {va: r for va, r in self._managed.items() if r.space is not ctx.space}
        for other in self.contexts:
            other.space.revoke_peer(ctx.space)
        self._peer_enabled = {p for p in self._peer_enabled if ctx.handle not in p}

    # -- the current context ------------------------------------------------
    def _stack(self) -> list:
        stack = getattr(self._tls, "stack", None)
        if stack is None:
            stack = self._tls.stack = []
        return stack

    def _current_rule(self, call: str) -> None:
        if self.context_rule == "explicit":
            raise self.fail("not_supported", f"{self.facts['driver']['api']} has no current "
                            "context: every call takes its context", call=call,
                            hint="pass the context returned by create_context")

    def primary_context(self, index: int) -> Context:
        """The device's primary context (created on first use, again after a reset)."""
        ctx = self._primary.get(index)
        if ctx is None or not ctx.live:
            stack = self._stack()
            ctx = self.create_context(index)
            if self.context_rule == "thread" and stack and stack[-1] is ctx:
                stack.pop()                    # retaining a primary context does not push it
            self._primary[index] = ctx
        return ctx

    def set_device(self, index: int) -> Context:
        """Make device ``index``'s primary context this thread's current one
        (``[driver.calls] set_device``: hipSetDevice; cudaSetDevice over the driver API)."""
        self._current_rule("set_device")
        self._device(index, "set_device")
        ctx = self.primary_context(index)
        self._tls.device = index
        stack = self._stack()
        if self.context_rule == "thread":
            if stack:
                stack[-1] = ctx
            else:
                stack.append(ctx)
        else:
            stack.clear()
        return ctx

    def set_current(self, ctx: Context | None) -> None:
        """cuCtxSetCurrent: replace the top of this thread's stack (None pops it)."""
        self._current_rule("set_current")
        stack = self._stack()
        if ctx is None:
            if stack:
                stack.pop()
            return
        self.check(ctx, "set_current")
        if stack:
            stack[-1] = ctx
        else:
            stack.append(ctx)

    def get_current(self) -> Context | None:
        """cuCtxGetCurrent: this thread's current context, or None (not an error)."""
        self._current_rule("get_current")
        stack = self._stack()
        if stack:
            return stack[-1]
        if self.context_rule == "device":
            return self.primary_context(getattr(self._tls, "device", 0))
        return None

    def push_current(self, ctx: Context) -> None:
        self._current_rule("push_current")
        self.check(ctx, "push_current")
        self._stack().append(ctx)

    def pop_current(self) -> Context:
        self._current_rule("pop_current")
        stack = self._stack()
        if not stack:
            raise self.fail("invalid_context", "this thread's context stack is empty",
                            call="pop_current")
        return stack.pop()

    def resolve_context(self, ctx: Context | None, call: str) -> Context:
        """The context a call works in: the one given, else the family's current context."""
        if ctx is not None:
            return ctx
        if self.context_rule == "thread":
            stack = self._stack()
            if not stack:
                raise self.fail("invalid_context", "no context is current to the calling thread",
                                call=call, hint=f"create one ({self.calls.get('create_context')}) "
                                f"or make one current ({self.calls.get('set_current')})")
            return stack[-1]
        if self.context_rule == "device":
            stack = self._stack()
            return stack[-1] if stack else self.primary_context(getattr(self._tls, "device", 0))
        raise self.fail("invalid_context", f"no context given; {self.facts['driver']['api']} "
                        "passes a context to every call", call=call,
                        hint="pass the context returned by create_context")

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

    def allocate(self, ctx: Context | None, nbytes: int, kind: str = "device") -> int:
        ctx = self.resolve_context(ctx, "allocate")
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
        if mem_kind is MemoryKind.MANAGED:
            granule = int(self.managed_facts.get("granularity", ctx.device.spec.page_size))
            self._managed[mapping.va] = ManagedRegion(ctx.space, mapping.va, int(nbytes), granule,
                                                      np.zeros(-(-int(nbytes) // granule), bool))
        return mapping.va

    def free(self, ctx: Context | None, address: int) -> None:
        ctx = self.resolve_context(ctx, "free")
        self.check(ctx, "free")
        if not is_int(address):
            raise self.fail("invalid_value", f"free takes a device address, got {address!r}", call="free")
        try:
            ctx.space.unmap(address)
            self._managed.pop(address, None)
        except PageFault as exc:
            raise self.fail("invalid_value", f"{address:#x} is not the start of a live allocation "
                            f"({exc.detail})", call="free", address=address) from None

    # -- managed memory -------------------------------------------------------
    def _host_accessible(self, ctx: Context, address: int, nbytes: int, call: str):
        try:
            mapping, _ = ctx.space.resolve(int(address), int(nbytes), "host")
        except PageFault as exc:
            raise self.fail("invalid_value", f"host access of {nbytes} bytes at {int(address):#x} is "
                            f"outside any allocation: {exc.detail}", call=call,
                            address=int(address)) from None
        if mapping.kind is MemoryKind.DEVICE:
            raise self.fail("invalid_value", f"{mapping.describe()} is device memory, which the host "
                            "cannot dereference", call=call, address=int(address),
                            hint="allocate it managed or host_pinned, or copy it through a queue")
        return mapping

    def managed_policy(self, device: Device) -> str:
        """How the family's device reaches managed memory: "migrate" (pages move to the
        device on first access) or "remote" (they stay on the host and are read over the
        host link).  ``[driver.managed] device_access``; a family whose migration needs a
        target feature (XNACK) names it in ``requires_feature`` and the fallback in
        ``without_feature``."""
        m = self.managed_facts
        need = m.get("requires_feature")
        if need:
            target = self.target(self.devices.index(device))
            features = self.facts["driver"].get("arch_features", {}).get(target, "")
            if need not in features.split(":"):
                return m.get("without_feature", "remote")
        return m.get("device_access", "migrate")

    def _regions(self, space: AddressSpace, lo: int, hi: int):
        for r in self._managed.values():
            if r.space is space and r.va < hi and lo < r.va + r.size:
                yield r, max(lo, r.va) - r.va, min(hi, r.va + r.size) - r.va

    def _migrate(self, region: ManagedRegion, lo: int, hi: int, to_device: bool) -> tuple[int, int]:
        """Move the granules of ``[lo, hi)`` (offsets in the region); (granules, bytes) moved."""
        g = region.granule
        sel = slice(lo // g, -(-hi // g))
        moving = np.flatnonzero(region.on_device[sel] != to_device) + sel.start
        if moving.size == 0:
            return 0, 0
        region.on_device[moving] = to_device
        nbytes = int(sum(min(g, region.size - i * g) for i in moving.tolist()))
        key = "h2d" if to_device else "d2h"
        self.counts[f"managed_migrations_{key}"] += int(moving.size)
        self.counts[f"managed_bytes_{key}"] += nbytes
        return int(moving.size), nbytes

    def managed_device_access(self, device: Device, space: AddressSpace, ranges) -> float:
        """Device work touched ``ranges`` ((lo, hi) byte spans): the extra simulated time
        managed memory costs it (migrations on fault, or remote access over the host link)."""
        if not self._managed:
            return 0.0
        policy, spec, extra = self.managed_policy(device), device.spec, 0.0
        for lo, hi in ranges:
            for region, a, b in self._regions(space, lo, hi):
                if policy == "remote":
                    self.counts["managed_remote_bytes"] += b - a
                    extra += (b - a) / spec.host_link_bandwidth
                    continue
                faults, nbytes = self._migrate(region, a, b, True)
                self.counts["managed_faults"] += faults
                t = faults * self.managed_facts.get("fault_latency_s", 0.0) + nbytes / spec.host_link_bandwidth
                self.managed_migration_s += t
                extra += t
        return extra

    def host_read(self, ctx: Context | None, address: int, nbytes: int) -> bytes:
        """The host dereferences managed or host-pinned memory (device-resident managed
        pages migrate back first where the family migrates).  Reads committed memory:
        synchronise with device work first, as on a real system."""
        ctx = self.resolve_context(ctx, "host_access")
        self.check(ctx, "host_access")
        self._host_accessible(ctx, address, nbytes, "host_access")
        self._host_touch(ctx, int(address), int(nbytes))
        return ctx.space.read(int(address), int(nbytes))

    def host_write(self, ctx: Context | None, address: int, data) -> None:
        ctx = self.resolve_context(ctx, "host_access")
        self.check(ctx, "host_access")
        raw = np.ascontiguousarray(data).tobytes() if isinstance(data, np.ndarray) else bytes(data)
        self._host_accessible(ctx, address, len(raw), "host_access")
        self._host_touch(ctx, int(address), len(raw))
        ctx.space.write(int(address), raw)

    def _host_touch(self, ctx: Context, address: int, nbytes: int) -> None:
        if self.managed_policy(ctx.device) != "migrate":
            return
        for region, a, b in list(self._regions(ctx.space, address, address + nbytes)):
            faults, moved = self._migrate(region, a, b, False)
            if faults:
                t = faults * self.managed_facts.get("fault_latency_s", 0.0) + \
                    moved / ctx.device.spec.host_link_bandwidth
                self.managed_migration_s += t
                ctx.device.timeline.host_time += t     # the host stalls while pages come back

    # -- modules ------------------------------------------------------------
    def load_module(self, ctx: Context | None, binary: KernelBinary) -> Module:
        ctx = self.resolve_context(ctx, "load_module")
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
        if rule["rule"] == "bundle":
            return self._load_bundle(ctx, binary, device_target)
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
        if how != "loaded":
            cost = rule.get("build_s_per_kib", 0.0) * len(binary.data) / 1024 + rule.get("build_s", 0.0)
            self.counts["jit_compiles" if how == "jit" else "il_builds"] += 1
            self.module_load_s += cost         # a build that fails has still taken its time
        try:
            kernels = check_module(self.decode_image(binary))    # ill-typed tiles: a build error
        except (ContainerError, InvalidProgram, UnicodeDecodeError) as exc:
            condition = "build_failure" if how in ("jit", "built") else "corrupt_image"
            log = f"{binary.format} build for {device_target} failed: {exc}"
            self.last_build_log = log if how != "loaded" or isinstance(exc, IllTypedProgram) else ""
            err = self.fail(condition, f"{binary.format} image rejected: {exc}", call="load_module",
                            hint="read the error's build_log" if self.last_build_log else
                            "the binary is corrupt or was not produced for this format")
            err.build_log = self.last_build_log
            raise err from None
        self.last_build_log = ""
        self.counts["modules_loaded"] += 1
        module = Module(next(_handles), ctx, binary, kernels, cost, how)
        self.modules[module.handle] = module
        return module

    def unload_module(self, module: Module) -> None:
        """Unload a module (``[driver.calls] unload_module``): its kernels can no longer be
        launched; work already submitted still runs."""
        if not isinstance(module, Module) or not module.loaded:
            raise self.fail("invalid_handle", "the module was already unloaded or is not a module",
                            call="unload_module")
        if not module.context.live:
            raise self.fail("invalid_context", "the module's context was destroyed",
                            call="unload_module")
        module.loaded = False
        self.modules.pop(module.handle, None)

    def build_log(self) -> str:
        """The log of the last JIT / IL build (zeModuleBuildLogGetString-like); empty if it passed."""
        return self.last_build_log

    def unbundle(self, binary: KernelBinary) -> list[KernelBinary]:
        """Vendor hook for ``bundle`` formats: the images a fat bundle holds."""
        raise NotImplementedError

    def _load_bundle(self, ctx: Context, binary: KernelBinary, device_target: str) -> Module:
        """A fat bundle: the exact image for the device if there is one, else the newest
        virtual image the device can JIT, else no binary for the device."""
        try:
            entries = self.unbundle(binary)
        except (ContainerError, UnicodeDecodeError, ValueError) as exc:
            raise self.fail("corrupt_image", f"{binary.format} image rejected: {exc}",
                            call="load_module", hint="the bundle is corrupt") from None
        def rule_of(e: KernelBinary) -> str | None:
            return self.formats.get(e.format, {}).get("rule")

        have = arch_number(device_target)
        exact = [e for e in entries if rule_of(e) == "exact" and e.target == device_target]
        virtual = sorted((e for e in entries if rule_of(e) == "virtual" and have is not None
                          and arch_number(e.target) is not None and arch_number(e.target) <= have),
                         key=lambda e: arch_number(e.target))
        chosen = exact[0] if exact else (virtual[-1] if virtual else None)
        if chosen is None:
            held = ", ".join(f"{e.format}:{e.target}" for e in entries) or "nothing"
            raise self.fail("no_binary_for_device", f"{binary.format} bundle holds {held}; none runs "
                            f"on {device_target}", call="load_module",
                            hint=f"rebuild the bundle with an image for {device_target} or an older "
                                 "virtual arch")
        module = self.load_module(ctx, chosen)
        module.binary, module.entry = binary, f"{chosen.format}:{chosen.target}"
        return module

    # -- queues ---------------------------------------------------------------
    def create_queue(self, ctx: Context | None) -> "QueueBase":
        ctx = self.resolve_context(ctx, "create_queue")
        self.check(ctx, "create_queue")
        return self.queue_class(self, ctx)

    def destroy_queue(self, queue: "QueueBase") -> None:
        """Release a queue (``[driver.calls] destroy_queue``).  Work already submitted still
        runs: the hardware queue retires once it has drained.  Later use is an error."""
        if not isinstance(queue, QueueBase) or queue.destroyed:
            raise self.fail("invalid_handle", "the queue was already destroyed or is not a queue",
                            call="destroy_queue")
        queue.destroyed = True
        queue._pending_waits = []          # waits with no command after them order nothing
        if queue in queue.ctx.queues:
            queue.ctx.queues.remove(queue)
        queue.release()
        queue.device.timeline.remove_queue(queue.hwq)

    def handles(self) -> dict[str, int]:
        """Live handles: contexts, queues, modules and memory mappings (device, pinned,
        managed and the queues' own) — all zero once everything is released."""
        return {"contexts": len(self.contexts),
                "queues": sum(len(c.queues) for c in self.contexts),
                "modules": len(self.modules),
                "mappings": sum(len(c.space.mappings()) for c in self.contexts)}

    def synchronize(self, ctx: Context | None) -> None:
        ctx = self.resolve_context(ctx, "synchronize")
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
            "kernels_executed": self.kernel_log.total,
            "module_load_s": self.module_load_s,
            "managed_migration_s": self.managed_migration_s,
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
        self.destroyed = False
        self.submitted = 0
        self._pending_waits: list[tuple[Semaphore, int]] = []
        #: share of the spec's launch latency charged to kernels dispatched now (the runtime
        #: lowers it while it replays a captured graph: one graph launch, cheap nodes)
        self.launch_scale = 1.0

    # -- vendor hooks -----------------------------------------------------------
    def _submit(self, packet: Packet) -> None:
        raise NotImplementedError

    def release(self) -> None:
        """The queue is destroyed: give back what the family's queue holds in its context
        (work already submitted has read everything it needs)."""

    def _push(self, engine: str, work, label: str, kind: str, also_signal=()) -> None:
        # ``submitted`` counts a packet only once it is on the hardware queue: the garbage
        # collector can run a finaliser while the packet is built or submitted, and a free
        # that synchronises waits for ``submitted`` (which must not name this packet yet)
        if self.destroyed:
            raise self.driver.fail("invalid_handle", f"{self.flavour} {self.hwq.id} was destroyed",
                                   call="destroy_queue", hint="create a new queue")
        value = self.submitted + 1
        waits, self._pending_waits = self._pending_waits, []
        packet = Packet(engine, work, label, kind, waits=waits, signals=[(self.sem, value), *also_signal])
        self._submit(packet)
        self.submitted = value

    # -- work -------------------------------------------------------------------
    def launch(self, module: Module, entry: str, grid, args: dict) -> None:
        d = self.driver
        d.check(self.ctx, "launch")
        if not isinstance(module, Module) or module.context is not self.ctx or not module.loaded:
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
        self._dispatch(program, entry, grid, dict(args))

    def _kernel_work(self, program: Program, entry: str, grid: tuple[int, int, int], args: dict):
        """The functional effect and cost of one kernel, run when its packet executes."""
        d, space, device = self.driver, self.ctx.space, self.device
        saved = 1.0 - self.launch_scale          # fixed at dispatch, like the launch path taken
        seq = d.counts["launches"]               # this launch's number (it runs later, in queue order)

        def work() -> float:
            counters, cost = device.run_kernel(space, program, grid, args)
            # migrations / remote reads of managed memory (none to look for without managed memory)
            extra = d.managed_device_access(
                device, space, [*counters.read_ranges.values(), *counters.write_ranges.values()]
            ) if d._managed else 0.0
            duration = cost.duration_s - saved * cost.launch_s
            flops = sum(counters.matrix_flops.values()) + sum(counters.vector_flops.values())
            d.kernel_log.append(KernelRecord(entry, grid, duration, flops,
                                             counters.bytes_read + counters.bytes_written, cost.bound,
                                             seq))
            device.timeline.annotate(
                reads=[(lo, hi, name) for name, (lo, hi) in counters.read_ranges.items()],
                writes=[(lo, hi, name) for name, (lo, hi) in counters.write_ranges.items()],
                grid=list(grid), flops=flops, bytes=counters.bytes_read + counters.bytes_written,
                bound=cost.bound)
            return duration + extra

        return work

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

    def _dispatch(self, program: Program, entry: str, grid: tuple[int, int, int], args: dict) -> None:
        """How a validated launch reaches the hardware; families may encode packets here."""
        self._push("compute", self._kernel_work(program, entry, grid, args), entry, "kernel")

    def check_marker(self, marker, call: str = "wait") -> Marker:
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

    def copy_h2d(self, dst: int, src: np.ndarray, host_rate: float = 1.0) -> None:
        """``host_rate``: share of the host link's bandwidth the host side sustains (1 for
        pinned memory; below 1 for pageable memory staged through a bounce buffer)."""
        d = self.driver
        d.check(self.ctx, "copy_h2d")
        meta = self.device.meta            # shape-only: priced and counted, no bytes move
        if not meta and not isinstance(src, np.ndarray):
            raise d.fail("invalid_value", f"the host source must be a numpy array, got "
                         f"{type(src).__name__}", call="copy_h2d")
        data = b"" if meta else np.ascontiguousarray(src).tobytes()  # staged at submit, as pageable memory is
        size = int(src.nbytes) if meta else len(data)
        self._check_range(dst, size, "copy_h2d")
        d.counts["copies"] += 1
        d.counts["h2d_bytes"] += size
        space, device = self.ctx.space, self.device

        def work() -> float:
            duration = device.copy_duration(size, "h2d")     # first: a fault stops the copy
            duration += (1.0 / host_rate - 1.0) * size / device.spec.host_link_bandwidth
            if not meta:
                space.write(int(dst), data)
            device.timeline.annotate(writes=[(int(dst), int(dst) + size, "dst")],
                                     bytes=size, direction="h2d")
            return duration

        self._push("copy", work, f"h2d {size}B", "copy")

    def copy_d2h(self, dst: np.ndarray, src: int, host_rate: float = 1.0) -> None:
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
            duration += (1.0 / host_rate - 1.0) * nbytes / device.spec.host_link_bandwidth
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
            if not device.meta:                                 # shape-only: priced, no bytes move
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
        self.check_marker(marker)
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
