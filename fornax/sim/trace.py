"""Chrome / Perfetto trace of the simulated timeline.

:func:`chrome_trace` turns devices into the trace-event JSON format that
``chrome://tracing`` and https://ui.perfetto.dev open::

    {"traceEvents": [...], "displayTimeUnit": "ns"}

- one *process* per device (``pid`` = device index + 1), named by a
  ``process_name`` metadata event (``device 1 (h100-like, MIG 3g.40gb)``: a partition of
  a chip names itself);
- one *thread* (track) per engine (``tid`` 1, 2, ...: compute, copy engines,
  peer links) and one per hardware queue (``tid`` 1000 + queue id), named by
  ``thread_name`` metadata events.  Every executed packet appears twice: on
  the engine that ran it and on the queue that issued it;
- ``X`` (complete) events for kernels, copies and barriers/waits, with the
  packet's args (grid, bytes, bound, flops, direction, queue, error);
- ``i`` (instant) events for faults (on the queue track, at the failed
  packet's end) and data races (process-wide, when both packets had started);
- ``C`` (counter) events for device memory in use, and for power,
  temperature and clock when the device's power model keeps samples
  (``device.power.samples``: ``(time_s, {name: value})`` pairs);
- with an :class:`ApiTrack` (what a profiler recorded): one *API track* per host
  thread and API layer (``tid`` 2000 + 10 x thread + layer, named ``host thread T ·
  API``) with an ``X`` event per API call (category ``api``, args ``correlation``), in the
  process of the device its work ran on, and *flow* events (``ph`` ``s`` / ``f``, category
  ``api``) from each call to the kernels and copies it submitted (on their queue's track),
  joined by correlation id.  An API call takes simulated host time only while it waits
  (a synchronisation); the others are zero-length slices at the host's simulated time.

Timestamps and durations are microseconds of *simulated* device time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, SupportsFloat, SupportsIndex

from .device import Device

QUEUE_TID_BASE = 1000
#: API tracks: 2000 + 10 x host thread + API layer (0, 1, ...)
API_TID_BASE = 2000


@dataclass(frozen=True)
class ApiCall:
    """One host-side API call for the trace's API track (simulated seconds)."""

    device: int            # the device whose process shows it
    thread: int            # the host thread (1, 2, ...)
    layer: int             # 0 for the upper API (runtime), 1 for the lower (driver)
    layer_name: str        # e.g. "CUDA runtime", "Level Zero"
    name: str
    start_s: float
    end_s: float
    correlation: int


@dataclass(frozen=True)
class DeviceWork:
    """A kernel or copy an API call submitted: where it ran and its correlation id."""

    device: int
    queue: int
    start_s: float
    correlation: int


@dataclass
class ApiTrack:
    """What the trace's API track shows: the calls and the device work they submitted."""

    calls: list[ApiCall] = field(default_factory=list)
    work: list[DeviceWork] = field(default_factory=list)


def _us(seconds: float) -> float:
    return seconds * 1e6


def _clean(value: object) -> Any:
    """JSON-safe args: tuples become lists, anything exotic becomes text."""
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (SupportsFloat, SupportsIndex, bytes, bytearray)):   # what float() takes
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    return str(value)


def _power_samples(device: Device) -> list[tuple[float, dict[str, float]]]:
    samples = getattr(getattr(device, "power", None), "samples", None)
    out: list[tuple[float, dict[str, float]]] = []
    for sample in samples or ():
        try:
            t, values = sample
            out.append((float(t), {str(k): float(v) for k, v in dict(values).items()}))
        except (TypeError, ValueError):
            continue
    return out


def _api_label(layer_name: str) -> str:
    """``CUDA runtime`` -> ``CUDA runtime API``; a name that says API already keeps it."""
    return layer_name if layer_name.endswith("API") else f"{layer_name} API"


def device_events(device: Device) -> list[dict[str, Any]]:
    """The trace events of one device."""
    tl = device.timeline
    pid = device.index + 1
    # a partition of a chip says which (fornax.sim.layout: "MIG 3g.40gb", "CPX partition 2")
    part = f", {device.partition.label}" if device.partition is not None else ""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
         "args": {"name": f"device {device.index} ({device.spec.name}{part})"}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
         "args": {"sort_index": device.index}},
    ]
    engine_tid = {name: i + 1 for i, name in enumerate(tl.engines)}
    for name, tid in engine_tid.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": f"engine {name}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                       "args": {"sort_index": tid}})
    labels = {**tl.retired_labels, **{q.id: q.label for q in tl.queues}}
    shown = {q.id for q in tl.queues} | {rec.queue for rec in tl.records}
    for qid in sorted(shown):
        tid = QUEUE_TID_BASE + qid
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": f"queue {qid} ({labels.get(qid, 'released')})"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                       "args": {"sort_index": tid}})

    for rec in sorted(tl.records, key=lambda r: (r.start, r.end)):
        args = {"queue": rec.queue, "queue_label": labels.get(rec.queue, ""), "engine": rec.engine,
                **_clean(rec.args)}
        if rec.error:
            args["error"] = rec.error
        base = {"ph": "X", "name": rec.label or rec.kind, "cat": rec.kind, "pid": pid,
                "ts": _us(rec.start), "dur": _us(rec.end - rec.start), "args": args}
        events.append({**base, "tid": engine_tid.get(rec.engine, 0)})
        events.append({**base, "tid": QUEUE_TID_BASE + rec.queue})
        if rec.error:
            events.append({"ph": "i", "name": "fault", "cat": "fault", "s": "t", "pid": pid,
                           "tid": QUEUE_TID_BASE + rec.queue, "ts": _us(rec.end),
                           "args": {"packet": rec.label, "error": rec.error}})

    for race in tl.races:
        d = race.to_dict()
        events.append({"ph": "i", "name": f"{race.kind} race", "cat": "race", "s": "p", "pid": pid,
                       "tid": 0, "ts": _us(race.at), "args": _clean(d)})

    usage = [(0.0, 0)] + list(getattr(device.memory, "usage_log", ()))
    last: dict[float, int] = {}
    for t, used in usage:                  # several changes at one host time: keep the last
        last[t] = used
    for t in sorted(last):
        events.append({"ph": "C", "name": "memory in use", "pid": pid, "tid": 0, "ts": _us(t),
                       "args": {"bytes": last[t]}})
    for t, values in sorted(_power_samples(device), key=lambda s: s[0]):
        for name, value in values.items():
            events.append({"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": _us(t),
                           "args": {"value": value}})
    return events


def api_events(track: ApiTrack, devices: set[int]) -> list[dict[str, Any]]:
    """The API track's events (for the devices in ``devices``) and the flows from each call
    to the device work that carries its correlation id."""
    events: list[dict[str, Any]] = []
    named: set[tuple[int, int]] = set()
    source: dict[int, tuple[ApiCall, int]] = {}
    for call in sorted(track.calls, key=lambda c: (c.start_s, c.layer)):
        if call.device not in devices:
            continue
        pid, tid = call.device + 1, API_TID_BASE + 10 * call.thread + call.layer
        if (pid, tid) not in named:
            named.add((pid, tid))
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": f"host thread {call.thread} · {_api_label(call.layer_name)}"}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid}})
        events.append({"ph": "X", "name": call.name, "cat": "api", "pid": pid, "tid": tid,
                       "ts": _us(call.start_s), "dur": _us(call.end_s - call.start_s),
                       "args": {"correlation": call.correlation, "api": call.layer_name}})
        held = source.get(call.correlation)
        if held is None or call.layer < held[0].layer:    # arrows leave the upper API's call
            source[call.correlation] = (call, tid)
    flow = 0
    for work in sorted(track.work, key=lambda w: w.start_s):
        held = source.get(work.correlation)
        if held is None or work.device not in devices:
            continue
        call, tid = held
        flow += 1
        events.append({"ph": "s", "id": flow, "name": "launch", "cat": "api", "bp": "e",
                       "pid": call.device + 1, "tid": tid, "ts": _us(call.start_s),
                       "args": {"correlation": work.correlation}})
        events.append({"ph": "f", "id": flow, "name": "launch", "cat": "api", "bp": "e",
                       "pid": work.device + 1, "tid": QUEUE_TID_BASE + work.queue,
                       "ts": _us(work.start_s), "args": {"correlation": work.correlation}})
    return events


def chrome_trace(devices: Iterable[Device], api: ApiTrack | None = None) -> dict[str, Any]:
    """A Chrome / Perfetto trace-event document for ``devices`` (simulated time); ``api``
    adds the API call track and its flows to the device work."""
    events: list[dict[str, Any]] = []
    devices = list(devices)
    for device in devices:
        events.extend(device_events(device))
    if api is not None:
        events.extend(api_events(api, {d.index for d in devices}))
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"clock": "simulated device time (µs)"}}
