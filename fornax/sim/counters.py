"""Counters: what one kernel launch did, counted for the cost model.

The interpreter (:mod:`.interpreter`) fills them as it runs; a replayed launch
(:mod:`.replay`) takes them from its recording, rebased on the launch's pointers;
the cost model (:mod:`.cost`) prices them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

#: a kernel's price memo, kept by a replay recording and filled by the device that prices
#: it: (tile, footprint bytes) -> (the chip spec, its kernel cost)
PriceMemo = dict[tuple[tuple[object, ...], int], tuple[object, object]]

#: per buffer parameter: the absolute byte range [lo, hi) touched
Ranges = dict[str, tuple[int, int]]


@dataclass
class Counters:
    """What one kernel execution did, counted for the cost model."""

    instances: int = 0
    matrix_flops: dict[str, float] = field(default_factory=dict)
    vector_flops: dict[str, float] = field(default_factory=dict)
    bytes_read: int = 0
    bytes_written: int = 0
    instructions: int = 0
    #: per touched buffer parameter: the absolute byte range [lo, hi) read / written
    read_ranges: Ranges = field(default_factory=dict)
    write_ranges: Ranges = field(default_factory=dict)
    #: a replayed launch's recording memo of the device's prices for this work (None when
    #: the launch was not replayed); no part of what was counted
    pricing: PriceMemo | None = field(default=None, compare=False, repr=False)

    def add_flops(self, table: dict[str, float], dtype: str, n: float) -> None:
        table[dtype] = table.get(dtype, 0.0) + float(n)

    def touch(self, table: Ranges, name: str, addrs: npt.NDArray[np.int64], itemsize: int) -> None:
        if addrs.size == 0:
            return
        self.touch_range(table, name, int(addrs.min()), int(addrs.max()) + itemsize)

    def touch_range(self, table: Ranges, name: str, lo: int, hi: int) -> None:
        if name in table:
            lo, hi = min(lo, table[name][0]), max(hi, table[name][1])
        table[name] = (lo, hi)

    @property
    def footprint_bytes(self) -> int:
        """Distinct bytes the kernel touched (an upper bound: the span of each buffer's accesses)."""
        spans = list(self.read_ranges.values()) + list(self.write_ranges.values())
        spans.sort()
        total, end = 0, None
        for lo, hi in spans:
            if end is None or lo >= end:
                total += hi - lo
                end = hi
            elif hi > end:
                total += hi - end
                end = hi
        return total
