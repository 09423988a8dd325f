"""rocm-like driver: HSA agents and user-mode AQL queues with doorbells and signals.

A launch is a real 64-byte AQL kernel-dispatch packet written into the
queue's ring buffer; ringing the doorbell makes the packet processor read
the packet bytes back, fetch the kernel object and its kernarg segment, and
put the dispatch on the hardware.  A stream wait is a barrier-AND packet
naming the signal to wait for.  Completion signals are HSA-style signals
over the shared timeline semaphore.
"""

from __future__ import annotations

import functools
import itertools
import struct

import numpy as np

from ...layers.binary import ContainerError, KernelBinary, unpack_programs
from ...layers.driver import DriverBase, Marker, QueueBase
from ...sim import isa
from ...sim.device import Device
from ...sim.memory import MemoryKind
from ...sim.timeline import Packet
from .facts import FACTS
from .compiler import HSACO_MAGIC, triple

# hsa_kernel_dispatch_packet_t and hsa_barrier_and_packet_t, 64 bytes each
DISPATCH = struct.Struct("<HHHHHHIIIIIQQQQ")
BARRIER_AND = struct.Struct("<HHI5QQQ")
PACKET_TYPE_KERNEL_DISPATCH = 2
PACKET_TYPE_BARRIER_AND = 3
PACKET_SIZE = 64
HEADER_BARRIER = 1 << 8
_handles = itertools.count(0x10_0000)


def _kernarg_layout(program: isa.Program) -> struct.Struct:
    """The kernarg segment of ``program``: one 8-byte slot per parameter, an int64 for a
    pointer or an integer, a float64 otherwise."""
    return _layout(tuple(p.kind == "ptr" or p.dtype.startswith("int") for p in program.params))


@functools.lru_cache(maxsize=256)
def _layout(integers: tuple[bool, ...]) -> struct.Struct:
    return struct.Struct("<" + "".join("q" if i else "d" for i in integers))


class AqlQueue(QueueBase):
    """An HSA user-mode queue: a ring of AQL packets, a write index and a doorbell."""

    flavour = "aql-queue"

    def __init__(self, driver, ctx):
        super().__init__(driver, ctx)
        d = FACTS["driver"]
        self.slots = d["aql_queue_slots"]
        self.ring = np.zeros(self.slots * PACKET_SIZE, dtype=np.uint8)
        self.write_index = 0
        self.read_index = 0
        self.kernarg = ctx.space.map(d["kernarg_pool_bytes"], MemoryKind.HOST_PINNED, "kernarg pool")
        self._kernarg_next = 0
        self.kernel_objects: dict[int, tuple[isa.Program, str]] = {}
        self.signals: dict[int, tuple] = {}
        self.doorbells = 0

    # -- writing packets -----------------------------------------------------------
    def _write(self, raw: bytes) -> None:
        slot = self.write_index % self.slots
        self.ring[slot * PACKET_SIZE:(slot + 1) * PACKET_SIZE] = np.frombuffer(raw, np.uint8)
        self.write_index += 1
        self._ring_doorbell()

    def _kernargs(self, program: isa.Program, args: dict) -> int:
        layout = _kernarg_layout(program)
        raw = layout.pack(*(int(args[p.name]) if c == "q" else float(args[p.name])
                            for p, c in zip(program.params, layout.format[1:])))
        size = max(8, len(raw))
        if self._kernarg_next + size > self.kernarg.size:
            self._kernarg_next = 0                    # ring: packets are consumed at the doorbell
        addr = self.kernarg.va + self._kernarg_next
        self._kernarg_next += -(-size // 16) * 16
        self.ctx.space.write(addr, raw)
        return addr

    def _dispatch(self, program: isa.Program, entry: str, grid, args: dict) -> None:
        wg = int(program.meta.get("group_size", FACTS["driver"]["simd_width"]))
        sizes = [g * (wg if i == 0 else 1) for i, g in enumerate(grid)]
        if any(s >= 1 << 32 for s in sizes):
            raise self.driver.fail("invalid_value", f"grid {grid} x work-group {wg} overflows the "
                                   "32-bit AQL grid size", call="launch")
        kobj = next(_handles)
        self.kernel_objects[kobj] = (program, entry)
        signal = next(_handles)
        self.signals[signal] = ()
        header = PACKET_TYPE_KERNEL_DISPATCH | HEADER_BARRIER    # in-order, as a HIP stream is
        raw = DISPATCH.pack(header, 3, wg, 1, 1, 0, *sizes, 0, 0, kobj,
                            self._kernargs(program, args), 0, signal)
        self._write(raw)

    def wait(self, marker: Marker) -> None:
        self.check_marker(marker)
        handle = next(_handles)
        self.signals[handle] = (marker.sem, marker.value)
        self._write(BARRIER_AND.pack(PACKET_TYPE_BARRIER_AND | HEADER_BARRIER, 0, 0, handle, 0, 0, 0, 0, 0, 0))

    # -- the packet processor --------------------------------------------------------
    def _ring_doorbell(self) -> None:
        self.doorbells += 1
        while self.read_index < self.write_index:
            slot = self.read_index % self.slots
            raw = self.ring[slot * PACKET_SIZE:(slot + 1) * PACKET_SIZE].tobytes()
            self.read_index += 1
            kind = struct.unpack_from("<H", raw)[0] & 0xFF
            if kind == PACKET_TYPE_KERNEL_DISPATCH:
                f = DISPATCH.unpack(raw)
                wg, sizes, kobj, kernarg = f[2], f[6:9], f[11], f[12]
                program, entry = self.kernel_objects.pop(kobj)
                grid = (sizes[0] // wg, sizes[1], sizes[2])
                layout = _kernarg_layout(program)      # the kernarg segment, read in one go
                values = layout.unpack(self.ctx.space.read(kernarg, layout.size)) if layout.size else ()
                args = {p.name: v for p, v in zip(program.params, values)}
                self.signals.pop(f[14], None)
                self._push("compute", self._kernel_work(program, entry, grid, args), entry, "kernel")
            elif kind == PACKET_TYPE_BARRIER_AND:
                f = BARRIER_AND.unpack(raw)
                for handle in f[3:8]:
                    if handle:
                        self._pending_waits.append(self.signals.pop(handle))
                self._push("compute", lambda: 0.0, "barrier-and", "barrier")
            else:
                raise self.driver.fail("invalid_value", f"invalid AQL packet type {kind}", call="launch")

    def release(self) -> None:
        """hsa_queue_destroy: the kernarg pool goes with the queue (dispatches read their
        arguments when the packet processor took them)."""
        self.ctx.space.unmap(self.kernarg.va)

    def _submit(self, packet: Packet) -> None:
        # dispatches come from the packet processor; copies from the SDMA engines, ordered
        # behind the queue's earlier work through the same completion signal
        self.hwq.submit(packet)


class RocmLikeDriver(DriverBase):
    vendor = FACTS["name"]
    facts = FACTS
    queue_class = AqlQueue

    def decode_image(self, binary: KernelBinary) -> dict[str, isa.Program]:
        header, kernels = unpack_programs(HSACO_MAGIC, binary.data)
        if header.get("target") != triple(binary.target):
            raise ContainerError(f"code object is for {header.get('target')}, tag says {binary.target}")
        return kernels

    def native_properties(self, device: Device, target: str) -> dict:
        s = device.spec
        return {"name": f"fornax {s.name}", "gcnArchName": triple(target).split("--")[1],
                "multiProcessorCount": s.compute_units, "warpSize": FACTS["driver"]["simd_width"],
                "totalGlobalMem": s.hbm_bytes, "maxThreadsPerBlock": s.max_group_size,
                "sharedMemPerBlock": s.shared_memory_per_unit, "clockRate": int(s.clock_ghz * 1e6),
                "l2CacheSize": s.l2_bytes, "hsa_agent_type": "HSA_DEVICE_TYPE_GPU"}
