"""A recorder: the collector's own client, keeping every record of a window (bounded) for
`fornax profile`, the trace's API track and torch.profiler.

It subscribes to every API callback domain and every activity kind; past ``limit`` records
of a kind it drops the newest and counts them (:attr:`Recorder.dropped`), so a recorder left
running does not grow without bound.
"""

from __future__ import annotations

from typing import Any

from ...sim.trace import ApiCall, ApiTrack, DeviceWork
from .collector import Collector
from .records import ApiRecord, CopyActivity, KernelActivity, Record

#: records of each kind a recorder keeps at most
LIMIT = 200_000


class Recorder:
    """Records API calls, kernels and copies of one runtime (and its driver)."""

    def __init__(self, runtime: Any, limit: int = LIMIT, api: bool = True):
        self.collector = Collector.of(runtime)
        self.limit = int(limit)
        self.with_api = api
        self.api: list[ApiRecord] = []
        self.kernels: list[KernelActivity] = []
        self.copies: list[CopyActivity] = []
        self.dropped = {"api": 0, "kernel": 0, "memcpy": 0}
        self.running = False

    def start(self) -> "Recorder":
        self.collector.subscribe(self)
        self.running = True
        return self

    def stop(self) -> "Recorder":
        self.collector.unsubscribe(self)
        self.running = False
        return self

    def __enter__(self) -> "Recorder":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def clear(self) -> None:
        self.api, self.kernels, self.copies = [], [], []
        self.dropped = dict.fromkeys(self.dropped, 0)

    # -- the Sink protocol --------------------------------------------------------------------
    def wants_callback(self, domain: str, call: str) -> bool:
        return False

    def on_callback(self, site: str, record: ApiRecord, data: dict[str, Any]) -> None:
        """A recorder takes finished records only (:meth:`on_record`)."""

    def wants_activity(self, kind: str) -> bool:
        return self.with_api or kind in ("kernel", "memcpy")

    def on_record(self, record: Record) -> None:
        if isinstance(record, KernelActivity):
            into: list[Any] = self.kernels
        elif isinstance(record, CopyActivity):
            into = self.copies
        else:
            into = self.api
        if len(into) >= self.limit:
            self.dropped["api" if isinstance(record, ApiRecord) else record.kind] += 1
            return
        into.append(record)

    def track(self, layers: dict[str, str] | None = None) -> ApiTrack:
        """The recording as the trace's API track (:func:`fornax.sim.trace.chrome_trace`):
        each call shown in the process of the device its work ran on (device 0 for calls
        that submitted none); ``layers`` names the runtime and driver APIs (default: the
        runtime's and driver's ``api`` facts)."""
        if layers is None:
            rt = self.collector.runtimes[0] if self.collector.runtimes else None
            drv = self.collector.driver
            layers = {"runtime": rt.facts["runtime"]["api"] if rt is not None else "runtime",
                      "driver": drv.facts["driver"]["api"]}
        done: list[KernelActivity | CopyActivity] = [*self.kernels, *self.copies]
        work = [DeviceWork(a.device, a.queue, a.start_s, a.correlation) for a in done]
        where: dict[int, int] = {}
        for w in work:
            where.setdefault(w.correlation, w.device)
        calls = [ApiCall(where.get(a.correlation, 0), a.thread, 0 if a.domain == "runtime" else 1,
                         layers.get(a.domain, a.domain), a.name, a.start_s, a.end_s, a.correlation)
                 for a in self.api]
        return ApiTrack(calls, work)
