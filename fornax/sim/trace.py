"""Chrome / Perfetto trace of the simulated timeline.

:func:`chrome_trace` turns devices into the trace-event JSON format that
``chrome://tracing`` and https://ui.perfetto.dev open::

    {"traceEvents": [...], "displayTimeUnit": "ns"}

- one *process* per device (``pid`` = device index + 1), named by a
  ``process_name`` metadata event;
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
  (``device.power.samples``: ``(time_s, {name: value})`` pairs).

Timestamps and durations are microseconds of *simulated* device time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, SupportsFloat, SupportsIndex

from .device import Device

QUEUE_TID_BASE = 1000


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


def device_events(device: Device) -> list[dict[str, Any]]:
    """The trace events of one device."""
    tl = device.timeline
    pid = device.index + 1
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
         "args": {"name": f"device {device.index} ({device.spec.name})"}},
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


def chrome_trace(devices: Iterable[Device]) -> dict[str, Any]:
    """A Chrome / Perfetto trace-event document for ``devices`` (simulated time)."""
    events: list[dict[str, Any]] = []
    for device in devices:
        events.extend(device_events(device))
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"clock": "simulated device time (µs)"}}
