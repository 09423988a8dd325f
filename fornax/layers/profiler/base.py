"""The shared policy of a family's profiling interface: :class:`ProfilerBase` (the family's
vocabulary, the collector of the runtime's driver, the family's errors) and :class:`Client`,
one subscriber of the collector with its callback filter and its activity buffers.

A family's interface (``fornax/vendors/<family>/profiler.py``) keeps only the shape of its
real API — CUPTI-like subscribe/enable, rocprofiler-sdk-like contexts and services, the Level
Zero tracer's prologues and epilogues — and maps it onto clients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import FornaxError
from .buffer import ActivityBuffers
from .collector import Collector
from .records import ApiRecord, Record
from .vocabulary import Vocabulary

#: called at a callback site: (site "enter"/"exit", the call's record, per-call data)
SiteCallback = Callable[[str, ApiRecord, dict[str, Any]], None]


class Client:
    """One subscriber of the collector: which API calls reach its callback (domain -> the
    generic calls, or None for all of the domain) and which activity kinds go to which of its
    buffers.  It is subscribed only while it asks for something (:meth:`sync`)."""

    def __init__(self, collector: Collector):
        self.collector = collector
        self.callbacks: dict[str, set[str] | None] = {}
        self.on_site: SiteCallback | None = None
        self.buffers: dict[str, ActivityBuffers] = {}
        #: API record kinds (runtime, driver) -> the generic calls whose records it takes (None: all)
        self.operations: dict[str, set[str] | None] = {}
        self.enabled = True

    def sync(self) -> None:
        """Subscribe while this client wants anything, unsubscribe otherwise."""
        wants = self.enabled and ((self.on_site is not None and bool(self.callbacks)) or bool(self.buffers))
        if wants:
            self.collector.subscribe(self)
        else:
            self.collector.unsubscribe(self)

    def wants_callback(self, domain: str, call: str) -> bool:
        if not self.enabled or self.on_site is None or domain not in self.callbacks:
            return False
        calls = self.callbacks[domain]
        return calls is None or call in calls

    def on_callback(self, site: str, record: ApiRecord, data: dict[str, Any]) -> None:
        if self.on_site is not None:
            self.on_site(site, record, data)

    def wants_activity(self, kind: str) -> bool:
        return self.enabled and kind in self.buffers

    def on_record(self, record: Record) -> None:
        kind = record.domain if isinstance(record, ApiRecord) else record.kind
        if isinstance(record, ApiRecord):
            ops = self.operations.get(kind)
            if ops is not None and record.call not in ops:
                return
        buffers = self.buffers.get(kind)
        if buffers is not None:
            buffers.add(record)


class ProfilerBase:
    """Shared policy of a family's profiling interface, over one runtime (and its driver)."""

    def __init__(self, runtime: Any):
        self.runtime = runtime
        self.vocab = Vocabulary(runtime.facts, runtime.vendor, runtime.calls, runtime.driver.calls)
        self.collector = Collector.of(runtime)

    @property
    def api(self) -> str:
        return self.vocab.api

    def fail(self, condition: str, message: str, call: str, hint: str | None = None) -> FornaxError:
        return self.vocab.fail(condition, message, call, hint)

    def buffers(self, request: Callable[[], int], complete: Callable[[list[Any], int], None],
                call: str, watermark: float = 1.0, discard: bool = False) -> ActivityBuffers:
        """Activity buffers over the client's ``request`` / ``complete`` callbacks; the first
        buffer is requested now, and one smaller than the family's largest record is refused
        with the family's code (every record must fit in a buffer)."""
        if not callable(request) or not callable(complete):
            raise self.fail("invalid_argument", "the buffer callbacks must be callables", call)
        size = request()
        need = self.vocab.largest_record()
        if isinstance(size, bool) or not isinstance(size, int) or size < need:
            raise self.fail("buffer_too_small", f"a requested activity buffer of {size!r} bytes "
                            f"cannot hold one record (the largest takes {need} bytes)", call,
                            hint=f"return buffers of at least {need} bytes (a few MiB is usual)")
        bufs = ActivityBuffers(request, complete, self.vocab.record_size, self.vocab.render, watermark,
                               discard)
        bufs._records, bufs._used, bufs._size, bufs._open = [], 0, size, True
        return bufs

    def site(self, site: str) -> str:
        """The family's name of callback site ``enter`` / ``exit``."""
        return self.vocab.sites[site]
