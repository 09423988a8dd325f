"""Runtime memory: a caching device allocator per device (the family's malloc/free and
the framework-facing allocate/deallocate), frees deferred while a packet runs, and the
pinned host pool."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..allocator import AllocatorOOM, CachingAllocator, fmt_bytes
from ..errors import FornaxError, OutOfMemoryError
from .events import EventRules
from .handles import Event, Stream
from .host_pool import PinnedHostPool


class RuntimeMemory(EventRules):
    """The caching allocators and the pinned host pool."""

    def allocator(self, index: int | None = None) -> CachingAllocator:
        index = self._device if index is None else index
        if index not in self._allocators:
            ctx = self.context(index)
            self._allocators[index] = CachingAllocator(
                lambda n: self.driver.allocate(ctx, n), lambda p: self.driver.free(ctx, p),
                lambda: self.driver.memory_info(index), OutOfMemoryError)
        return self._allocators[index]

    def malloc(self, nbytes: int, stream: Stream | None = None) -> int:
        self._check_size(nbytes)
        self._free_deferred()
        self._maybe_block("malloc")
        self.counts["malloc_calls"] += 1
        return self._carve(nbytes, stream)

    def free(self, ptr: int) -> None:
        if any(d.timeline.stepping for d in self.driver.devices):
            # reached from inside a running packet (a finaliser the garbage collector ran):
            # a blocking free would re-enter the timeline, so it happens at the next call
            self._deferred_frees.append(ptr)
            return
        self._free_deferred()
        alloc = self._owner(ptr, self.calls.get("malloc", "malloc"))
        self._maybe_block("free")
        alloc.free(ptr)

    def _free_deferred(self) -> None:
        """Carry out the frees :meth:`free` deferred while a packet was running."""
        while self._deferred_frees:
            ptr = self._deferred_frees.pop()
            try:
                self.free(ptr)
            except FornaxError:        # its context went away meanwhile: nothing left to free
                pass

    def allocate(self, nbytes: int, stream: Stream | None = None) -> int:
        """The framework-facing caching allocator (PyTorch's ``CUDACachingAllocator::raw_alloc``):
        never synchronises the device, whatever the family's ``malloc`` does; a block freed
        with :meth:`deallocate` is reused only by later allocations on the same stream, so
        stream order keeps its old users safe."""
        self._check_size(nbytes)
        self.counts["cached_allocations"] += 1
        return self._carve(nbytes, stream)

    def deallocate(self, ptr: int) -> None:
        """Return a block of :meth:`allocate` to its stream's pool (no synchronisation)."""
        self._owner(ptr, "the caching allocator").free(ptr)

    def _check_size(self, nbytes: object) -> None:
        if not isinstance(nbytes, (int, np.integer)) or isinstance(nbytes, bool) or nbytes <= 0:
            raise self._error(f"allocation size must be a positive integer, got {nbytes!r}", "malloc")

    def _carve(self, nbytes: int, stream: Stream | None) -> int:
        try:
            return self.allocator().allocate(int(nbytes), stream.id if stream is not None else 0)
        except AllocatorOOM as exc:
            raise self._error(f"out of memory: {exc}", "malloc",
                              hint="free tensors, call empty_cache(), or use a larger spec",
                              condition="out_of_memory") from exc

    def _owner(self, ptr: int, source: str) -> CachingAllocator:
        alloc = next((a for a in self._allocators.values() if a.owns(ptr)), None)
        if alloc is None:
            raise self._error(f"{ptr!r} was not returned by {source} or was already freed", "free")
        return alloc

    def empty_cache(self) -> None:
        """Return every wholly unused cached segment to the driver."""
        for alloc in self._allocators.values():
            alloc.empty_cache()

    def memory_stats(self, index: int | None = None) -> dict[str, int]:
        """The caching allocator's statistics for a device (PyTorch's memory_stats, flattened)."""
        stats = dict(self.allocator(index).stats)
        if self._host_pool is not None:
            stats.update(self._host_pool.stats)
        return stats

    def memory_summary(self, index: int | None = None) -> str:
        index = self._device if index is None else index
        return self.allocator(index).summary(
            f"{self.facts['runtime']['api']} caching allocator, device {index}")

    @property
    def host_pool(self) -> PinnedHostPool:
        if self._host_pool is None:
            self._host_pool = PinnedHostPool(self)
        return self._host_pool

    def malloc_host(self, nbytes: int) -> NDArray[np.uint8]:
        """A host buffer (uint8 array of ``nbytes``) backed by page-locked memory from a caching
        pool (cudaHostAlloc / hipHostMalloc / sycl::malloc_host); copies from and to it run
        at the host link's full bandwidth."""
        if not isinstance(nbytes, (int, np.integer)) or isinstance(nbytes, bool) or nbytes <= 0:
            raise self._error(f"allocation size must be a positive integer, got {nbytes!r}",
                              "malloc_host")
        try:
            return self.host_pool.allocate(int(nbytes))
        except FornaxError as exc:
            raise self._error(f"cannot allocate {fmt_bytes(int(nbytes))} of pinned host memory: "
                              f"{exc.message}", "malloc_host", condition="out_of_memory") from None

    def free_host(self, buf: NDArray[Any]) -> None:
        """Return a pinned buffer to the pool (reused once its pending copies are done)."""
        if not self.host_pool.free(buf):
            raise self._error("the buffer was not returned by "
                              f"{self.calls.get('malloc_host', 'malloc_host')} or was already freed",
                              "free_host")

    def is_pinned(self, arr: object) -> bool:
        """Whether ``arr`` is (a view of) a buffer of the pinned host pool."""
        return self._host_pool is not None and self._host_pool.base_of(arr) is not None

    def _host_rate(self, arr: object) -> float:
        if self.is_pinned(arr):
            self.counts["pinned_copies"] += 1
            return 1.0
        self.counts["pageable_copies"] += 1
        return self.pageable_rate

    def _record_host_use(self, arr: object, ev: Event) -> None:
        if self._host_pool is not None:
            self._host_pool.record_use(arr, ev)
