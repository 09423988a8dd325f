"""xpu-like driver: Level-Zero-style command lists, command queues, event pools and fences.

Work is recorded into a command list; a regular list must be closed and
then executed on a command queue, with an optional fence the host can wait
on (fences are host-wait only).  An immediate command list executes each
command as it is appended — that is the queue the runtime seam uses.
A regular list without the in-order flag only orders the START of its
commands: the command queue spreads them over several hardware queues, so
without a barrier or an event two of them may overlap and complete out of
order (and the race detector says so).  Events come from an event pool and are never reset automatically: an event
signalled in an earlier execution still reads as signalled until the host
resets it, so re-executing a list without resetting its events lets a wait
pass at once.
"""

from __future__ import annotations

import numpy as np

from ...layers.binary import ContainerError, KernelBinary, unpack_container, unpack_records
from ...layers.driver import Context, DriverBase, QueueBase
from ...sim import isa
from ...sim.device import Device
from ...sim.faults import InvalidProgram, SimError
from ...sim.timeline import Packet, Semaphore
from .facts import FACTS
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
    """A regular command list: record, close, then execute on a command queue.

    Without ``in_order`` (ZE_COMMAND_LIST_FLAG_IN_ORDER) Level Zero only promises that the
    list's commands START in order: two commands with no barrier or event between them may
    run at the same time and complete in either order.  With it they run one after another.
    """

    def __init__(self, driver: "XpuLikeDriver", ctx: Context, in_order: bool = False):
        self.driver, self.ctx = driver, ctx
        self.in_order = bool(in_order)
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

    def append_memory_copy(self, dst, src, nbytes: int | None = None, signal: Event | None = None,
                           waits: tuple[Event, ...] = ()) -> None:
        """zeCommandListAppendMemoryCopy: device addresses or host arrays on either side."""
        self._append(("copy", dst, src, nbytes, signal, tuple(waits)))

    def append_memory_prefetch(self, address: int, nbytes: int) -> None:
        """zeCommandListAppendMemoryPrefetch: migrate shared memory to the device ahead of use."""
        self._append(("prefetch", address, nbytes, None, ()))

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
    """A command queue on one engine group; executes closed command lists.

    It owns ``[driver] command_queue_lanes`` hardware queues.  An in-order list runs on the
    first; a list without the in-order flag spreads its commands over all of them, each
    command starting only after the previous one started (a start semaphore that orders
    start times and nothing else), so a kernel and a copy after it may overlap.  Lists run
    one after another, and a barrier or an event orders commands within a list.
    """

    def __init__(self, driver: "XpuLikeDriver", ctx: Context):
        self.driver, self.ctx = driver, ctx
        self.lanes = [ImmediateCommandList(driver, ctx)
                      for _ in range(max(1, int(FACTS["driver"].get("command_queue_lanes", 1))))]
        self.lane = self.lanes[0]
        self.started = Semaphore("ze_cq_start")
        self._starts = 0

    def _join(self) -> list[tuple[Semaphore, int]]:
        """Completion of everything already on this queue's lanes."""
        return [(m.sem, m.value) for m in (lane.record() for lane in self.lanes) if m.value]

    def execute(self, lists: list[CommandList], fence: Fence | None = None) -> None:
        for cl in lists:
            if not isinstance(cl, CommandList) or not cl.closed:
                raise self.driver.fail("invalid_value", "a command list must be closed before it is "
                                       "executed", call="execute")
        for cl in lists:
            if cl.in_order:
                self.lane._pending_waits.extend(self._join())
                for cmd in cl.commands:
                    self.lane.run_command(cmd)
            else:
                self._run_unordered(cl)
        if fence is not None:
            fence.target += 1
            self.lane._pending_waits.extend(self._join())
            self.lane._push("compute", lambda: 0.0, "fence", "barrier",
                            also_signal=[(fence.sem, fence.target)])

    def create_fence(self) -> Fence:
        return Fence(self)

    def _run_unordered(self, cl: CommandList) -> None:
        join = self._join()                    # the list starts after the queue's earlier work
        need_join = set(range(len(self.lanes)))
        list_waits: list[tuple[Semaphore, int]] = []
        slot = 0
        for cmd in cl.commands:
            kind = cmd[0]
            if kind == "barrier":
                join, need_join = self._join(), set(range(len(self.lanes)))
                continue
            if kind == "wait":
                list_waits.extend((ev.sem, ev.epoch) for ev in cmd[1])
                continue
            if kind == "signal":               # after every earlier command of the list
                self.lane._pending_waits.extend(self._join())
                self.lane.signal_event(cmd[1])
                continue
            index = slot % len(self.lanes)
            slot += 1
            lane = self.lanes[index]
            if index in need_join:
                lane._pending_waits.extend(join)
                need_join.discard(index)
            lane._pending_waits.extend(list_waits)
            if self._starts:
                lane._pending_waits.append((self.started, self._starts))   # start order only
            self._starts += 1
            lane._start_signal = (self.started, self._starts)
            lane.run_command(cmd)


class ImmediateCommandList(QueueBase):
    """An in-order immediate command list: each appended command executes at once."""

    flavour = "immediate-command-list"
    _start_signal: tuple | None = None

    def _submit(self, packet: Packet) -> None:
        if self._start_signal is not None:
            packet.start_signals.append(self._start_signal)
            self._start_signal = None
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
        elif kind == "copy":
            _, dst, src, nbytes, signal, waits = cmd
            for ev in waits:
                self._pending_waits.append((ev.sem, ev.epoch))
            if isinstance(src, np.ndarray):
                self.copy_h2d(dst, src)
            elif isinstance(dst, np.ndarray):
                self.copy_d2h(dst, src)
            else:
                self.copy_d2d(dst, src, nbytes)
            if signal is not None:
                self.signal_event(signal)
        elif kind == "prefetch":
            self.prefetch(cmd[1], cmd[2])
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

    def append_memory_prefetch(self, address: int, nbytes: int) -> None:
        """zeCommandListAppendMemoryPrefetch on the immediate list."""
        self.prefetch(address, nbytes)


class XpuLikeDriver(DriverBase):
    vendor = FACTS["name"]
    facts = FACTS
    queue_class = ImmediateCommandList

    def decode_image(self, binary: KernelBinary) -> dict[str, isa.Program]:
        # building the IL: every kernel is decoded and verified; the failures are the build log
        magic = SPIRV_MAGIC if binary.format == "spirv-like" else ZEBIN_MAGIC
        header, payload = unpack_container(magic, binary.data)
        expected = IL_TARGET if binary.format == "spirv-like" else header.get("device")
        if binary.target != expected:
            raise ContainerError(f"{binary.format} module is for {expected}, tag says {binary.target}")
        kernels, errors = {}, []
        for record in unpack_records(payload):
            try:
                program = isa.decode(record)
            except InvalidProgram as exc:
                errors.append(f"error: {exc}")
                continue
            kernels[program.name] = program
        if errors:
            raise InvalidProgram("\n".join(errors))
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
    def create_command_list(self, ctx: Context, in_order: bool = False) -> CommandList:
        """zeCommandListCreate; ``in_order`` is ZE_COMMAND_LIST_FLAG_IN_ORDER."""
        self.check(ctx, "create_queue")
        return CommandList(self, ctx, in_order)

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
