"""The runtime's pinned host memory: :class:`PinnedHostPool`, a caching pool of
page-locked host buffers."""

from __future__ import annotations

from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from ..driver import Context, Driver
from .handles import Event


class PoolOwner(Protocol):
    """What the pool needs of its runtime."""

    driver: Driver

    def context(self, index: int | None = None) -> Context:
        """The current device's primary context."""
    def query_event(self, event: Event) -> bool:
        """Whether the work before ``event`` has finished."""


class PinnedHostPool:
    """A caching pool of host-pinned buffers, like PyTorch's CachingHostAllocator.

    Sizes round up to a power of two (at least 512 bytes).  A freed buffer goes
    back to its size's free list; it is handed out again only once every copy
    that used it has completed (the events recorded when it was used), so a
    pending DMA never sees its buffer reused."""

    MIN = 512

    def __init__(self, runtime: PoolOwner):
        self.rt = runtime
        self.free_lists: dict[int, list[tuple[int, NDArray[np.uint8]]]] = {}
        self.live: dict[int, tuple[int, int, NDArray[np.uint8]]] = {}   # id(base) -> (va, size, base)
        self.uses: dict[int, list[Event]] = {}
        self.stats = {"host_allocations": 0, "host_cache_hits": 0, "host_segments": 0,
                      "host_reserved_bytes": 0, "host_allocated_bytes": 0}

    @staticmethod
    def size_class(nbytes: int) -> int:
        return max(PinnedHostPool.MIN, 1 << (int(nbytes) - 1).bit_length())

    def allocate(self, nbytes: int) -> NDArray[np.uint8]:
        size = self.size_class(nbytes)
        self.stats["host_allocations"] += 1
        pool = self.free_lists.setdefault(size, [])
        for i, (va, base) in enumerate(pool):
            if all(self.rt.query_event(e) for e in self.uses.get(id(base), ())):
                del pool[i]
                self.uses.pop(id(base), None)
                self.stats["host_cache_hits"] += 1
                break
        else:
            ctx = self.rt.context()
            va = self.rt.driver.allocate(ctx, size, "host_pinned")
            mapping, _ = ctx.space.resolve(va, size)
            base = mapping.buffer          # the owning array: numpy views point straight at it
            self.stats["host_segments"] += 1
            self.stats["host_reserved_bytes"] += size
        self.live[id(base)] = (va, size, base)
        self.stats["host_allocated_bytes"] += size
        return base[:int(nbytes)]

    def base_of(self, arr: object) -> NDArray[np.uint8] | None:
        """The pool buffer ``arr`` is a view of, or None for pageable memory."""
        a = arr
        while isinstance(a, np.ndarray):
            if id(a) in self.live:
                return a
            a = a.base
        return None

    def record_use(self, arr: object, event: Event) -> None:
        base = self.base_of(arr)
        if base is not None:
            self.uses.setdefault(id(base), []).append(event)

    def free(self, arr: object) -> bool:
        base = self.base_of(arr)
        if base is None:
            return False
        va, size, base = self.live.pop(id(base))
        self.stats["host_allocated_bytes"] -= size
        self.free_lists.setdefault(size, []).append((va, base))
        return True
