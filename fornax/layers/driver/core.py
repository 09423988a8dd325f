"""The driver's core: its state, the family's facts and error table, device lookup and
the fault rules (which faults make a context sticky and which lose the device).

:class:`DriverCore` is the root of the shared driver policy; contexts
(:mod:`.context`), memory (:mod:`.memory`), modules (:mod:`.module`) and queues
(:mod:`.base`) build on it.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import numpy as np

from ...sim.device import Device
from ...sim.faults import PageFault, SimError
from ...sim.spec import ChipSpec
from ..errors import ErrorTable, FornaxError
from .kernel_log import KernelLog
from .managed import ManagedRegion
from .protocol import Context, DeviceProperties, Module

#: handles of contexts and modules, unique in the process
handles = itertools.count(0x1000)


def is_int(value: object) -> bool:
    """An integer address or size (numpy integers count; bools do not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


class DriverCore:
    """Shared driver state and rules.  Vendors subclass :class:`~.base.DriverBase`."""

    seam = "driver"
    vendor = "base"
    facts: dict[str, Any] = {}

    # -- vendor hooks -----------------------------------------------------
    def native_properties(self, device: Device, target: str) -> dict[str, Any]:
        """The device described in the family's own vocabulary (cudaDeviceProp-like)."""
        raise NotImplementedError

    # -- shared -------------------------------------------------------------
    def __init__(self, devices: list[Device]):
        d = self.facts["driver"]
        e = self.facts["errors"]
        self.errors = ErrorTable(e["api"], e["codes"], e["conditions"], seam="driver",
                                 vendor=self.vendor, hex=e.get("hex", False))
        self.calls: dict[str, str] = d["calls"]
        self.formats: dict[str, dict[str, Any]] = d["formats"]
        self.sticky_conditions: set[str] = set(e.get("sticky", ()))
        self.lost_conditions: set[str] = set(e.get("lost", ()))   # faults that lose the whole device
        self.lost: dict[int, FornaxError] = {}            # device index -> the error that lost it
        self.devices = list(devices)
        self.contexts: list[Context] = []                 # live contexts
        self.modules: dict[int, Module] = {}              # live modules by handle
        self.counts = {"contexts": 0, "modules_loaded": 0, "jit_compiles": 0, "il_builds": 0,
                       "launches": 0, "copies": 0, "h2d_bytes": 0, "d2h_bytes": 0, "d2d_bytes": 0,
                       "allocations": 0, "peer_bytes": 0}
        self.kernel_log = KernelLog()
        #: the profiling collector while a client subscribes to it (fornax.layers.profiler);
        #: None otherwise, and then launches and copies do no profiling work
        self.collector: Any = None
        self.counts["resets"] = 0
        self.peer_rule: str | None = d.get("peer", {}).get("rule")    # "explicit" or "query"
        self._peer_enabled: set[tuple[int, int]] = set()   # (context handle, peer context handle)
        self.module_load_s = 0.0
        # which context a call without one uses: "thread" (a per-thread stack, as cuCtx*),
        # "device" (the thread's device's primary context, as hipSetDevice) or "explicit"
        self.context_rule: str = d.get("contexts", {}).get("current", "explicit")
        self._tls = threading.local()
        self._primary: dict[int, Context] = {}
        self.managed_facts: dict[str, Any] = d.get("managed", {})
        self._managed: dict[int, ManagedRegion] = {}
        self.counts.update({"managed_migrations_h2d": 0, "managed_migrations_d2h": 0,
                            "managed_bytes_h2d": 0, "managed_bytes_d2h": 0,
                            "managed_faults": 0, "managed_prefetch_bytes": 0,
                            "managed_remote_bytes": 0})
        self.managed_migration_s = 0.0
        self.last_build_log = ""

    def fail(self, condition: str, message: str, *, call: str | None = None,
             hint: str | None = None, address: int | None = None) -> FornaxError:
        """The family's error for ``condition`` (its ``[errors.conditions]`` name)."""
        name = self.errors.faults.get(condition) or self.errors.faults["unknown"]
        op = self.calls.get(call, call) if call is not None else None
        return self.errors.error(name, message, op=op, hint=hint, address=address)

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
                self._code_name(lost), f"device {index} is unusable after an earlier error ({lost.message})",
                op=self.calls.get(call, call),
                hint=f"reset the device ({self.calls.get('reset', 'reset')})")

    def _code_name(self, err: FornaxError) -> str:
        """The family's code name an earlier error carried (every error this driver made
        carries one; the family's ``unknown`` code otherwise)."""
        return err.code.name if err.code is not None else self.errors.faults["unknown"]

    def is_lost(self, index: int) -> bool:
        """Whether device ``index`` is lost (every call fails until :meth:`reset`)."""
        dev = self._device(index, "reset")
        return index in self.lost or dev.lost is not None

    def check(self, ctx: Context, call: str) -> None:
        """Raise unless ``ctx`` is a live, usable context on a device that is not lost."""
        if not isinstance(ctx, Context) or not ctx.live:
            raise self.fail("invalid_context", "the context was destroyed or is not a context",
                            call=call)
        self._check_lost(ctx.device, call)
        if ctx.sticky is not None:
            raise self.errors.error(
                self._code_name(ctx.sticky),
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
        arch: dict[str, str] = self.facts["driver"]["arch"]
        return arch.get(dev.spec.name, arch["default"])

    def properties(self, index: int) -> DeviceProperties:
        dev = self._device(index, "device_get")
        target = self.target(index)
        native = self.native_properties(dev, target)
        part = dev.partition
        named = self.facts["driver"].get("partitions")
        if part is not None and named is not None and isinstance(native.get("name"), str):
            # a partition as the family names it ("<GPU name> MIG 3g.40gb")
            native["name"] = named["device_name"].format(name=native["name"], profile=part.profile,
                                                         label=part.label)
        return DeviceProperties(index, dev.spec.description, target, dev.spec.compute_units,
                                self.facts["driver"]["simd_width"], dev.spec.hbm_bytes, native)

    def loadable_formats(self, index: int) -> tuple[str, ...]:
        self._device(index, "device_get")
        return tuple(self.formats)

    def device_spec(self, index: int) -> ChipSpec:
        """The device's chip spec (what a library's autotuner prices candidate kernels with)."""
        return self._device(index, "device_get").spec

    def can_access_peer(self, index: int, peer: int) -> bool:
        """Whether device ``index`` can reach device ``peer``'s memory over a fabric."""
        dev = self._device(index, "can_access_peer")
        other = self._device(peer, "can_access_peer")
        return dev is not other and dev.topology is not None and dev.topology is other.topology
