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

The device time is simulated time from the cost model, not host wall time.  The window
opens when the profiler starts (or at the first op that reaches the device, if the device
was not up yet) and closes at the profiler's exit, after its synchronisation; work a
recorded op launched that has still not run then is waited for (a host synchronisation).
The window (the recording, the host's simulated clock at both ends) stays on the profile.

Kineto's own Chrome export (``prof.export_chrome_trace``) is written by C++ from its own
events and still shows no fornax kernels.  :func:`export_chrome_trace` (or
:func:`trace_handler` as ``on_trace_ready``) writes one trace holding Kineto's events as
they are, the window's simulated device timeline and API call track in processes of their
own, and a flow arrow from each op's slice to each kernel it launched
(:mod:`.profiler_trace` says how the two clocks are laid side by side):

    fornax.frameworks.torch.profiler.export_chrome_trace(p, "model.trace.json")
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

import torch.autograd.profiler as _autograd_profiler

from ...layers.profiler import Recorder
from .profiler_trace import (DeviceWindow, Launch, Window, export_chrome_trace, host_time, trace_handler,
                             write_kept)

__all__ = ["MAX_RECORDS", "attach", "enabled", "export_chrome_trace", "install", "run", "trace_handler"]

_FLAG = "_fornax_profiler_patched"
_LOCK = threading.Lock()
_RECORDS: list["_Frame"] = []
#: id(driver) -> what its collector records while a profile is on (closed at the profile's exit)
_WINDOWS: dict[int, DeviceWindow] = {}
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
    if id(driver) not in _WINDOWS:
        _open(session)
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


def _open(session) -> None:
    """Start recording ``session``'s driver (its collector's API calls, kernels and copies)
    for the profile window, from the host's simulated clock now."""
    driver = session.stack.driver
    with _LOCK:
        if id(driver) not in _WINDOWS:
            start = host_time(driver)
            _WINDOWS[id(driver)] = DeviceWindow(
                driver, Recorder(session.runtime, limit=MAX_RECORDS).start(), start)


def close() -> Window:
    """Close the profile window: the ops recorded and each driver's recording, waiting for
    queued work once where a launch the ops name has not run yet; each recording stops at
    the host's simulated clock then."""
    with _LOCK:
        frames = list(_RECORDS)
        _RECORDS.clear()
        windows = list(_WINDOWS.values())
        _WINDOWS.clear()
    wanted: dict[int, set[int]] = {}
    for f in frames:
        wanted.setdefault(id(f.driver), set()).update(
            n for a, b in f.launches for n in range(a + 1, b + 1))
    for win in windows:
        try:
            if wanted.get(id(win.driver), set()) - {rec.launch for rec in win.recorder.kernels}:
                for ctx_queue_sync in _synchronizers(win.driver):
                    ctx_queue_sync()
            win.end_s = host_time(win.driver)
        finally:
            win.recorder.stop()
    return Window(windows, frames=frames)


def _synchronizers(driver):
    """Ways to wait for a driver's queued work: the torch session's runtime, if it is this
    driver's."""
    from .session import current, initialized
    if initialized() and current().stack.driver is driver:
        return [current().runtime.synchronize]
    return []


def attach(events: list, trace_start_ns: int, use_device: str | None, window: Window | None = None) -> int:
    """Attach the recorded fornax kernels to their ATen ops' FunctionEvents, as PyTorch does
    for CUDA kernels: ``append_kernel`` on the op, and one device-side event per kernel
    (device type PrivateUse1, linked to the op) appended to ``events``; each kernel also
    goes into ``window.launches`` (for the merged trace).  ``window``: the profile's closed
    window (by default the one open now is closed).  Returns how many kernels were
    attached.  The window's ops are consumed."""
    if window is None:
        window = close()
    frames, window.frames = window.frames, []
    if use_device != "fornax" or not frames:
        return 0
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent
    kernels = {(id(win.driver), rec.launch): (i, rec)
               for i, win in enumerate(window.devices) for rec in win.recorder.kernels}
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
                found = kernels.get((id(f.driver), n))
                if found is None:
                    continue
                key, rec = found
                window.launches.append(Launch(owner.id, owner.name, owner.time_range.start, key, rec))
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
    """Wrap the profiler once per process: its start opens fornax's window (when it profiles
    the fornax device and the device is up), its exit closes it (kept on the profile), and
    its trace parser attaches fornax's device time to the parsed events."""
    cls = _autograd_profiler.profile
    if getattr(cls, _FLAG, False):
        return
    original_start, original_exit, original_parse = cls._start_trace, cls.__exit__, cls._parse_kineto_results
    original_export = cls.export_chrome_trace

    def start_trace(self, *args, **kwargs):
        original_start(self, *args, **kwargs)
        if self.use_device == "fornax":
            from .session import current, initialized
            if initialized():
                _open(current())

    def exit_(self, *exc):
        suppress = original_exit(self, *exc)
        if self.enabled:
            self._fornax_window = close()
        return suppress

    def parse(self, result, *args, **kwargs):
        events = original_parse(self, result, *args, **kwargs)
        attach(events, result.trace_start_ns(), self.use_device, getattr(self, "_fornax_window", None))
        return events

    def export(self, path, metadata=None, use_python_export=False):
        # Kineto writes a profile's trace once: after a merged trace read it, the read copy
        if use_python_export or not write_kept(self, path):
            return original_export(self, path, metadata, use_python_export)

    export.__doc__ = original_export.__doc__
    setattr(cls, "_start_trace", start_trace)
    setattr(cls, "export_chrome_trace", export)
    setattr(cls, "__exit__", exit_)
    setattr(cls, "_parse_kineto_results", parse)
    setattr(cls, _FLAG, True)
