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
        self._live: dict[int, tuple[int, int]] = {}          # ptr -> (device, block size)
        self._cache: dict[tuple[int, int], list[int]] = {}   # (device, size) -> free blocks
        self.counts = {"malloc_calls": 0, "device_allocations": 0, "cache_hits": 0,
                       "module_cache_hits": 0, "module_loads": 0, "launches": 0,
                       "h2d_copies": 0, "d2h_copies": 0, "host_syncs": 0, "streams": 0}
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0

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

    # -- memory: a caching allocator ---------------------------------------------------
    def malloc(self, nbytes: int) -> int:
        if not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise self._error(f"allocation size must be a positive integer, got {nbytes!r}", "malloc")
        self._maybe_block("malloc")
        self.counts["malloc_calls"] += 1
        size = -(-int(nbytes) // self.ROUND) * self.ROUND
        key = (self._device, size)
        if self._cache.get(key):
            ptr = self._cache[key].pop()
            self.counts["cache_hits"] += 1
        else:
            try:
                ptr = self.driver.allocate(self.context(), size)
            except OutOfMemoryError as exc:
                raise self._error(
                    f"out of memory allocating {size} bytes: {self.allocated} bytes allocated, "
                    f"{self.reserved} reserved by this runtime ({exc.message})", "malloc",
                    hint="free tensors or call empty_cache()", condition="out_of_memory") from exc
            self.reserved += size
            self.counts["device_allocations"] += 1
        self._live[ptr] = key
        self.allocated += size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return ptr

    def free(self, ptr: int) -> None:
        key = self._live.pop(ptr, None)
        if key is None:
            raise self._error(f"{ptr!r} was not returned by {self.calls.get('malloc', 'malloc')} "
                              "or was already freed", "free")
        self._maybe_block("free")
        self.allocated -= key[1]
        self._cache.setdefault(key, []).append(ptr)

    def empty_cache(self) -> None:
        """Return every cached (unused) block to the driver."""
        for (device, size), ptrs in self._cache.items():
            for ptr in ptrs:
                self.driver.free(self.context(device), ptr)
                self.reserved -= size
        self._cache.clear()

    def memory_stats(self) -> dict:
        return {"allocated_bytes": self.allocated, "reserved_bytes": self.reserved,
                "peak_allocated_bytes": self.peak_allocated}

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
