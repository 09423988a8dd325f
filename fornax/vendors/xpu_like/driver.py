"""xpu-like driver: Level-Zero-style command lists, command queues, event pools and fences.

Work is recorded into a command list; a regular list must be closed and
then executed on a command queue, with an optional fence the host can wait
on (fences are host-wait only).  An immediate command list executes each
command as it is appended — that is the queue the runtime seam uses.
Events come from an event pool and are never reset automatically: an event
signalled in an earlier execution still reads as signalled until the host
resets it, so re-executing a list without resetting its events lets a wait
pass at once.
"""

from __future__ import annotations

from ...layers.binary import ContainerError, KernelBinary, unpack_programs
from ...layers.driver import Context, DriverBase, QueueBase
from ...sim import isa
from ...sim.device import Device
from ...sim.faults import SimError
from ...sim.timeline import Packet, Semaphore
from . import FACTS
from .compiler import IL_TARGET, SPIRV_MAGIC, ZEBIN_MAGIC


class Event:
    """A pool event over a timeline semaphore; signalled state survives until a host reset."""

    def __init__(self, pool: "EventPool", index: int):
        self.pool = pool
        self.index = index
        self.sem = Semaphore(f"ze_event{index}")
        self.epoch = 1                      # the semaphore value meaning "signalled now"

    def host_reset(self) -> None:
        self.epoch = self.sem.value + 1

    def query(self) -> bool:
        return self.sem.value >= self.epoch

    def host_synchronize(self) -> None:
        self.pool.driver._host_wait(self.pool.ctx, self.sem, self.epoch, "event")


class EventPool:
    def __init__(self, driver: "XpuLikeDriver", ctx: Context, count: int):
        if count <= 0:
            raise driver.fail("invalid_value", f"event pool size must be positive, got {count}",
                              call="event")
        self.driver, self.ctx = driver, ctx
        self.events = [Event(self, i) for i in range(count)]

    def event(self, index: int) -> Event:
        if not 0 <= index < len(self.events):
            raise self.driver.fail("invalid_value", f"event index {index} outside the pool "
                                   f"(0..{len(self.events) - 1})", call="event")
        return self.events[index]


class Fence:
    """Host-only completion of one command-queue execution."""

    def __init__(self, queue: "CommandQueue"):
        self.queue = queue
        self.sem = Semaphore("ze_fence")
        self.target = 0

    def host_synchronize(self) -> None:
        self.queue.driver._host_wait(self.queue.ctx, self.sem, self.target, "fence")


class CommandList:
    """A regular command list: record, close, then execute on a command queue."""

    def __init__(self, driver: "XpuLikeDriver", ctx: Context):
        self.driver, self.ctx = driver, ctx
        self.commands: list[tuple] = []
        self.closed = False

    def _append(self, cmd: tuple) -> None:
        if self.closed:
            raise self.driver.fail("invalid_value", "the command list is closed; reset it to record again",
                                   call="launch")
        self.commands.append(cmd)

    def append_launch(self, module, entry: str, grid, args: dict, signal: Event | None = None,
                      waits: tuple[Event, ...] = ()) -> None:
        self._append(("launch", module, entry, grid, dict(args), signal, tuple(waits)))

    def append_signal_event(self, event: Event) -> None:
        self._append(("signal", event))

    def append_wait_on_events(self, *events: Event) -> None:
        self._append(("wait", events))

    def append_barrier(self) -> None:
        self._append(("barrier",))

    def close(self) -> None:
        self.closed = True

    def reset(self) -> None:
        self.commands, self.closed = [], False


class CommandQueue:
    """A command queue on one engine group; executes closed command lists."""

    def __init__(self, driver: "XpuLikeDriver", ctx: Context):
        self.driver, self.ctx = driver, ctx
        self.lane = ImmediateCommandList(driver, ctx)

    def execute(self, lists: list[CommandList], fence: Fence | None = None) -> None:
        for cl in lists:
            if not cl.closed:
                raise self.driver.fail("invalid_value", "a command list must be closed before it is "
                                       "executed", call="execute")
        for cl in lists:
            for cmd in cl.commands:
                self.lane.run_command(cmd)
        if fence is not None:
            fence.target += 1
            self.lane._push("compute", lambda: 0.0, "fence", "barrier",
                            also_signal=[(fence.sem, fence.target)])

    def create_fence(self) -> Fence:
        return Fence(self)


class ImmediateCommandList(QueueBase):
    """An in-order immediate command list: each appended command executes at once."""

    flavour = "immediate-command-list"

    def _submit(self, packet: Packet) -> None:
        self.hwq.submit(packet)

    def run_command(self, cmd: tuple) -> None:
        kind = cmd[0]
        if kind == "launch":
            _, module, entry, grid, args, signal, waits = cmd
            for ev in waits:
                self._pending_waits.append((ev.sem, ev.epoch))
            self.launch(module, entry, grid, args)
            if signal is not None:
                self.signal_event(signal)
        elif kind == "signal":
            self.signal_event(cmd[1])
        elif kind == "wait":
            for ev in cmd[1]:
                self._pending_waits.append((ev.sem, ev.epoch))
        elif kind == "barrier":
            self._push("compute", lambda: 0.0, "barrier", "barrier")

    def signal_event(self, event: Event) -> None:
        """zeCommandListAppendSignalEvent: set the event when earlier work completes."""
        self._push("compute", lambda: 0.0, f"signal event {event.index}", "barrier",
                   also_signal=[(event.sem, event.epoch)])


class XpuLikeDriver(DriverBase):
    vendor = "xpu-like"
    facts = FACTS
    queue_class = ImmediateCommandList

    def decode_image(self, binary: KernelBinary) -> dict[str, isa.Program]:
        # building the IL: every kernel is decoded and verified; a failure is the build log
        magic = SPIRV_MAGIC if binary.format == "spirv-like" else ZEBIN_MAGIC
        header, kernels = unpack_programs(magic, binary.data)
        expected = IL_TARGET if binary.format == "spirv-like" else header.get("device")
        if binary.target != expected:
            raise ContainerError(f"{binary.format} module is for {expected}, tag says {binary.target}")
        return kernels

    def native_properties(self, device: Device, target: str) -> dict:
        s = device.spec
        return {"name": f"fornax {s.name} ({target})", "type": "ZE_DEVICE_TYPE_GPU",
                "deviceId": FACTS["driver"]["device_ids"].get(target, "0x0000"),
                "numSlices": 1, "numSubslicesPerSlice": s.compute_units,
                "subGroupSizes": FACTS["driver"]["sub_group_sizes"],
                "maxTotalGroupSize": s.max_group_size, "maxMemAllocSize": s.hbm_bytes,
                "coreClockRate": int(s.clock_ghz * 1000)}

    # -- Level Zero objects beyond the runtime's immediate list ------------------------
    def create_command_list(self, ctx: Context) -> CommandList:
        self.check(ctx, "create_queue")
        return CommandList(self, ctx)

    def create_command_queue(self, ctx: Context) -> CommandQueue:
        self.check(ctx, "create_queue")
        return CommandQueue(self, ctx)

    def create_event_pool(self, ctx: Context, count: int) -> EventPool:
        self.check(ctx, "event")
        return EventPool(self, ctx, count)

    def _host_wait(self, ctx: Context, sem: Semaphore, value: int, call: str) -> None:
        self.check(ctx, call)
        try:
            ctx.device.timeline.wait(sem, value)
        except SimError as exc:
            raise self.fault(ctx, exc, call) from None
