"""The runtime seam: what frameworks call.

Current device, streams, events, a caching allocator, host<->device copies,
a module cache and launches — on top of any driver, through the
:class:`~fornax.layers.driver.Driver` protocol only.  Families differ in
data (``vendor.toml`` ``[runtime]``): their API names, which calls block the
host (``hipMalloc``/``hipFree`` do; ``cudaMalloc`` does not), and the name of
their queue object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from .binary import KernelBinary
from .driver import Context, Driver, Marker, Module, Queue
from .allocator import AllocatorOOM, CachingAllocator
from .errors import ErrorTable, FornaxError, OutOfMemoryError


@dataclass(frozen=True)
class Stream:
    """A runtime stream/queue: a driver queue plus its ordinal for reports."""

    id: int
    queue: Queue
    device: int


@runtime_checkable
class Runtime(Protocol):
    vendor: str
    driver: Driver

    def device_count(self) -> int: ...
    def set_device(self, index: int) -> None: ...
    def current_device(self) -> int: ...
    def malloc(self, nbytes: int) -> int: ...
    def free(self, ptr: int) -> None: ...
    def memcpy_h2d(self, dst: int, src: np.ndarray, stream: Stream | None = None) -> None: ...
    def memcpy_d2h(self, dst: np.ndarray, src: int, stream: Stream | None = None,
                   blocking: bool = True) -> None: ...
    def create_stream(self) -> Stream: ...
    def default_stream(self) -> Stream: ...
    def record_event(self, stream: Stream | None = None) -> Marker: ...
    def stream_wait_event(self, stream: Stream, event: Marker) -> None: ...
    def load_module(self, binary: KernelBinary) -> Module: ...
    def launch(self, module: Module, entry: str, grid, args: dict, stream: Stream | None = None) -> None: ...
    def synchronize(self) -> None: ...
    def memory_stats(self) -> dict: ...
    def report(self) -> dict: ...


class RuntimeBase:
    """Shared runtime policy; a vendor subclass sets ``vendor`` and ``facts``."""

    seam = "runtime"
    vendor = "base"
    facts: dict = {}
    ROUND = 512                      # allocation granularity of the caching allocator

    def __init__(self, driver: Driver):
        self.driver = driver
        r = self.facts["runtime"]
        self.calls: dict[str, str] = r["calls"]
        self.blocking: set[str] = set(r.get("blocking", ()))
        e = r["errors"]
        self.errors = ErrorTable(e["api"], e["codes"], e["conditions"], seam="runtime", vendor=self.vendor)
        self._device = 0
        self._contexts: dict[int, Context] = {}
        self._streams: dict[int, list[Stream]] = {}
        self._modules: dict[tuple[int, str], Module] = {}
        self._allocators: dict[int, CachingAllocator] = {}
        self.counts = {"malloc_calls": 0, "module_cache_hits": 0, "module_loads": 0, "launches": 0,
                       "h2d_copies": 0, "d2h_copies": 0, "host_syncs": 0, "streams": 0}

    def _error(self, message: str, call: str, hint: str | None = None,
               condition: str = "invalid_value") -> FornaxError:
        """A runtime-API error with this family's exact code for ``condition``."""
        name = self.errors.faults.get(condition) or self.errors.faults["unknown"]
        return self.errors.error(name, message, op=self.calls.get(call, call), hint=hint)

    # -- devices and contexts ----------------------------------------------------
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

    # -- streams --------------------------------------------------------------------
    def default_stream(self) -> Stream:
        streams = self._streams.get(self._device)
        if not streams:
            return self.create_stream()
        return streams[0]

    def create_stream(self) -> Stream:
        streams = self._streams.setdefault(self._device, [])
        stream = Stream(len(streams), self.driver.create_queue(self.context()), self._device)
        streams.append(stream)
        self.counts["streams"] += 1
        return stream

    def _stream(self, stream: Stream | None) -> Stream:
        return self.default_stream() if stream is None else stream

    def record_event(self, stream: Stream | None = None) -> Marker:
        return self._stream(stream).queue.record()

    def stream_wait_event(self, stream: Stream, event: Marker) -> None:
        self._stream(stream).queue.wait(event)

    def _maybe_block(self, call: str) -> None:
        if call in self.blocking:
            self.synchronize()

    # -- memory: a caching allocator per device -------------------------------------------
    def allocator(self, index: int | None = None) -> CachingAllocator:
        index = self._device if index is None else index
        if index not in self._allocators:
            ctx = self.context(index)
            self._allocators[index] = CachingAllocator(
                lambda n: self.driver.allocate(ctx, n), lambda p: self.driver.free(ctx, p),
                lambda: self.driver.memory_info(index), OutOfMemoryError)
        return self._allocators[index]

    def malloc(self, nbytes: int, stream: Stream | None = None) -> int:
        if not isinstance(nbytes, (int, np.integer)) or isinstance(nbytes, bool) or nbytes <= 0:
            raise self._error(f"allocation size must be a positive integer, got {nbytes!r}", "malloc")
        self._maybe_block("malloc")
        self.counts["malloc_calls"] += 1
        stream_id = stream.id if stream is not None else 0
        try:
            return self.allocator().allocate(int(nbytes), stream_id)
        except AllocatorOOM as exc:
            raise self._error(f"out of memory: {exc}", "malloc",
                              hint="free tensors, call empty_cache(), or use a larger spec",
                              condition="out_of_memory") from exc

    def free(self, ptr: int) -> None:
        alloc = next((a for a in self._allocators.values() if a.owns(ptr)), None)
        if alloc is None:
            raise self._error(f"{ptr!r} was not returned by {self.calls.get('malloc', 'malloc')} "
                              "or was already freed", "free")
        self._maybe_block("free")
        alloc.free(ptr)

    def empty_cache(self) -> None:
        """Return every wholly unused cached segment to the driver."""
        for alloc in self._allocators.values():
            alloc.empty_cache()

    def memory_stats(self, index: int | None = None) -> dict:
        """The caching allocator's statistics for a device (PyTorch's memory_stats, flattened)."""
        return dict(self.allocator(index).stats)

    def memory_summary(self, index: int | None = None) -> str:
        index = self._device if index is None else index
        return self.allocator(index).summary(
            f"{self.facts['runtime']['api']} caching allocator, device {index}")

    # -- copies ------------------------------------------------------------------------------
    def memcpy_h2d(self, dst: int, src: np.ndarray, stream: Stream | None = None) -> None:
        self._stream(stream).queue.copy_h2d(dst, src)
        self.counts["h2d_copies"] += 1
        self._maybe_block("memcpy_h2d")

    def memcpy_d2h(self, dst: np.ndarray, src: int, stream: Stream | None = None,
                   blocking: bool = True) -> None:
        s = self._stream(stream)
        s.queue.copy_d2h(dst, src)
        self.counts["d2h_copies"] += 1
        if blocking:
            s.queue.synchronize()
            self.counts["host_syncs"] += 1

    # -- modules and launches ------------------------------------------------------------------
    def load_module(self, binary: KernelBinary) -> Module:
        key = (self._device, binary.digest)
        module = self._modules.get(key)
        if module is not None:
            self.counts["module_cache_hits"] += 1
            return module
        module = self.driver.load_module(self.context(), binary)
        self._modules[key] = module
        self.counts["module_loads"] += 1
        return module

    def launch(self, module: Module, entry: str, grid, args: dict, stream: Stream | None = None) -> None:
        self._stream(stream).queue.launch(module, entry, grid, args)
        self.counts["launches"] += 1

    def synchronize(self) -> None:
        for stream in self._streams.get(self._device, []):
            stream.queue.synchronize()
        self.counts["host_syncs"] += 1

    def report(self) -> dict:
        return {"vendor": self.vendor, "api": self.facts["runtime"]["api"],
                "queue_kind": self.facts["runtime"]["queue_name"], **self.counts,
                **self.memory_stats()}
