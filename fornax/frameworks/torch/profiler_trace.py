"""One Chrome / Perfetto trace of a ``torch.profiler`` window on fornax: PyTorch's host side
and the simulated device side, joined by flow arrows.

Kineto writes PyTorch's own trace (``prof.export_chrome_trace``) in C++ from its own
events: ATen op slices, python functions, the profiler's span; a backend written in Python
cannot add device events to it.  :func:`export_chrome_trace` writes one document holding

- **Kineto's trace as it is**: every event, on the host wall clock (microseconds since
  Kineto's ``baseTimeNanoseconds``);
- **the fornax device** (:func:`fornax.sim.trace.chrome_trace`): one process per device
  of the stack, named ``fornax device N (SPEC) · simulated time``, with a track per
  engine and per hardware queue (kernels, copies, waits), the memory counters and the
  **API call track** (``host thread T · ... API``) of the stack's profiling collector,
  with its flows from each API call to the work it submitted;
- **flow arrows from each ATen op slice to the kernels it launched itself** (``ph``
  ``s`` on the op's slice in Kineto's host thread, ``f`` with ``bp`` ``e`` on the
  kernel's slice on its queue track; category ``fornax``, name ``launch``).

Simulated time and host wall time are different clocks and stay apart: the fornax
processes hold simulated time only.  To lie side by side with the host events, the
simulated timeline is shifted so that the simulated time at which the window opened (the
host's simulated clock when the profiler started) sits at the window's start on the host
clock (Kineto's ``trace_start_ns``); every fornax slice keeps its unshifted simulated start
in ``args.simulated_us``, and ``otherData.fornax`` says both origins.  A kernel's slice is
exactly its simulated duration.  The distance between an op slice and its kernel along
the time axis compares two clocks and means nothing; the arrows say which launched which.

Only the window's work appears: device events that start between the simulated time the
window opened and the time it closed (after the profiler's closing synchronisation), and
the API calls recorded in it.  A counter (memory in use, power) shows its value when the
window opened, then its changes.

Kineto writes a profile's trace once.  The copy read for the merged trace stays on the
profile, so the profile's own ``export_chrome_trace`` still writes it afterwards
(:func:`write_kept`); when the profile's own export came first, PyTorch's Python exporter of
the same Kineto results stands in (``otherData.fornax.host_export``: ``kineto`` or
``pytorch-python``).

Bad input is an :class:`~fornax.layers.errors.InvalidArgumentError` that says what to do:
an object that is not a stopped ``torch.profiler`` profile, a profile without
``ProfilerActivity.PrivateUse1`` or with no fornax work in its window, a path that cannot
be written.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.autograd.profiler as _autograd_profiler

from ...layers.errors import InvalidArgumentError
from ...layers.profiler import KernelActivity, Recorder
from ...sim.trace import QUEUE_TID_BASE, chrome_trace

#: fornax processes take pids from here up (a Linux pid stays below 2**22)
PID_BASE = 1 << 30
#: ... and sort after the host process (Kineto sorts it by its pid, below 2**22) and before
#: Kineto's empty GPU rows (sort index 5,000,000 + index)
SORT_BASE = 4_900_000
#: what the fornax processes' names and ``otherData`` say of their clock
CLOCK = "simulated time"
FLOW_CATEGORY = "fornax"


@dataclass
class DeviceWindow:
    """What one driver's devices did in a profile window: the collector's recording and the
    host's simulated clock when the window opened and closed (seconds)."""

    driver: Any
    recorder: Recorder
    start_s: float
    end_s: float | None = None

    @property
    def devices(self) -> list[Any]:
        return list(self.driver.devices)


@dataclass(frozen=True)
class Launch:
    """A kernel an ATen op launched itself: the op's profiler event and the kernel's record."""

    op_id: int                  # the FunctionEvent's id (Kineto's "External id")
    op_name: str
    op_start_us: float          # the FunctionEvent's start, µs after the trace start
    window: int                 # the DeviceWindow (index) whose recording holds the kernel
    kernel: KernelActivity


@dataclass
class Window:
    """A stopped profile's fornax side (set on the autograd profile at its exit; the
    launches are filled in when PyTorch parses the profile)."""

    devices: list[DeviceWindow]
    #: the ops that reached the device, with their launches (consumed by the parse)
    frames: list[Any] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)


def host_time(driver: Any) -> float:
    """The host's simulated clock on ``driver``'s devices (seconds)."""
    return max((dev.timeline.host_time for dev in driver.devices), default=0.0)


# -- reading the profile -------------------------------------------------------------------
def _autograd_profile(prof: Any) -> Any:
    inner = getattr(prof, "profiler", prof)
    if not isinstance(inner, _autograd_profiler.profile):
        raise InvalidArgumentError(
            f"{type(prof).__name__} is not a torch.profiler profile",
            hint="pass the object of `with torch.profiler.profile(...) as prof:`")
    if getattr(inner, "kineto_results", None) is None:
        raise InvalidArgumentError("the profile has not stopped: it holds no trace yet",
                                   hint="export after the `with torch.profiler.profile(...)` block")
    return inner


def _window(inner: Any) -> Window:
    if inner.use_device != "fornax":
        raise InvalidArgumentError(
            "the profile did not record the fornax device (no ProfilerActivity.PrivateUse1)",
            hint="profile with activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]")
    inner.function_events                        # PyTorch parses: the launches are attached
    window = getattr(inner, "_fornax_window", None)
    if window is None or not any(w.recorder.kernels or w.recorder.copies for w in window.devices):
        raise InvalidArgumentError("no op reached the fornax device inside the profile window",
                                   hint="run the model on device 'fornax' inside the `with` block")
    return window


def _kineto(prof: Any, inner: Any) -> tuple[dict[str, Any], str]:
    """Kineto's own Chrome export of ``prof``, read back (and kept on the profile: Kineto
    writes a profile's trace once).  When it was written already, PyTorch's Python
    exporter of the same Kineto results writes it (``otherData.fornax.host_export``)."""
    kept: tuple[dict[str, Any], str] | None = getattr(inner, "_fornax_kineto", None)
    if kept is not None:
        return kept
    with tempfile.TemporaryDirectory(prefix="fornax-kineto-") as folder:
        path = os.path.join(folder, "kineto.json")
        exporter = "kineto"
        try:
            prof.export_chrome_trace(path)
        except RuntimeError as exc:
            if "already saved" not in str(exc):
                raise
            exporter = "pytorch-python"
            try:
                prof.export_chrome_trace(path, use_python_export=True)
            except TypeError:
                raise InvalidArgumentError(
                    "Kineto has written this profile's trace already and writes it once",
                    hint="call export_chrome_trace before the profile's own export_chrome_trace") from exc
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise InvalidArgumentError("PyTorch's Chrome export holds no traceEvents list",
                                   hint="profile with Kineto (the default torch.profiler)")
    inner._fornax_kineto = (doc, exporter)
    return inner._fornax_kineto


def write_kept(inner: Any, path: str | os.PathLike) -> bool:
    """Write Kineto's trace of the autograd profile ``inner`` as it was read for a merged
    trace (Kineto writes a profile's trace once), under its own name ``path``; False when
    no merged trace read it."""
    kept: tuple[dict[str, Any], str] | None = getattr(inner, "_fornax_kineto", None)
    if kept is None or kept[1] != "kineto":
        return False
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({**kept[0], "traceName": str(path)}, fh)
    return True


# -- the fornax side -----------------------------------------------------------------------
class _Shift:
    """Simulated µs of one driver's window -> the merged trace's µs on the host clock."""

    def __init__(self, win: DeviceWindow, host_start_us: float):
        self.lo = win.start_s * 1e6
        self.hi = (win.end_s if win.end_s is not None else host_time(win.driver)) * 1e6
        self.host_start_us = host_start_us

    def inside(self, sim_us: float) -> bool:
        return self.lo <= sim_us <= self.hi

    def __call__(self, sim_us: float) -> float:
        return self.host_start_us + (sim_us - self.lo)


class _Numbering:
    """Pids and flow ids of the fornax events, apart from every one Kineto's trace uses."""

    def __init__(self, kineto_events: list[dict[str, Any]]):
        pids = [ev["pid"] for ev in kineto_events if isinstance(ev.get("pid"), int)]
        ids = [ev["id"] for ev in kineto_events
               if ev.get("ph") in ("s", "t", "f") and isinstance(ev.get("id"), int)]
        self.next_pid = max([PID_BASE, *(p + 1 for p in pids)])
        self.last_flow = max([0, *ids])
        self.pids: dict[tuple[int, int], int] = {}
        self.flows: dict[tuple[int, int], int] = {}

    def pid(self, window: int, sim_pid: int) -> int:
        """The merged trace's pid of a window's device process (``sim_pid`` in its trace)."""
        if (window, sim_pid) not in self.pids:
            self.pids[(window, sim_pid)] = self.next_pid
            self.next_pid += 1
        return self.pids[(window, sim_pid)]

    def flow(self, window: int | None = None, sim_id: int = 0) -> int:
        """A new flow id, or (with ``window``) the one of a window's API-track flow."""
        if window is not None and (window, sim_id) in self.flows:
            return self.flows[(window, sim_id)]
        self.last_flow += 1
        if window is not None:
            self.flows[(window, sim_id)] = self.last_flow
        return self.last_flow


def _device_side(key: int, win: DeviceWindow, shift: _Shift, ids: _Numbering) -> list[dict[str, Any]]:
    """The window's events of ``win``'s devices (with the API track), moved onto the merged
    trace's pids and time axis."""
    doc = chrome_trace(win.devices, api=win.recorder.track())
    out: list[dict[str, Any]] = []
    before: dict[tuple[int, str], dict[str, Any]] = {}     # each counter's last value before
    flows: dict[int, list[dict[str, Any]]] = {}
    for ev in doc["traceEvents"]:
        ph, pid = ev.get("ph"), ids.pid(key, ev["pid"])
        if ph == "M":
            ev = {**ev, "pid": pid}
            if ev["name"] == "process_name":
                ev["args"] = {"name": f"fornax {ev['args']['name']} · {CLOCK}"}
            elif ev["name"] == "process_sort_index":
                ev["args"] = {"sort_index": SORT_BASE + pid - PID_BASE}
            out.append(ev)
            continue
        ts = float(ev["ts"])
        if ph == "C" and ts <= shift.lo:
            before[(pid, ev["name"])] = ev               # the latest sample wins
            continue
        if not shift.inside(ts):
            continue
        moved = {**ev, "pid": pid, "ts": shift(ts)}
        if ph in ("s", "f"):
            moved["id"] = ids.flow(key, ev["id"])
            flows.setdefault(moved["id"], []).append(moved)
            continue
        if ph == "X":
            moved["args"] = {**ev.get("args", {}), "simulated_us": ts}
        out.append(moved)
    for (pid, _), ev in before.items():                  # the value when the window opened
        out.append({**ev, "pid": pid, "ts": shift(shift.lo)})
    for pair in flows.values():                          # an arrow needs both of its ends
        if {e["ph"] for e in pair} == {"s", "f"}:
            out.extend(pair)
    return out


class _OpSlices:
    """Kineto's ATen op slices, found by the FunctionEvent's id (Kineto's ``External id``)
    or else by name and start."""

    def __init__(self, events: list[dict[str, Any]], host_start_us: float):
        self.host_start_us = host_start_us
        self.by_id: dict[int, dict[str, Any]] = {}
        self.by_name: dict[str, list[dict[str, Any]]] = {}
        for ev in events:
            if ev.get("ph") == "X" and ev.get("cat") == "cpu_op" and isinstance(ev.get("args"), dict):
                ext = ev["args"].get("External id")
                if isinstance(ext, int):
                    self.by_id.setdefault(ext, ev)
                self.by_name.setdefault(str(ev.get("name")), []).append(ev)

    def of(self, launch: Launch) -> dict[str, Any] | None:
        """The op's slice: by its id, else its name's slice that starts when the op did
        (within a microsecond)."""
        ev = self.by_id.get(launch.op_id)
        if ev is not None and ev.get("name") == launch.op_name:
            return ev
        at = self.host_start_us + launch.op_start_us
        near = [e for e in self.by_name.get(launch.op_name, ()) if abs(float(e["ts"]) - at) <= 1.0]
        return min(near, key=lambda e: abs(float(e["ts"]) - at)) if near else None


def _launch_flows(window: Window, slices: _OpSlices, shifts: list[_Shift],
                  ids: _Numbering) -> list[dict[str, Any]]:
    """An arrow from each op's slice to each kernel it launched itself."""
    out: list[dict[str, Any]] = []
    for launch in window.launches:
        k, shift = launch.kernel, shifts[launch.window]
        op = slices.of(launch)
        if op is None or not shift.inside(k.start_s * 1e6):
            continue
        flow = ids.flow()
        args = {"op": launch.op_name, "kernel": k.name, "launch": k.launch, "correlation": k.correlation}
        out.append({"ph": "s", "id": flow, "name": "launch", "cat": FLOW_CATEGORY, "bp": "e",
                    "pid": op["pid"], "tid": op["tid"], "ts": float(op["ts"]), "args": args})
        out.append({"ph": "f", "id": flow, "name": "launch", "cat": FLOW_CATEGORY, "bp": "e",
                    "pid": ids.pid(launch.window, k.device + 1), "tid": QUEUE_TID_BASE + k.queue,
                    "ts": shift(k.start_s * 1e6), "args": args})
    return out


# -- the merged document -------------------------------------------------------------------
def merged_trace(prof: Any) -> dict[str, Any]:
    """The merged trace of a stopped profile (see the module's text), as a document."""
    inner = _autograd_profile(prof)
    window = _window(inner)
    kineto, exporter = _kineto(prof, inner)
    events: list[dict[str, Any]] = list(kineto["traceEvents"])
    base_ns = kineto.get("baseTimeNanoseconds", 0)
    base_ns = base_ns if isinstance(base_ns, int) and not isinstance(base_ns, bool) else 0
    host_start_us = (inner.kineto_results.trace_start_ns() - base_ns) / 1000.0
    ids = _Numbering(events)
    shifts = [_Shift(win, host_start_us) for win in window.devices]
    fornax: list[dict[str, Any]] = []
    for key, win in enumerate(window.devices):
        fornax.extend(_device_side(key, win, shifts[key], ids))
    flows = _launch_flows(window, _OpSlices(events, host_start_us), shifts, ids)
    other = kineto.get("otherData")
    other = dict(other) if isinstance(other, dict) else {}
    other["fornax"] = {
        "clock": f"fornax processes: {CLOCK}, shifted so that the window's simulated start "
                 "sits at the profile's start on the host clock (args.simulated_us: unshifted)",
        "host_start_us": host_start_us, "host_export": exporter,
        "windows": [{"devices": [d.index for d in win.devices], "simulated_start_us": s.lo,
                     "simulated_end_us": s.hi} for win, s in zip(window.devices, shifts)],
        "launch_flows": len(flows) // 2}
    kineto = {k: v for k, v in kineto.items() if k != "traceName"}      # the temporary file's
    return {**kineto, "traceEvents": events + fornax + flows, "otherData": other}


def export_chrome_trace(prof: Any, path: str | os.PathLike) -> dict[str, Any]:
    """Write the merged trace of ``prof`` (a stopped ``torch.profiler.profile`` with
    ``ProfilerActivity.PrivateUse1``) to ``path`` as JSON; returns the document.  The
    profile's own ``export_chrome_trace`` still writes Kineto's trace afterwards."""
    target = Path(path)
    try:                                         # before Kineto's trace is written, once
        fh = open(target, "w", encoding="utf-8")
    except OSError as exc:
        raise InvalidArgumentError(f"cannot write the trace to {str(target)!r}: {exc.strerror or exc}",
                                   hint="give a path in a folder that exists and is writable") from exc
    with fh:
        try:
            doc = merged_trace(prof)
        except BaseException:
            fh.close()
            target.unlink(missing_ok=True)
            raise
        json.dump(doc, fh)
    return doc


def trace_handler(path: str | os.PathLike) -> Callable[[Any], None]:
    """An ``on_trace_ready`` handler for ``torch.profiler.profile``: writes each finished
    window's merged trace to ``path``, formatted with ``step`` (the profiler's step number:
    ``"run.{step}.json"``)."""
    def handler(prof: Any) -> None:
        export_chrome_trace(prof, str(path).format(step=getattr(prof, "step_num", 0)))
    return handler
