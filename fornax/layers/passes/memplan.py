"""Memory planning: liveness-based buffer reuse.

A temporary buffer lives from the first step that touches it to the last
one (inclusive).  Temporaries whose lifetimes do not overlap share one
storage slot: the slot is allocated when its first member is first used,
is as large as its largest member, and is freed after its last member's
last use.  Inputs, constants and outputs are pinned (each its own storage,
live for the whole plan).  A buffer read and another written by the same
step overlap at that step, so a kernel never writes over its own operand.

``peak_bytes`` is the most storage live at any step under this plan (what
``execute_plan`` allocates); ``total_bytes`` is the sum of every buffer,
the footprint without any reuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MemoryPlan:
    slots: dict[int, int]                  # temp buffer id -> slot
    slot_bytes: tuple[int, ...]            # slot -> bytes
    slot_span: tuple[tuple[int, int], ...]  # slot -> (first step, last step)
    pinned: frozenset[int] = field(default_factory=frozenset)
    peak_bytes: int = 0
    total_bytes: int = 0

    @property
    def shared(self) -> int:
        """Buffers that reuse a slot another buffer used before them."""
        return len(self.slots) - len(self.slot_bytes)


def lifetimes(step_buffers: list[list[int]]) -> dict[int, tuple[int, int]]:
    """bid -> (first step, last step) touching it."""
    span: dict[int, tuple[int, int]] = {}
    for i, bids in enumerate(step_buffers):
        for bid in bids:
            first = span.get(bid, (i, i))[0]
            span[bid] = (first, i)
    return span


def plan_memory(step_buffers: list[list[int]], sizes: dict[int, int], pinned: set[int]) -> MemoryPlan:
    """Assign temporaries to slots (first fit by lifetime, best fit by size)."""
    span = lifetimes(step_buffers)
    temps = sorted((b for b in span if b not in pinned), key=lambda b: (span[b][0], -sizes[b], b))
    slots: dict[int, int] = {}
    slot_bytes: list[int] = []
    slot_span: list[tuple[int, int]] = []
    for bid in temps:
        first, last = span[bid]
        free = [s for s, (_, end) in enumerate(slot_span) if end < first]
        if free:
            # the free slot whose size is closest to the buffer's (grow the smallest if none fits)
            fitting = [s for s in free if slot_bytes[s] >= sizes[bid]]
            s = (min(fitting, key=lambda s: slot_bytes[s]) if fitting
                 else max(free, key=lambda s: slot_bytes[s]))
            slot_bytes[s] = max(slot_bytes[s], sizes[bid])
            slot_span[s] = (slot_span[s][0], last)
        else:
            s = len(slot_bytes)
            slot_bytes.append(sizes[bid])
            slot_span.append((first, last))
        slots[bid] = s
    base = sum(sizes[b] for b in pinned)
    peak = base
    for i in range(len(step_buffers)):
        peak = max(peak, base + sum(n for n, (a, b) in zip(slot_bytes, slot_span) if a <= i <= b))
    return MemoryPlan(slots, tuple(slot_bytes), tuple(slot_span), frozenset(pinned), peak,
                      sum(sizes.values()))
