"""Managed (unified / shared USM) memory: a :class:`ManagedRegion` knows where each of its
migration granules lives, and :func:`migrate` moves granules between host and device."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ...sim.memory import AddressSpace


@dataclass(eq=False)
class ManagedRegion:
    """A managed allocation and where each of its granules lives."""

    space: AddressSpace
    va: int
    size: int
    granule: int
    on_device: NDArray[np.bool_]     # one bool per migration granule


def overlapping(regions: Iterable[ManagedRegion], space: AddressSpace, lo: int,
                hi: int) -> Iterator[tuple[ManagedRegion, int, int]]:
    """Each region of ``space`` that ``[lo, hi)`` touches, with the touched span as offsets
    into the region."""
    for r in regions:
        if r.space is space and r.va < hi and lo < r.va + r.size:
            yield r, max(lo, r.va) - r.va, min(hi, r.va + r.size) - r.va


def migrate(region: ManagedRegion, lo: int, hi: int, to_device: bool) -> tuple[int, int]:
    """Move the granules of ``[lo, hi)`` (offsets in the region) that are on the other side;
    (granules, bytes) moved."""
    g = region.granule
    sel = slice(lo // g, -(-hi // g))
    moving = np.flatnonzero(region.on_device[sel] != to_device) + sel.start
    if moving.size == 0:
        return 0, 0
    region.on_device[moving] = to_device
    nbytes = int(sum(min(g, region.size - i * g) for i in moving.tolist()))
    return int(moving.size), nbytes
