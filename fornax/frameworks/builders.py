"""Graph-building helpers shared by the front ends' lowering tables.

Each helper adds ops to a graph through a small lowering context, so the PyTorch
and JAX tables (:mod:`fornax.frameworks.torch.lowering`,
:mod:`fornax.frameworks.jax.primitives`) build the same subgraph for the same
problem.  A context provides:

* ``op(name, *values, **attrs)``: a graph op;
* ``scalar(value, dtype)``: a 0-d constant of a :class:`~fornax.layers.graph.DType`;
* ``cast(value, dtype)``: a cast (none when the dtype already matches);
* ``const(array)``: a constant array;
* ``fail(why)``: the front end's "not lowerable" exception, to raise.

What is here: layout shorthands, ``trunc``/``expm1``/``log1p`` without
cancellation, reductions by pairwise halving, inclusive prefix scans,
arg-extreme selection rounds (top-k) and a bitonic sorting network (sort,
argsort, large top-k), all from the graph IR's primitive ops.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np

from ..layers.graph import DType, Value

#: the longest axis the bitonic network sorts (2**16 elements: 136 compare-exchange stages)
MAX_SORT = 1 << 16
#: top-k up to this k runs as k selection rounds; a larger k sorts
MAX_SELECT = 64


# ---- layout shorthands -------------------------------------------------------------------------
def reshape(ctx, v: Value, shape) -> Value:
    shape = tuple(int(d) for d in shape)
    return v if tuple(v.shape) == shape else ctx.op("reshape", v, shape=shape)


def permute(ctx, v: Value, perm) -> Value:
    perm = tuple(int(p) for p in perm)
    return v if perm == tuple(range(len(v.shape))) else ctx.op("transpose", v, perm=perm)


def broadcast(ctx, v: Value, shape) -> Value:
    shape = tuple(int(d) for d in shape)
    return v if tuple(v.shape) == shape else ctx.op("broadcast_to", v, shape=shape)


def full(ctx, shape, value, dtype: DType) -> Value:
    """A tensor of ``shape`` filled with ``value`` (a broadcast scalar constant)."""
    return broadcast(ctx, ctx.scalar(value, dtype), shape)


def _combine(ctx, combine: str | Callable) -> Callable:
    """An op name or a ``(a, b) -> Value`` function as a function."""
    if callable(combine):
        return combine
    return lambda a, b: ctx.op(combine, a, b)


# ---- elementwise ---------------------------------------------------------------------------------
def trunc(ctx, x: Value) -> Value:
    """Round toward zero (integers pass through)."""
    if not x.dtype.is_float:
        return x
    return ctx.op("where", ctx.op("lt", x, ctx.scalar(0, x.dtype)), ctx.op("ceil", x), ctx.op("floor", x))


def expm1(ctx, x: Value) -> Value:
    """exp(x) - 1 without cancellation near 0 (Kahan: (u-1)·(x/log u), u = exp x).

    ``x / log u`` is formed first so that a large finite ``u`` does not overflow the product."""
    dt = x.dtype
    u = ctx.op("exp", x)
    one = ctx.scalar(1, dt)
    um1 = ctx.op("sub", u, one)
    good = ctx.op("mul", um1, ctx.op("div", x, ctx.op("log", u)))
    r = ctx.op("where", ctx.op("eq", u, one), x, good)
    r = ctx.op("where", ctx.op("eq", u, ctx.scalar(0, dt)), ctx.scalar(-1, dt), r)
    return ctx.op("where", ctx.op("eq", u, ctx.scalar(math.inf, dt)), u, r)


def log1p(ctx, x: Value) -> Value:
    """log(1 + x) without cancellation near 0 (Kahan: log(u)·(x/(u-1)), u = 1 + x).

    ``x / (u - 1)`` is formed first so that a large ``x`` does not overflow the product."""
    dt = x.dtype
    one = ctx.scalar(1, dt)
    u = ctx.op("add", x, one)
    good = ctx.op("mul", ctx.op("log", u), ctx.op("div", x, ctx.op("sub", u, one)))
    r = ctx.op("where", ctx.op("eq", u, one), x, good)
    return ctx.op("where", ctx.op("eq", u, ctx.scalar(math.inf, dt)), u, r)


# ---- reductions and scans ----------------------------------------------------------------------------
def halving(ctx, x: Value, axis: int, combine: str | Callable, unit) -> Value:
    """Reduce one axis (kept, size 1) by pairwise ``combine`` in log2(n) steps; odd lengths
    pad with ``unit``.  For reductions the graph IR has no op for (product, bitwise and/or/xor)."""
    fn = _combine(ctx, combine)
    r = len(x.shape)
    while x.shape[axis] > 1:
        if x.shape[axis] % 2:
            pads = [(0, 0)] * r
            pads[axis] = (0, 1)
            x = ctx.op("pad", x, pads=tuple(pads), value=unit)
        start, step = [0] * r, [1] * r
        step[axis] = 2
        a = ctx.op("slice", x, start=tuple(start), stop=tuple(x.shape), step=tuple(step))
        start[axis] = 1
        b = ctx.op("slice", x, start=tuple(start), stop=tuple(x.shape), step=tuple(step))
        x = fn(a, b)
    return x


def scan(ctx, x: Value, axis: int, combine: str | Callable, unit, reverse: bool = False) -> Value:
    """Inclusive prefix scan along ``axis`` (Hillis-Steele: log2(n) shifted combines); with
    ``reverse`` the scan runs from the end of the axis.  ``combine`` must be associative;
    ``unit`` is its identity (what shifted-in positions hold)."""
    fn = _combine(ctx, combine)
    r, n = len(x.shape), x.shape[axis]
    k = 1
    while k < n:
        start, stop = [0] * r, list(x.shape)
        pads = [(0, 0)] * r
        if reverse:
            start[axis] = k
            pads[axis] = (0, k)
        else:
            stop[axis] = n - k
            pads[axis] = (k, 0)
        shifted = ctx.op("pad", ctx.op("slice", x, start=tuple(start), stop=tuple(stop)), pads=tuple(pads),
                         value=unit)
        x = fn(x, shifted)
        k *= 2
    return x


# ---- selection and sorting ------------------------------------------------------------------------------
def select_extremes(ctx, x: Value, k: int, d: int, largest: bool) -> tuple[Value, Value]:
    """The k largest (smallest) entries along ``d`` in order, and their int64 indices: k rounds of
    "the first not-yet-taken position holding the extreme value".  NaN counts as the
    largest value; ties go to the lower index (a stable order)."""
    if x.dtype is DType.BOOL:
        x = ctx.cast(x, DType.INT32)
    dt = x.dtype
    if dt.is_float:
        fill = -math.inf if largest else math.inf
        nan = ctx.op("isnan", x)
    else:
        info = np.iinfo(dt.numpy)
        fill = int(info.min if largest else info.max)
        nan = None
    red = "reduce_max" if largest else "reduce_min"
    pos_ = ctx.op("iota", shape=tuple(x.shape), axis=d, dtype="int64")
    taken = full(ctx, x.shape, False, DType.BOOL)
    i32 = functools.partial(ctx.cast, dtype=DType.INT32)
    vals, idxs = [], []
    for _ in range(k):
        avail = ctx.op("logical_not", taken)
        ok = avail if nan is None else ctx.op("logical_and", avail, ctx.op("logical_not", nan))
        m = ctx.op(red, ctx.op("where", ok, x, ctx.scalar(fill, dt)), axis=d, keepdims=True)
        pick = ctx.op("logical_and", ok, ctx.op("eq", x, m))
        if nan is not None:
            nan_av = ctx.op("logical_and", avail, nan)
            if largest:
                first = ctx.op("reduce_max", i32(nan_av), axis=d, keepdims=True)
                pick = ctx.op("where", ctx.op("gt", first, ctx.scalar(0, DType.INT32)), nan_av, pick)
            else:
                any_ok = ctx.op("reduce_max", i32(pick), axis=d, keepdims=True)
                pick = ctx.op("where", ctx.op("gt", any_ok, ctx.scalar(0, DType.INT32)), pick, nan_av)
        idx = ctx.op("argmax", i32(pick), axis=d, keepdims=True)
        vals.append(ctx.op("gather", x, idx, axis=d))
        idxs.append(idx)
        taken = ctx.op("logical_or", taken, ctx.op("eq", pos_, idx))
    cat = (lambda vs: vs[0] if len(vs) == 1 else ctx.op("concat", *vs, axis=d))
    return cat(vals), cat(idxs)


def _extremes(dt: DType) -> tuple:
    """(largest, smallest) value of a dtype, infinities for floats."""
    if dt.is_float:
        return math.inf, -math.inf
    info = np.iinfo(dt.numpy)
    return int(info.max), int(info.min)


def sort_order(ctx, keys: list[Value], d: int, descending: bool = False) -> Value:
    """The int64 positions along ``d`` that sort ``keys`` (one shape) lexicographically: a
    stable bitonic network of log2(N) (log2(N) + 1) / 2 compare-exchange stages for N the
    axis length padded to a power of 2, each an ``index_select`` of every element's partner
    and a select.  NaN compares as the largest value (last ascending, first descending);
    -0.0 and 0.0 are equal; equal keys keep their index order.

    Elements compare by their keys, then by their rank (the index).  With one key, NaN
    and the padding become extreme values whose rank, shifted by a multiple of N, puts
    them after every real element of the same value (NaN before them when descending).
    With several keys a class key goes first (the first key's NaN after the real values,
    before them descending, and the padding last) and every later float key is preceded
    by its NaN flag."""
    keys = [ctx.cast(k, DType.INT32) if k.dtype is DType.BOOL else k for k in keys]
    shape = tuple(keys[0].shape)
    r, n = len(shape), shape[d]
    if n > MAX_SORT:
        raise ctx.fail(f"sorting {n} elements along one axis; fornax's bitonic network sorts at most {MAX_SORT}")
    perm = [a for a in range(r) if a != d] + [d]
    rows = math.prod(shape) // n
    big = 1 << max(0, (n - 1).bit_length())
    ahead = "gt" if descending else "lt"
    pos = np.arange(big, dtype=np.int64)
    rank = ctx.const(pos.reshape(1, big))
    rows_of = (lambda k: reshape(ctx, permute(ctx, k, perm), (rows, n)))
    padded = (lambda v, value: v if big == n else ctx.op("pad", v, pads=((0, 0), (0, big - n)), value=value))
    cmp: list[Value] = []                           # the compared keys, each (rows, big)
    if len(keys) == 1:
        v = rows_of(keys[0])
        top, bottom = _extremes(v.dtype)
        if v.dtype.is_float:                        # rank classes: NaN first descending, last ascending
            nan = ctx.op("isnan", v)
            v = ctx.op("where", nan, ctx.scalar(top, v.dtype), v)
            shift = ctx.op("where", nan, ctx.scalar(-big if descending else big, DType.INT64),
                           ctx.scalar(0, DType.INT64))
            rank = ctx.op("add", rank, padded(shift, 0))
        if big != n:
            rank = ctx.op("add", rank, ctx.const(np.where(pos >= n, 2 * big, 0).reshape(1, big)))
        cmp.append(padded(v, bottom if descending else top))
    else:
        cls = full(ctx, (rows, n), 0, DType.INT32)
        for i, key in enumerate(keys):
            v = rows_of(key)
            if v.dtype.is_float:
                nan = ctx.op("isnan", v)
                v = ctx.op("where", nan, ctx.scalar(0, v.dtype), v)
                if i == 0:
                    cls = ctx.cast(nan, DType.INT32)
                    if descending:
                        cls = ctx.op("neg", cls)
                else:
                    cmp.append(padded(ctx.cast(nan, DType.INT32), 0))
            cmp.append(padded(v, 0))
        cmp.insert(0, padded(cls, 2))              # compared ascending: the padding is always last
    rank = broadcast(ctx, rank, (rows, big))
    k = 2
    while k <= big:
        j = k // 2
        while j >= 1:
            partner = pos ^ j
            p = ctx.const(partner)
            pr = ctx.op("index_select", rank, p, axis=1)
            pvs = [ctx.op("index_select", v, p, axis=1) for v in cmp]
            before = ctx.op("lt", rank, pr)
            for i in reversed(range(len(cmp))):
                v, pv = cmp[i], pvs[i]
                way = "lt" if i == 0 and len(keys) > 1 else ahead
                before = ctx.op("logical_or", ctx.op(way, v, pv),
                                ctx.op("logical_and", ctx.op("eq", v, pv), before))
            first = ctx.const(((pos < partner) == ((pos & k) == 0)).reshape(1, big))
            swap = ctx.op("ne", first, before)      # this slot takes the earlier one of its pair
            cmp = [ctx.op("where", swap, pv, v) for v, pv in zip(cmp, pvs)]
            rank = ctx.op("where", swap, pr, rank)
            j //= 2
        k *= 2
    order = ctx.op("remainder", rank, ctx.scalar(big, DType.INT64))   # the rank classes shift by big
    if big != n:
        order = ctx.op("slice", order, start=(0, 0), stop=(rows, n))
    inv = [perm.index(a) for a in range(r)]
    return permute(ctx, reshape(ctx, order, [shape[a] for a in perm]), inv)


def bitonic_sort(ctx, x: Value, d: int, descending: bool) -> tuple[Value, Value]:
    """``x`` sorted along ``d`` (stable, NaN the largest value) and the int64 indices that sort it
    (:func:`sort_order`); the values come back by a gather from ``x`` itself."""
    i = sort_order(ctx, [x], d, descending)
    return ctx.op("gather", x, i, axis=d), i


def top_k(ctx, x: Value, k: int, d: int, largest: bool) -> tuple[Value, Value]:
    """The k largest (smallest) values along ``d`` in order and their int64 indices; NaN is the
    largest value and equal values come lower index first.  Up to :data:`MAX_SELECT` by
    selection rounds, more by a sort."""
    if k <= MAX_SELECT:
        return select_extremes(ctx, x, k, d, largest)
    vals, idx = bitonic_sort(ctx, x, d, largest)
    stop = tuple(k if a == d else s for a, s in enumerate(x.shape))
    cut = (lambda t: ctx.op("slice", t, start=(0,) * len(x.shape), stop=stop))
    return cut(vals), cut(idx)
