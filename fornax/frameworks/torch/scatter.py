"""Scatter of many rows (``index_put`` / ``index_copy`` / ``index_add`` with long index lists)
by sorting the indices instead of walking them.

The graph ``scatter`` op compiles to a pull-form kernel: every output element walks the
whole update list in order.  That is exact and deterministic, but its loop runs once per
update, serially: 40,000 updates are 40,000 trips round a loop for every launch.  For
long update lists this module builds the same result from data-parallel pieces:

1. a stable sort of the row indices (:func:`fornax.frameworks.builders.sort_order`, a
   bitonic network): equal indices keep their update order;
2. for each destination row, the range of sorted positions that name it, by a binary
   search over the sorted indices (log2(N) gathers);
3. ``set``: the last update of the range (the one a sequential loop leaves behind: the
   result CPU's deterministic mode gives); ``add``: the range's sum, read off an inclusive
   prefix sum taken in a wide accumulator (float64 for floating dtypes, int64 for integers)
   so that the difference of two prefixes loses nothing the row sum would not.

Rows no index names keep their values.  Bool updates, short lists and lists beyond the
sort network's size keep the graph ``scatter``.
"""

from __future__ import annotations

import numpy as np

from fornax.frameworks.builders import MAX_SORT, broadcast, reshape, scan, sort_order
from fornax.layers.graph import DType, Value

#: update lists at least this long take the sorted path
MIN_SORTED = 512


def applies(lin: Value, xr: Value) -> bool:
    """Whether :func:`rows` takes the sorted path (else the graph ``scatter`` is the better one)."""
    return MIN_SORTED <= lin.shape[0] <= MAX_SORT and xr.dtype is not DType.BOOL


def rows(ctx, xr: Value, lin: Value, vals: Value, accumulate: bool) -> Value:
    """``xr`` (A, K, Z) with rows ``lin[j]`` (1-D, N int64 in [0, K)) of axis 1 set to (or
    increased by) ``vals[:, j, :]`` (A, N, Z), in update order (see :func:`applies`)."""
    k = xr.shape[1]
    order = sort_order(ctx, [lin], 0)                              # stable: update order kept
    keys = ctx.op("index_select", lin, order, axis=0)              # the sorted row indices
    slots = ctx.const(np.arange(k, dtype=np.int64))
    start = _count(ctx, keys, slots, "lt")                         # updates naming a smaller row
    end = _count(ctx, keys, slots, "le")                           # ... a row up to this one
    hit = reshape(ctx, ctx.op("gt", end, start), (1, k, 1))
    if not accumulate:
        last = ctx.op("maximum", ctx.op("sub", end, ctx.scalar(1, DType.INT64)), ctx.scalar(0, DType.INT64))
        row = ctx.op("index_select", order, last, axis=0)
        new = ctx.op("index_select", vals, row, axis=1)
        return ctx.op("where", _wide(ctx, hit, xr.shape), new, xr)
    wide = DType.FLOAT64 if xr.dtype.is_float else DType.INT64
    sorted_vals = ctx.cast(ctx.op("index_select", vals, order, axis=1), wide)
    prefix = scan(ctx, sorted_vals, 1, "add", 0)
    prefix = ctx.op("pad", prefix, pads=((0, 0), (1, 0), (0, 0)), value=0)    # prefix[0] = 0
    total = ctx.op("sub", ctx.op("index_select", prefix, end, axis=1),
                   ctx.op("index_select", prefix, start, axis=1))
    summed = ctx.cast(ctx.op("add", ctx.cast(xr, wide), total), xr.dtype)
    return ctx.op("where", _wide(ctx, hit, xr.shape), summed, xr)


def _wide(ctx, v: Value, shape) -> Value:
    return broadcast(ctx, v, shape)


def _count(ctx, keys: Value, targets: Value, cmp: str) -> Value:
    """For each target t: how many of the ascending ``keys`` satisfy ``key cmp t`` (``lt``:
    the lower bound of t, ``le``: its upper bound), by a branch-free binary search."""
    n = keys.shape[0]
    i64 = DType.INT64
    pos = ctx.op("mul", targets, ctx.scalar(0, i64))               # zeros shaped like targets
    step = 1 << (n.bit_length() - 1)
    while step >= 1:
        cand = ctx.op("add", pos, ctx.scalar(step, i64))
        inside = ctx.op("le", cand, ctx.scalar(n, i64))
        probe = ctx.op("minimum", ctx.op("sub", cand, ctx.scalar(1, i64)), ctx.scalar(n - 1, i64))
        key = ctx.op("index_select", keys, probe, axis=0)
        ok = ctx.op("logical_and", inside, ctx.op(cmp, key, targets))
        pos = ctx.op("where", ok, cand, pos)
        step //= 2
    return pos
