"""A map from disjoint half-open integer ranges to values: the shadow memory of the race
detector (for each byte, the latest access of one queue in one mode).

:meth:`IntervalMap.assign` paints ``[lo, hi)`` with a value, cutting the ranges it
overlaps at its edges and dropping what it covers; :meth:`IntervalMap.overlapping`
yields the pieces that meet ``[lo, hi)``.  Both cost ``O(log n + k)`` list work for ``k``
pieces touched, and every piece is created once and dropped at most once, so a long run of
accesses stays linear however the ranges overlap.
"""

from __future__ import annotations

import bisect
from typing import Callable, Generic, Iterator, TypeVar

V = TypeVar("V")


class IntervalMap(Generic[V]):
    """Disjoint ``[lo, hi)`` pieces, sorted by start, each with a value."""

    __slots__ = ("_lo", "_hi", "_val")

    def __init__(self) -> None:
        self._lo: list[int] = []
        self._hi: list[int] = []
        self._val: list[V] = []

    def __len__(self) -> int:
        return len(self._lo)

    def _first(self, lo: int) -> int:
        """Index of the first piece that ends after ``lo``."""
        i = bisect.bisect_right(self._lo, lo) - 1
        if i >= 0 and self._hi[i] > lo:
            return i
        return i + 1

    def overlapping(self, lo: int, hi: int) -> Iterator[tuple[int, int, V]]:
        """The pieces ``(lo, hi, value)`` that share at least one point with ``[lo, hi)``."""
        i, los, his, vals = self._first(lo), self._lo, self._hi, self._val
        while i < len(los) and los[i] < hi:
            yield los[i], his[i], vals[i]
            i += 1

    def assign(self, lo: int, hi: int, value: V | None) -> None:
        """Paint ``[lo, hi)`` with ``value`` (``None`` clears it)."""
        if hi <= lo:
            return
        los, his, vals = self._lo, self._hi, self._val
        i = self._first(lo)
        j = i
        while j < len(los) and los[j] < hi:
            j += 1
        keep_lo: list[tuple[int, int, V]] = []
        if i < j:
            if los[i] < lo:                                  # the first piece starts before: keep its head
                keep_lo.append((los[i], lo, vals[i]))
            if his[j - 1] > hi:                              # the last piece ends after: keep its tail
                tail = (hi, his[j - 1], vals[j - 1])
            else:
                tail = None
        else:
            tail = None
        pieces = keep_lo + ([(lo, hi, value)] if value is not None else []) + ([tail] if tail else [])
        los[i:j] = [p[0] for p in pieces]
        his[i:j] = [p[1] for p in pieces]
        vals[i:j] = [p[2] for p in pieces]

    def drop_if(self, dead: Callable[[V], bool]) -> None:
        """Remove every piece whose value ``dead`` accepts."""
        keep = [k for k, v in enumerate(self._val) if not dead(v)]
        if len(keep) == len(self._val):
            return
        self._lo = [self._lo[k] for k in keep]
        self._hi = [self._hi[k] for k in keep]
        self._val = [self._val[k] for k in keep]
