"""The runtime's core: its state, the family's facts and error table, devices and their
primary contexts, and the capture rules every call checks (what a capturing stream
forbids).

:class:`RuntimeCore` is the root of the shared runtime policy; streams
(:mod:`.streams`), events (:mod:`.events`), memory (:mod:`.memory`), graphs
(:mod:`.graphs`), copies (:mod:`.copies`) and modules (:mod:`.modules`) build on
it, and :class:`~.base.RuntimeBase` assembles them.
"""

from __future__ import annotations

import itertools
from typing import Any

from ...sim.timeline import Timeline
from ..allocator import CachingAllocator
from ..driver import Context, Driver, Module
from ..errors import ErrorTable, FornaxError
from .handles import Event, Graph, Stream
from .host_pool import PinnedHostPool


class RuntimeCore:
    """Shared runtime state and rules; a vendor subclass of :class:`~.base.RuntimeBase`
    sets ``vendor`` and ``facts``."""

    seam = "runtime"
    vendor = "base"
    facts: dict[str, Any] = {}
    ROUND = 512                      # allocation granularity of the caching allocator

    def __init__(self, driver: Driver, per_thread_default_stream: bool | None = None):
        self.driver = driver
        r = self.facts["runtime"]
        self.calls: dict[str, str] = r["calls"]
        self.blocking: set[str] = set(r.get("blocking", ()))
        e = r["errors"]
        self.errors = ErrorTable(e["api"], e["codes"], e["conditions"], seam="runtime", vendor=self.vendor)
        self.legacy_default = r.get("default_stream", "legacy") == "legacy"
        self.queue_order: str = r.get("queue_order", "in_order")
        self.out_of_order = bool(r.get("out_of_order", False))
        self.queue_pool = max(1, int(r.get("queue_pool", 1)))
        prio = r.get("priorities", {"least": 0, "greatest": 0})
        #: (least, greatest) stream priority; lower numbers run first in every family
        self.priority_range: tuple[int, int] = (int(prio["least"]), int(prio["greatest"]))
        self.priority_calls: dict[str, str] = {k: v for k, v in prio.items() if isinstance(v, str)}
        self.event_timing: str = r.get("event_timing", "event")
        self.elapsed_incomplete: str = r.get("elapsed_incomplete", "error")
        self.pageable_rate = float(r.get("pageable_host_rate", 1.0))
        self.sync_copy: dict[str, str] = r.get("sync_copy", {})
        self.graph_facts: dict[str, Any] = r.get("graph", {})
        if per_thread_default_stream is None:
            per_thread_default_stream = bool(r.get("per_thread_default_stream", False))
        if per_thread_default_stream and not r.get("per_thread_supported", False):
            raise self._error(f"{r['api']} has no per-thread default stream", "per_thread_default_stream",
                              condition="not_supported",
                              hint="create a stream per thread with create_stream()")
        self.per_thread = bool(per_thread_default_stream)
        self._device = 0
        self._stream_ids = itertools.count(1)
        self._events: set[Event] = set()          # events of create_event not yet destroyed
        self._graphs: set[Graph] = set()          # instantiated graphs not yet destroyed
        self._deferred_frees: list[int] = []      # frees asked for while a packet ran
        self._contexts: dict[int, Context] = {}
        self._streams: dict[int, list[Stream]] = {}
        self._retiring: dict[int, list[Stream]] = {}   # destroyed streams whose work is pending
        # (device, "default") or (device, "per_thread", thread id) -> that default stream
        self._defaults: dict[tuple[int, str] | tuple[int, str, int], Stream] = {}
        self._modules: dict[tuple[int, str], Module] = {}
        self._allocators: dict[int, CachingAllocator] = {}
        self._host_pool: PinnedHostPool | None = None
        self.counts = {"malloc_calls": 0, "module_cache_hits": 0, "module_loads": 0, "launches": 0,
                       "h2d_copies": 0, "d2h_copies": 0, "d2d_copies": 0, "host_syncs": 0, "streams": 0,
                       "implicit_waits": 0, "graph_replays": 0, "graph_nodes_replayed": 0, "cached_allocations": 0,
                       "pageable_copies": 0, "pinned_copies": 0, "device_resets": 0}

    def _error(self, message: str, call: str, hint: str | None = None,
               condition: str = "invalid_value") -> FornaxError:
        """A runtime-API error with this family's exact code for ``condition``."""
        name = self.errors.faults.get(condition) or self.errors.faults["unknown"]
        return self.errors.error(name, message, op=self.calls.get(call, call), hint=hint)

    def device_count(self) -> int:
        return self.driver.device_count()

    def set_device(self, index: int) -> None:
        if not isinstance(index, int) or not 0 <= index < self.device_count():
            raise self._error(f"device {index!r} does not exist ({self.device_count()} device(s))",
                              "set_device", condition="invalid_device")
        self._device = index

    def current_device(self) -> int:
        return self._device

    def context(self, index: int | None = None) -> Context:
        """The primary context of a device, created on first use."""
        index = self._device if index is None else index
        if index not in self._contexts:
            self._contexts[index] = self.driver.create_context(index)
        return self._contexts[index]

    def _timeline(self, device: int | None = None) -> Timeline:
        return self.context(device).device.timeline

    def _capturing(self, device: int | None = None) -> list[Stream]:
        device = self._device if device is None else device
        return [s for s in self._streams.get(device, []) if s.capture is not None]

    def _capture_error(self, stream: Stream | None, what: str, call: str, condition: str) -> FornaxError:
        if stream is not None and stream.capture is not None and stream.capture.invalidated is None:
            stream.capture.invalidated = f"{self.calls.get(call, call)}: {what}"
        return self._error(f"{what} (stream {stream.id if stream else '?'} is capturing)", call,
                           condition=condition,
                           hint=f"end the capture ({self.calls.get('end_capture', 'end_capture')}) "
                                "before synchronising or use asynchronous calls")
