"""Lanes: the static layout of one recorded load or store (for :mod:`.replay`).

A replayed load or store keeps its layout, not its addresses: one ascending run
of elements, an n-d box of elements walked in lane order (a transpose, a
broadcast row, a tile of a matrix: a strided view, no index array), or else the
element indices.  A box is never a guess: it is checked element by element.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .tiles import Index

#: an n-d box of elements: its shape and strides (in elements or bytes, any sign)
Box = tuple[tuple[int, ...], tuple[int, ...]]


def frozen(arr: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A recording's arrays are shared by every replay: make accidental writes fail loudly."""
    arr.flags.writeable = False
    return arr


def find_box(index: Index) -> Box | None:
    """``index`` (element indices in lane order) as a row-major walk of an n-d box from
    ``index[0]``: ``(shape, strides)`` in elements (a stride may be 0 or negative), or None
    when it is not one.  Checked element by element, so a box is never a guess."""
    dims: list[tuple[int, int]] = []
    x = index
    while x.size > 1:
        steps = np.diff(x)
        d = steps[0]
        breaks = np.flatnonzero(steps != d)
        run = x.size if breaks.size == 0 else int(breaks[0]) + 1
        if run < 2 or x.size % run:
            return None
        dims.append((run, int(d)))
        x = x[::run]
    shape = tuple(r for r, _ in reversed(dims))
    strides = tuple(d for _, d in reversed(dims))
    if not np.array_equal(box_index(int(index[0]), shape, strides), index):
        return None
    return shape, strides


def box_index(start: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> Index:
    """The element indices of a box, flat in row-major order."""
    out = np.full(shape, start, dtype=np.int64)
    for axis, (r, d) in enumerate(zip(shape, strides)):
        out += (np.arange(r, dtype=np.int64) * d).reshape((r,) + (1,) * (len(shape) - axis - 1))
    return out.ravel()


def one_to_one(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether a box's elements are all distinct (a mixed-radix layout: each stride clears
    the span of the smaller ones), so a store into it writes each element once."""
    span = 0
    for r, d in sorted(zip(shape, (abs(d) for d in strides)), key=lambda e: e[1]):
        if d <= span:
            return False
        span += (r - 1) * d
    return True


class Lanes:
    """The static layout of one load or store: which elements of its buffer it touches.

    ``lo``/``hi``: byte offsets (from the pointer argument) of the first and last active
    element; ``start``/``count``: the first active element and how many there are.  They
    are one ascending run (``box`` and ``index`` None), an n-d box walked in lane order
    (``box``: shape and byte strides; a store's box never repeats an element), or
    ``index``: the elements in lane order.  ``mask``: the lanes that are active, when not
    all are; ``shape``: the register (load) or lane (store) shape; ``vshape``: a store's
    value register as the store aligns it, before broadcasting."""

    __slots__ = ("ptr", "dtype", "itemsize", "shape", "mask", "lo", "hi", "start", "count", "index",
                 "box", "vshape")

    def __init__(self, ptr: str, dtype: np.dtype[Any], shape: tuple[int, ...],
                 mask: npt.NDArray[np.bool_] | None, lo: int, hi: int, start: int, count: int,
                 index: Index | None, box: Box | None, vshape: tuple[int, ...] | None):
        self.ptr, self.dtype, self.itemsize, self.shape = ptr, dtype, dtype.itemsize, shape
        self.mask, self.lo, self.hi, self.start, self.count = mask, lo, hi, start, count
        self.index, self.box, self.vshape = index, box, vshape

    @classmethod
    def of(cls, ptr: str, active: Index, shape: tuple[int, ...], mask: npt.NDArray[np.bool_] | None,
           dtype: np.dtype[Any], vshape: tuple[int, ...] | None = None,
           store: bool = False) -> Lanes | None:
        """The layout of the ``active`` lanes' element offsets (in lane order) of an access
        of ``shape`` lanes; None when there are none."""
        if active.size == 0:
            return None
        isz = dtype.itemsize
        uniform = cls._uniform(ptr, active, shape, mask, dtype, vshape, store)
        if uniform is not None:
            return uniform
        index = np.array(active, dtype=np.int64).ravel()
        lo, hi = int(index.min()), int(index.max())
        if lo < -(1 << 59) or hi >= 1 << 59:
            # byte offsets wrap around int64 like the plain path's addresses do
            index = index * isz // isz
            lo, hi = int(index.min()), int(index.max())
        start, count = int(index[0]), int(index.size)
        # strictly ascending over a span of count - 1: every step is 1 (no temporary of int64s)
        run = count == int(index[-1]) - start + 1 and (count == 1 or bool((index[1:] > index[:-1]).all()))
        box: Box | None = None
        kept: Index | None = None
        if not run:
            found = find_box(index)
            if found is not None and (not store or one_to_one(*found)):
                box = (found[0], tuple(d * isz for d in found[1]))
            else:
                kept = frozen(index)
        active_mask = None if mask is None or mask.all() else frozen(np.array(mask, dtype=bool))
        return cls(ptr, dtype, shape, active_mask, lo * isz, hi * isz, start, count, kept, box, vshape)

    @classmethod
    def _uniform(cls, ptr: str, active: Index, shape: tuple[int, ...], mask: npt.NDArray[np.bool_] | None,
                 dtype: np.dtype[Any], vshape: tuple[int, ...] | None, store: bool) -> Lanes | None:
        """The layout of a load whose every active lane reads one element (its offsets
        broadcast from one value): what :meth:`of` finds, a box of stride 0, without making
        the index; None for anything else."""
        if store or active.size < 2 or any(active.strides):
            return None
        value = int(active.flat[0])
        if not -(1 << 59) <= value < 1 << 59:
            return None
        isz, count = dtype.itemsize, int(active.size)
        active_mask = None if mask is None or mask.all() else frozen(np.array(mask, dtype=bool))
        return cls(ptr, dtype, shape, active_mask, value * isz, value * isz, value, count, None,
                   ((count,), (0,)), vshape)

    def nbytes(self) -> int:
        """The bytes of the arrays this layout holds (its mask and index)."""
        return sum(a.nbytes for a in (self.mask, self.index) if a is not None)

    def addresses(self, base: int) -> Index:
        """The active lanes' byte addresses for pointer ``base``, in lane order: what the
        plain path would gather from or scatter to."""
        if self.index is not None:
            index = self.index
        elif self.box is not None:
            shape, strides = self.box
            index = box_index(self.start, shape, tuple(d // self.itemsize for d in strides))
        else:
            index = np.arange(self.start, self.start + self.count, dtype=np.int64)
        return base + index * self.itemsize
