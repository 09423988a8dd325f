"""Driver memory: allocation and free, peer access between contexts, managed memory
(migration on fault, prefetch accounting, remote access) and host access to
host-visible memory."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from ...sim.device import Device
from ...sim.faults import PageFault, SimError
from ...sim.memory import AddressSpace, Mapping, MemoryKind
from .context import ContextRules
from .core import is_int
from .managed import ManagedRegion, migrate, overlapping
from .protocol import Context, HostData


class DriverMemory(ContextRules):
    """Allocation, peer access, managed memory and host access."""

    # -- peer access ----------------------------------------------------------
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

    # -- allocation -----------------------------------------------------------
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
                                 "free buffers or use a larger "
                                 + ("partition" if ctx.device.partition is not None else "spec")) from None
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
    def _host_accessible(self, ctx: Context, address: int, nbytes: int, call: str) -> Mapping:
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
            features: str = self.facts["driver"].get("arch_features", {}).get(target, "")
            if need not in features.split(":"):
                return str(m.get("without_feature", "remote"))
        return str(m.get("device_access", "migrate"))

    def _regions(self, space: AddressSpace, lo: int,
                 hi: int) -> Iterator[tuple[ManagedRegion, int, int]]:
        return overlapping(self._managed.values(), space, lo, hi)

    def _migrate(self, region: ManagedRegion, lo: int, hi: int, to_device: bool) -> tuple[int, int]:
        """Move the granules of ``[lo, hi)`` (offsets in the region); (granules, bytes) moved."""
        granules, nbytes = migrate(region, lo, hi, to_device)
        if granules:
            key = "h2d" if to_device else "d2h"
            self.counts[f"managed_migrations_{key}"] += granules
            self.counts[f"managed_bytes_{key}"] += nbytes
        return granules, nbytes

    def managed_device_access(self, device: Device, space: AddressSpace,
                              ranges: Iterable[tuple[int, int]]) -> float:
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
                latency: float = self.managed_facts.get("fault_latency_s", 0.0)
                t = faults * latency + nbytes / spec.host_link_bandwidth
                self.managed_migration_s += t
                extra += t
        return extra

    # -- host access ----------------------------------------------------------
    def host_read(self, ctx: Context | None, address: int, nbytes: int) -> bytes:
        """The host dereferences managed or host-pinned memory (device-resident managed
        pages migrate back first where the family migrates).  Reads committed memory:
        synchronise with device work first, as on a real system."""
        ctx = self.resolve_context(ctx, "host_access")
        self.check(ctx, "host_access")
        self._host_accessible(ctx, address, nbytes, "host_access")
        self._host_touch(ctx, int(address), int(nbytes))
        return ctx.space.read(int(address), int(nbytes))

    def host_write(self, ctx: Context | None, address: int, data: HostData) -> None:
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
                latency: float = self.managed_facts.get("fault_latency_s", 0.0)
                t = faults * latency + moved / ctx.device.spec.host_link_bandwidth
                self.managed_migration_s += t
                ctx.device.timeline.host_time += t     # the host stalls while pages come back
