"""A caching device-memory allocator, shaped like PyTorch's CUDA caching allocator.

Requests are rounded up to 512 bytes.  Small requests (<= 1 MiB) are carved
out of 2 MiB segments, large ones out of 20 MiB segments (requests under
10 MiB) or segments rounded up to 2 MiB.  A cached free block is reused by
best fit and split when the remainder is worth keeping (>= 512 bytes in the
small pool, > 1 MiB in the large one); freed blocks merge with free
neighbours in their segment.  Pools are per stream: a block freed on one
stream is reused only by allocations on that stream, so no stream can be
handed memory another stream may still be using.  When the device is out of
memory the allocator releases its unused cached segments and retries once;
if that fails too it raises with the numbers PyTorch prints: requested,
allocated, reserved-but-unallocated, and the device's free memory.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable

KIB, MIB = 1024, 1024 * 1024
MIN_BLOCK = 512
SMALL_SIZE = 1 * MIB
SMALL_SEGMENT = 2 * MIB
MIN_LARGE_ALLOC = 10 * MIB
LARGE_SEGMENT = 20 * MIB
ROUND_LARGE = 2 * MIB


def round_size(nbytes: int) -> int:
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


@dataclass(eq=False)
class Segment:
    ptr: int
    size: int
    stream: int
    small: bool
    blocks: list["Block"] = field(default_factory=list)


@dataclass(eq=False)
class Block:
    segment: Segment
    offset: int
    size: int
    free: bool = True

    @property
    def ptr(self) -> int:
        return self.segment.ptr + self.offset


class AllocatorOOM(Exception):
    """Raised by :meth:`CachingAllocator.allocate`; the runtime maps it to its vendor code."""

    def __init__(self, message: str, cause: Exception):
        super().__init__(message)
        self.cause = cause


class CachingAllocator:
    """One device's cache.  ``device_alloc``/``device_free`` reach the driver;
    ``device_info`` returns (free, total) bytes of the device; ``oom`` is the
    exception type the driver raises when the device is full."""

    def __init__(self, device_alloc: Callable[[int], int], device_free: Callable[[int], None],
                 device_info: Callable[[], tuple[int, int]], oom: type[Exception]):
        self._alloc = device_alloc
        self._free = device_free
        self._info = device_info
        self._oom = oom
        self.segments: list[Segment] = []
        self.active: dict[int, Block] = {}
        # (stream, small) -> free blocks sorted by (size, ptr)
        self._pools: dict[tuple[int, bool], list[tuple[int, int, Block]]] = {}
        self.stats = {"allocated_bytes": 0, "peak_allocated_bytes": 0, "reserved_bytes": 0,
                      "peak_reserved_bytes": 0, "requested_bytes": 0, "allocations": 0, "frees": 0,
                      "cache_hits": 0, "segment_allocations": 0, "segment_frees": 0,
                      "splits": 0, "merges": 0, "num_alloc_retries": 0, "num_ooms": 0}

    # -- pools ----------------------------------------------------------------------------
    def _pool(self, stream: int, small: bool) -> list[tuple[int, int, Block]]:
        return self._pools.setdefault((stream, small), [])

    def _cache(self, block: Block) -> None:
        bisect.insort(self._pool(block.segment.stream, block.segment.small), (block.size, block.ptr, block))

    def _uncache(self, block: Block) -> None:
        pool = self._pool(block.segment.stream, block.segment.small)
        i = bisect.bisect_left(pool, (block.size, block.ptr))
        if i < len(pool) and pool[i][2] is block:
            del pool[i]

    # -- allocation ---------------------------------------------------------------------------
    def allocate(self, nbytes: int, stream: int = 0) -> int:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._pool(stream, small)
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            _, _, block = pool.pop(i)
            self.stats["cache_hits"] += 1
        else:
            block = self._new_segment(size, stream, small, nbytes)
        remaining = block.size - size
        if (small and remaining >= MIN_BLOCK) or (not small and remaining > SMALL_SIZE):
            rest = Block(block.segment, block.offset + size, remaining)
            blocks = block.segment.blocks
            blocks.insert(blocks.index(block) + 1, rest)
            block.size = size
            self._cache(rest)
            self.stats["splits"] += 1
        block.free = False
        self.active[block.ptr] = block
        s = self.stats
        s["allocations"] += 1
        s["requested_bytes"] += nbytes
        s["allocated_bytes"] += block.size
        s["peak_allocated_bytes"] = max(s["peak_allocated_bytes"], s["allocated_bytes"])
        ptr: int = block.ptr
        return ptr

    def _new_segment(self, size: int, stream: int, small: bool, requested: int) -> Block:
        seg_bytes = segment_size(size)
        try:
            ptr = self._alloc(seg_bytes)
        except self._oom as first:
            self.stats["num_alloc_retries"] += 1
            self.empty_cache()
            try:
                ptr = self._alloc(seg_bytes)
            except self._oom:
                self.stats["num_ooms"] += 1
                raise AllocatorOOM(self.oom_message(requested), first) from None
        seg = Segment(ptr, seg_bytes, stream, small)
        block = Block(seg, 0, seg_bytes)
        seg.blocks.append(block)
        self.segments.append(seg)
        s = self.stats
        s["segment_allocations"] += 1
        s["reserved_bytes"] += seg_bytes
        s["peak_reserved_bytes"] = max(s["peak_reserved_bytes"], s["reserved_bytes"])
        return block

    def oom_message(self, requested: int) -> str:
        free, total = self._info()
        s = self.stats
        unallocated = s["reserved_bytes"] - s["allocated_bytes"]
        largest = max((b.size for seg in self.segments for b in seg.blocks if b.free), default=0)
        return (f"Tried to allocate {fmt_bytes(requested)}. The device has a total capacity of "
                f"{fmt_bytes(total)} of which {fmt_bytes(free)} is free. Of the allocated memory "
                f"{fmt_bytes(s['allocated_bytes'])} is allocated by the runtime, and "
                f"{fmt_bytes(unallocated)} is reserved but unallocated (largest free cached block "
                f"{fmt_bytes(largest)}; fragmentation "
                f"{(1 - largest / unallocated) if unallocated else 0:.0%})")

    def owns(self, ptr: int) -> bool:
        return ptr in self.active

    def free(self, ptr: int) -> int:
        """Return a block to its stream's pool; the block size, for accounting."""
        block = self.active.pop(ptr)
        block.free = True
        size = block.size
        self.stats["allocated_bytes"] -= size
        self.stats["frees"] += 1
        blocks = block.segment.blocks
        i = blocks.index(block)
        for j in (i + 1, i - 1):                      # merge with the next, then the previous block
            if 0 <= j < len(blocks) and blocks[j].free:
                other = blocks[j]
                self._uncache(other)
                first, second = (block, other) if j > i else (other, block)
                first.size += second.size
                blocks.remove(second)
                block = first
                i = blocks.index(block)
                self.stats["merges"] += 1
        self._cache(block)
        return size

    def reset_peak(self) -> None:
        """Peaks restart from the current values (torch.cuda.reset_peak_memory_stats)."""
        self.stats["peak_allocated_bytes"] = self.stats["allocated_bytes"]
        self.stats["peak_reserved_bytes"] = self.stats["reserved_bytes"]

    def release_stream(self, stream: int) -> int:
        """The stream is gone: release its wholly free segments (no later allocation can
        reuse them); the bytes released."""
        return self.empty_cache(stream)

    def empty_cache(self, stream: int | None = None) -> int:
        """Release every segment that is wholly free (of one ``stream``, if given); the
        bytes released."""
        released = 0
        for seg in list(self.segments):
            if stream is not None and seg.stream != stream:
                continue
            if len(seg.blocks) == 1 and seg.blocks[0].free:
                self._uncache(seg.blocks[0])
                self._free(seg.ptr)
                self.segments.remove(seg)
                self.stats["reserved_bytes"] -= seg.size
                self.stats["segment_frees"] += 1
                released += seg.size
        self._pools = {k: v for k, v in self._pools.items() if v}   # pools of streams now gone
        return released

    def summary(self, title: str) -> str:
        s = self.stats
        rows = [
            ("Allocated memory", s["allocated_bytes"], s["peak_allocated_bytes"]),
            ("Reserved memory", s["reserved_bytes"], s["peak_reserved_bytes"]),
            ("Requested memory (total)", s["requested_bytes"], None),
        ]
        counts = [("Allocations", s["allocations"]), ("Frees", s["frees"]),
                  ("Served from cache", s["cache_hits"]), ("Segments allocated", s["segment_allocations"]),
                  ("Segments released", s["segment_frees"]), ("Block splits", s["splits"]),
                  ("Block merges", s["merges"]), ("Allocation retries", s["num_alloc_retries"]),
                  ("Out-of-memory errors", s["num_ooms"])]
        width = 74
        lines = ["=" * width, f"| {title:<{width - 4}} |", "-" * width,
                 f"| {'Metric':<34}| {'Current':>16} | {'Peak':>16} |", "-" * width]
        for name, cur, peak in rows:
            lines.append(f"| {name:<34}| {fmt_bytes(cur):>16} | {fmt_bytes(peak) if peak is not None else '':>16} |")
        lines.append("-" * width)
        for name, n in counts:
            lines.append(f"| {name:<34}| {n:>16} | {'':>16} |")
        lines.append(f"| {'Live blocks / cached segments':<34}| {len(self.active):>16} | "
                     f"{len(self.segments):>16} |")
        lines.append("=" * width)
        return "\n".join(lines)
