"""The shared runtime a vendor subclasses: :class:`RuntimeBase` assembles streams,
events, memory, graphs, copies and modules, and owns the live-handle count, the device
reset and the runtime's report."""

from __future__ import annotations

from typing import Any

from ..profiler import ProfilerBase
from .copies import RuntimeCopies
from .modules import ModuleCache


class RuntimeBase(RuntimeCopies, ModuleCache):
    """Shared runtime policy; a vendor subclass sets ``vendor``, ``facts`` and
    ``profiler_class``."""

    #: the family's profiling interface (a fornax.layers.profiler.ProfilerBase subclass)
    profiler_class: type[ProfilerBase] | None = None

    def profiler(self) -> ProfilerBase:
        """The family's profiling interface over this runtime (made on first use, then the
        same one): CUPTI-like, rocprofiler-sdk-like or Level Zero tracer-like, over the one
        collector of the driver (docs/profiling.md)."""
        made: ProfilerBase | None = getattr(self, "_profiler_interface", None)
        if made is None:
            if self.profiler_class is None:
                raise self._error(f"{self.facts['runtime']['api']} ships no profiling interface",
                                  "profiler", condition="not_supported",
                                  hint="set profiler_class on the family's runtime (docs/profiling.md)")
            made = self._profiler_interface = self.profiler_class(self)
        return made

    def handles(self) -> dict[str, int]:
        """Live handles: streams made by create_stream, events of create_event, loaded modules,
        instantiated graphs, live device blocks; and the driver's contexts, queues, modules."""
        created = sum(1 for ss in self._streams.values() for s in ss if s.kind == "created")
        blocks = sum(len(a.active) for a in self._allocators.values())
        return {"streams": created, "events": len(self._events), "modules": len(self._modules),
                "graphs": len(self._graphs), "device_blocks": blocks,
                **{f"driver_{k}": v for k, v in self.driver.handles().items()}}

    def device_reset(self, index: int | None = None) -> None:
        """Destroy everything this runtime holds on a device and start it afresh
        (``[runtime.calls] device_reset``: cudaDeviceReset, hipDeviceReset; the SYCL runtime
        makes a new context).  The primary context goes with every allocation, stream, module
        and graph in it: a context made unusable by a sticky error is destroyed, a lost
        device is reset in hardware first (the driver's ``reset``).  Old addresses, streams
        and modules are invalid afterwards; the next call creates a fresh context."""
        index = self._device if index is None else index
        if not isinstance(index, int) or not 0 <= index < self.device_count():
            raise self._error(f"device {index!r} does not exist ({self.device_count()} device(s))",
                              "device_reset", condition="invalid_device")
        ctx = self._contexts.pop(index, None)
        if self.driver.is_lost(index):
            self.driver.reset(index)             # destroys every context on the device
        elif ctx is not None and ctx.live:
            self.driver.destroy_context(ctx)
        self._retiring.pop(index, None)
        for s in self._streams.pop(index, []):
            s.destroyed = True
            if s.capture is not None:
                s.capture = None
        self._defaults = {k: v for k, v in self._defaults.items() if k[0] != index}
        self._modules = {k: m for k, m in self._modules.items() if k[0] != index}
        self._graphs = {g for g in self._graphs if g.stream.device != index}
        self._events = {e for e in self._events if e.stream is None or e.stream.device != index}
        self._allocators.pop(index, None)       # its memory went with the context
        self._deferred_frees.clear()
        self.counts["device_resets"] += 1

    def report(self) -> dict[str, Any]:
        return {"vendor": self.vendor, "api": self.facts["runtime"]["api"],
                "queue_kind": self.facts["runtime"]["queue_name"],
                "default_stream": "per-thread" if self.per_thread else
                ("legacy" if self.legacy_default else "in-order queue"),
                **self.counts, **self.memory_stats()}
