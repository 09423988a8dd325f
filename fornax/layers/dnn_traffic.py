"""Memory traffic and cost estimates of the DNN library's kernels (:mod:`fornax.layers.codegen_dnn`).

The executor counts a load or store as its active lanes times the item size,
and each buffer's footprint as the byte span its active lanes touch.  Which
lanes are active depends on the masks, so the DNN generators count the
traffic from the geometry (padding, stride and dilation taps, ragged edge
tiles, the ``store_reduce`` flush) into a :class:`Traffic`; FLOPs and
instruction counts follow from tile shapes alone
(:func:`~fornax.layers.kernel_estimate.static_counters`).  :func:`attach`
stores the estimate of a kernel specialised for its whole launch,
:func:`attach_sliced` that of a kernel generic over one grid axis (the counts
of one slice plus what each further slice adds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..sim import isa
from .kernel_builder import Grid, Instruction
from .kernel_estimate import Estimate, static_counters

#: a byte range [lo, hi) relative to a buffer's base; None when no lane is active
Span = Sequence[int] | None
#: taps along one axis: how many (position, tap) pairs are valid, the least and greatest reached
Taps = tuple[int, int, int]


class Traffic:
    """Memory traffic of one launch, counted from the geometry the way the executor counts it:
    active lanes times the item size, and per buffer the byte span [lo, hi) the active lanes
    touch (relative to the buffer's base)."""

    def __init__(self) -> None:
        self.read = 0
        self.written = 0
        self.flops: dict[str, float] = {}
        self.reads: dict[str, list[int]] = {}
        self.writes: dict[str, list[int]] = {}

    @staticmethod
    def _span(table: dict[str, list[int]], ptr: str, span: Span) -> None:
        if span is None:
            return
        lo, hi = int(span[0]), int(span[1])
        if ptr in table:
            lo, hi = min(lo, table[ptr][0]), max(hi, table[ptr][1])
        table[ptr] = [lo, hi]

    def load(self, ptr: str, lanes: int, item: int, span: Span) -> None:
        """``lanes`` active lanes of ``item`` bytes loaded from ``ptr`` within ``span``."""
        self.read += int(lanes) * item
        self._span(self.reads, ptr, span if lanes else None)

    def store(self, ptr: str, lanes: int, item: int, span: Span) -> None:
        """``lanes`` active lanes of ``item`` bytes stored to ``ptr`` within ``span``."""
        self.written += int(lanes) * item
        self._span(self.writes, ptr, span if lanes else None)

    def store_reduce(self, ptr: str, contributions: int, unique: int, item: int, dtype: str,
                     span: Span) -> None:
        """A ``store_reduce``: every contribution is one operation in the destination dtype; the
        flush reads and writes each distinct destination element once."""
        self.flops[dtype] = self.flops.get(dtype, 0.0) + float(contributions)
        self.load(ptr, unique, item, span)
        self.store(ptr, unique, item, span)


def _mask_registers(body: Sequence[Instruction]) -> dict[str, int]:
    """Every mask register a load or store of ``body`` uses (loop bodies included), mapped to 0."""
    masks: dict[str, int] = {}
    for ins in body:
        mask = getattr(ins, "mask", None)
        if mask:
            masks[mask] = 0
        if isinstance(ins, isa.Loop):
            masks.update(_mask_registers(ins.body))
    return masks


def counts(program: isa.Program, grid: Grid, t: Traffic) -> Estimate:
    """The counters estimate of ``program`` on ``grid`` with the memory traffic ``t``."""
    masks = _mask_registers(program.body)
    est = static_counters(program, grid, masks)         # FLOPs and instructions: shapes alone
    for dt, f in t.flops.items():
        est["vector_flops"][dt] = est["vector_flops"].get(dt, 0.0) + f
    est.update(kind="counters", bytes_read=t.read, bytes_written=t.written,
               read=t.reads, write=t.writes)
    return est


def attach(program: isa.Program, grid: Grid, traffic: Traffic) -> isa.Program:
    """Attach the estimate of a kernel specialised for its whole launch."""
    program.meta["estimate"] = counts(program, grid, traffic)
    return program


def attach_sliced(program: isa.Program, axis: int, grid_of: Callable[[int], Grid],
                  traffic_of: Callable[[int], Traffic]) -> isa.Program:
    """Attach the estimate of a kernel generic over grid axis ``axis``: the counts of a one-slice
    launch and, in ``per_slice``, what each further slice adds (every slice does the same work;
    anything shared, like a reduction's destination, is in the one-slice counts only)."""
    one = counts(program, grid_of(1), traffic_of(1))
    two = counts(program, grid_of(2), traffic_of(2))

    def diff(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        return {k: b.get(k, 0.0) - a.get(k, 0.0) for k in set(a) | set(b) if b.get(k, 0.0) != a.get(k, 0.0)}

    one["per_slice"] = {
        "axis": axis, "instances": two["instances"] - one["instances"],
        "matrix_flops": diff(one["matrix_flops"], two["matrix_flops"]),
        "vector_flops": diff(one["vector_flops"], two["vector_flops"]),
        "bytes_read": two["bytes_read"] - one["bytes_read"],
        "bytes_written": two["bytes_written"] - one["bytes_written"],
        "read": {p: two["read"][p][1] - lo_hi[1] for p, lo_hi in one["read"].items()},
        "write": {p: two["write"][p][1] - lo_hi[1] for p, lo_hi in one["write"].items()}}
    program.meta["estimate"] = one
    return program


def window(out: int, taps: int, stride: int, pad: int, dil: int, size: int) -> Taps:
    """Input positions a forward window reaches along one axis: ``o*stride - pad + t*dil`` for
    every output ``o < out`` and tap ``t < taps`` that lands inside ``[0, size)``.  Returns how
    many (output, tap) pairs are valid and the least and greatest position reached."""
    pos = (np.arange(out)[:, None] * stride - pad + np.arange(taps)[None, :] * dil).ravel()
    pos = pos[(pos >= 0) & (pos < size)]
    return (int(pos.size), int(pos.min()), int(pos.max())) if pos.size else (0, 0, 0)


def pull(size: int, taps: int, stride: int, pad: int, dil: int, out: int) -> Taps:
    """The backward (pull) view of :func:`window`: for every input ``i < size`` and tap ``t``,
    the output ``(i + pad - t*dil) / stride`` when that is a whole number in ``[0, out)``.
    Returns the count of valid pairs and the least and greatest output reached."""
    t = (np.arange(size)[:, None] + pad - np.arange(taps)[None, :] * dil).ravel()
    t = t[(t >= 0) & (t % stride == 0)] // stride
    t = t[t < out]
    return (int(t.size), int(t.min()), int(t.max())) if t.size else (0, 0, 0)


def span4(dims: tuple[int, int, int, int], item: int, hs: Taps, ws: Taps) -> list[int] | None:
    """Byte span of an NCHW tensor of ``dims`` whose every image and channel is read at the rows
    ``hs`` and columns ``ws`` (each: count of valid taps, least, greatest); None if none is."""
    N, C, H, W = dims
    if not hs[0] or not ws[0]:
        return None
    last = (N - 1) * C * H * W + (C - 1) * H * W + hs[2] * W + ws[2]
    return [(hs[1] * W + ws[1]) * item, (last + 1) * item]
