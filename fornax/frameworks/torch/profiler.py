"""``torch.profiler`` on fornax: per-ATen-op rows with the simulated device time.

What PyTorch 2.13 offers a backend written in Python: ``ProfilerActivity.PrivateUse1``
exists, and with it in ``activities`` the profiler sets ``use_device="fornax"`` and adds
the device columns (``Self fornax``, ``fornax total``) to its tables.  The times in those
columns come from ``KinetoEvent.privateuse1_elapsed_us()``, which is filled in by C++
profiler stubs (``torch::profiler::impl::registerPrivateUse1Methods``) that only a
compiled extension can register; a pure-Python backend gets the rows with their CPU
times and zero device time.

fornax fills the gap on the Python side.  While the profiler is on, every ATen op that
reaches the device is recorded with its host interval and the driver launch numbers of
the kernels it launched itself (kernels of nested ATen ops belong to those ops), and a
recorder subscribed to the stack's profiling collector (:mod:`fornax.layers.profiler`,
the one CUPTI-like / rocprofiler-like / Level Zero tracer-like interfaces feed on) takes
each kernel's activity record as it runs.  When PyTorch parses the trace, each such kernel
is attached to the op's ``FunctionEvent`` with its simulated duration
(``FunctionEvent.append_kernel``, the hook PyTorch uses for CUDA kernels), so
``prof.key_averages()`` and ``prof.events()`` carry device time per op:

    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as p:
        model(x)
    p.key_averages().table(sort_by="self_device_time_total")

The device time is simulated time from the cost model, not host wall time.  Work still
queued when the profiler parses is waited for first (a host synchronisation).  Kineto's
Chrome trace export is written by C++ from its own events and shows no fornax kernels;
``fornax compose --trace`` writes the simulated timeline.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

import torch.autograd.profiler as _autograd_profiler

from ...layers.profiler import Recorder

_FLAG = "_fornax_profiler_patched"
_LOCK = threading.Lock()
_RECORDS: list["_Frame"] = []
#: id(driver) -> the recorder of its collector while a profile is on (stopped at the parse)
_RECORDERS: dict[int, Recorder] = {}
_STACK = threading.local()
#: records kept at most while no profile is parsed (a profiler left running does not grow
#: without bound: the oldest records are dropped)
MAX_RECORDS = 200_000


class _Kernel(Protocol):
    """What the profiler reads of a kernel's activity record."""

    @property
    def name(self) -> str: ...
    @property
    def duration_s(self) -> float: ...
    @property
    def flops(self) -> float: ...
    @property
    def launch(self) -> int: ...


class _Frame:
    __slots__ = ("name", "t0", "t1", "cursor", "launches", "driver", "device")

    def __init__(self, name: str, driver, device: int):
        self.name = name
        self.driver = driver
        self.device = device
        self.t0 = time.perf_counter_ns()
        self.t1 = self.t0
        self.cursor = driver.counts["launches"]
        self.launches: list[tuple[int, int]] = []     # (first, last] launch numbers of its own


def enabled() -> bool:
    """Is a torch profiler on (PyTorch's own fast flag)?"""
    return _autograd_profiler._is_profiler_enabled


def run(session, op, fn, args, kwargs):
    """Run ``fn(session, op, args, kwargs)`` (the router) recording ``op`` for the profiler."""
    stack = getattr(_STACK, "frames", None)
    if stack is None:
        stack = _STACK.frames = []
    driver = session.stack.driver
    if id(driver) not in _RECORDERS:
        with _LOCK:
            if id(driver) not in _RECORDERS:           # kernels only: the ops give the host side
                _RECORDERS[id(driver)] = Recorder(session.runtime, limit=MAX_RECORDS, api=False).start()
    frame = _Frame(op._schema.name, driver, 0)         # the process's one device, fornax:0
    parent = stack[-1] if stack else None
    if parent is not None and parent.driver is driver:
        parent.launches.append((parent.cursor, frame.cursor))
    stack.append(frame)
    try:
        return fn(session, op, args, kwargs)
    finally:
        stack.pop()
        now = driver.counts["launches"]
        frame.launches.append((frame.cursor, now))
        frame.t1 = time.perf_counter_ns()
        if parent is not None and parent.driver is driver:
            parent.cursor = now
        frame.launches = [(a, b) for a, b in frame.launches if b > a]
        if frame.launches:
            with _LOCK:
                _RECORDS.append(frame)
                if len(_RECORDS) > MAX_RECORDS:
                    del _RECORDS[: len(_RECORDS) - MAX_RECORDS]


def _kernels(frames: list[_Frame]) -> dict[tuple[int, int], _Kernel]:
    """(driver id, launch number) -> the kernel's activity record (from the collector's
    recorder) for every launch the frames name, waiting for queued work once if some have
    not run yet.  The recorders stop."""
    try:
        return _found(frames)
    finally:
        with _LOCK:
            recorders = list(_RECORDERS.values())
            _RECORDERS.clear()
        for rec in recorders:
            rec.stop()


def _found(frames: list[_Frame]) -> dict[tuple[int, int], _Kernel]:
    wanted: dict[int, set[int]] = {}
    drivers = {}
    for f in frames:
        drivers[id(f.driver)] = f.driver
        wanted.setdefault(id(f.driver), set()).update(
            n for a, b in f.launches for n in range(a + 1, b + 1))
    found: dict[tuple[int, int], _Kernel] = {}
    for key, driver in drivers.items():
        need = wanted[key]
        for attempt in range(2):
            recorder = _RECORDERS.get(key)
            for rec in recorder.kernels if recorder is not None else ():
                if rec.launch in need:
                    found[(key, rec.launch)] = rec
            if attempt == 0 and any((key, n) not in found for n in need):
                for ctx_queue_sync in _synchronizers(driver):
                    ctx_queue_sync()
                continue
            break
    return found


def _synchronizers(driver):
    """Ways to wait for a driver's queued work: the torch session's runtime, if it is this
    driver's."""
    from .session import current, initialized
    if initialized() and current().stack.driver is driver:
        return [current().runtime.synchronize]
    return []


def attach(events: list, trace_start_ns: int, use_device: str | None) -> int:
    """Attach the recorded fornax kernels to their ATen ops' FunctionEvents, as PyTorch does
    for CUDA kernels: ``append_kernel`` on the op, and one device-side event per kernel
    (device type PrivateUse1, linked to the op) appended to ``events``.  Returns how many
    kernels were attached.  The records are consumed."""
    with _LOCK:
        frames = list(_RECORDS)
        _RECORDS.clear()
    if use_device != "fornax" or not frames:
        with _LOCK:
            recorders = list(_RECORDERS.values())
            _RECORDERS.clear()
        for recorder in recorders:
            recorder.stop()
        return 0
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent
    kernels = _kernels(frames)
    by_name: dict[str, list] = {}
    for e in events:
        if not e.is_async and e.device_type == DeviceType.CPU:
            by_name.setdefault(e.name, []).append(e)
    # Kineto stamps events with the Unix-epoch clock; the router with the monotonic one
    epoch = time.time_ns() - time.perf_counter_ns()
    next_id = max((e.id for e in events), default=0) + 1
    device_events = []
    for f in frames:
        lo = (f.t0 + epoch - trace_start_ns) / 1000.0
        hi = (f.t1 + epoch - trace_start_ns) / 1000.0
        # the outermost event of this op whose host interval holds the router's
        owners = [e for e in by_name.get(f.name, ())
                  if e.time_range.start <= lo + 2.0 and e.time_range.end >= hi - 2.0]
        if not owners:
            continue
        owner = min(owners, key=lambda e: e.time_range.start)
        at = owner.time_range.start
        for a, b in f.launches:
            for n in range(a + 1, b + 1):
                rec = kernels.get((id(f.driver), n))
                if rec is None:
                    continue
                us = rec.duration_s * 1e6
                owner.append_kernel(rec.name, f.device, us)
                device_events.append(FunctionEvent(
                    id=next_id, name=rec.name, thread=owner.thread, start_us=at, end_us=at + us,
                    use_device=use_device, device_type=DeviceType.PrivateUse1,
                    device_index=f.device, linked_correlation_id=owner.id, stack=[], input_shapes=[],
                    flops=int(rec.flops)))
                next_id += 1
                at += us
    events.extend(device_events)
    events.sort(key=lambda e: [e.time_range.start, -e.time_range.end])
    return len(device_events)


def install() -> None:
    """Wrap the profiler's trace parser once per process so parsed events get fornax's
    device time."""
    cls = _autograd_profiler.profile
    if getattr(cls, _FLAG, False):
        return
    original = cls._parse_kineto_results

    def parse(self, result, *args, **kwargs):
        events = original(self, result, *args, **kwargs)
        attach(events, result.trace_start_ns(), self.use_device)
        return events

    setattr(cls, "_parse_kineto_results", parse)
    setattr(cls, _FLAG, True)
