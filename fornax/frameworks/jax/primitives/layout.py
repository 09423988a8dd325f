"""Lowering rules of jax's shape and layout primitives: ``broadcast_in_dim``, ``reshape``,
``squeeze``, ``transpose``, ``rev``, ``slice``, ``concatenate``, ``split``, ``iota`` and
``pad`` (XLA's, with interior and negative padding).  Dynamic shapes are refused.
"""

from __future__ import annotations

import numpy as np

from ....layers.graph import Value
from ... import builders as B
from ..lowering import device_dtype, lowering
from .common import ints, out_shape


@lowering("broadcast_in_dim")
def broadcast_in_dim(ctx, eqn, x, *dyn):
    if dyn:
        raise ctx.fail("dynamic shapes are not supported")
    shape = ints(eqn.params["shape"])
    inter = [1] * len(shape)
    for i, d in enumerate(eqn.params["broadcast_dimensions"]):
        inter[int(d)] = x.shape[i]
    return B.broadcast(ctx, B.reshape(ctx, x, inter), shape)


@lowering("reshape")
def reshape(ctx, eqn, x, *dyn):
    if dyn:
        raise ctx.fail("dynamic shapes are not supported")
    dims = eqn.params.get("dimensions")
    if dims is not None:
        x = B.permute(ctx, x, ints(dims))
    return B.reshape(ctx, x, ints(eqn.params["new_sizes"]))


@lowering("squeeze")
def squeeze(ctx, eqn, x):
    return B.reshape(ctx, x, out_shape(eqn))


@lowering("transpose")
def transpose(ctx, eqn, x):
    return B.permute(ctx, x, ints(eqn.params["permutation"]))


@lowering("rev")
def rev(ctx, eqn, x):
    for d in sorted({int(d) for d in eqn.params["dimensions"]}):
        n = x.shape[d]
        if n > 1:
            x = ctx.op("index_select", x, ctx.const(np.arange(n - 1, -1, -1, dtype=np.int64)), axis=d)
    return x


@lowering("slice")
def slice_(ctx, eqn, x):
    start = ints(eqn.params["start_indices"])
    stop = ints(eqn.params["limit_indices"])
    step = ints(eqn.params["strides"] or (1,) * len(start))
    if start == (0,) * len(start) and stop == tuple(x.shape) and set(step) <= {1}:
        return x
    return ctx.op("slice", x, start=start, stop=stop, step=step)


@lowering("concatenate")
def concatenate(ctx, eqn, *xs):
    if len(xs) == 1:
        return xs[0]
    return ctx.op("concat", *xs, axis=int(eqn.params["dimension"]))


@lowering("split")
def split(ctx, eqn, x):
    axis = int(eqn.params["axis"])
    outs, at = [], 0
    for n in ints(eqn.params["sizes"]):
        start, stop = [0] * len(x.shape), list(x.shape)
        start[axis], stop[axis] = at, at + n
        outs.append(x if n == x.shape[axis] else ctx.op("slice", x, start=tuple(start), stop=tuple(stop)))
        at += n
    return outs


@lowering("iota")
def iota(ctx, eqn, *dyn):
    if dyn:
        raise ctx.fail("dynamic shapes are not supported")
    jdt = eqn.params["dtype"]
    r = ctx.op("iota", shape=ints(eqn.params["shape"]), axis=int(eqn.params["dimension"]), dtype="int64")
    r = ctx.cast(r, device_dtype(jdt))
    return r if device_dtype(jdt).is_float else ctx.wrap(r, jdt)


def _pad_value(v: Value):
    """The number a constant 0-d padding value holds, or None for a computed one."""
    if v.const is None:
        return None
    value = np.asarray(v.const).reshape(()).item()
    return int(value) if isinstance(value, bool) else value


def _pad_block(ctx, x, axis, lo, hi, value, fill):
    """x with ``lo``/``hi`` (>= 0) padding elements before/after along ``axis``: the ``pad`` op for
    a constant value, a concat of broadcast ``fill`` blocks for a computed one."""
    if lo == 0 and hi == 0:
        return x
    if value is not None:
        pads = [(0, 0)] * len(x.shape)
        pads[axis] = (lo, hi)
        return ctx.op("pad", x, pads=tuple(pads), value=value)

    def block(n):
        shape = list(x.shape)
        shape[axis] = n
        return [B.broadcast(ctx, fill, shape)] if n else []
    return ctx.op("concat", *block(lo), x, *block(hi), axis=axis)


@lowering("pad")
def pad(ctx, eqn, x, fill):
    """XLA's pad: ``interior`` values between elements (a new axis padded after each element,
    merged back and its tail cut), then ``lo``/``hi`` at the ends; negative ``lo``/``hi``
    crop (after padding, so a crop may reach into the other end's padding)."""
    value = _pad_value(fill)
    for axis, (lo, hi, interior) in enumerate(eqn.params["padding_config"]):
        lo, hi, interior = int(lo), int(hi), int(interior)
        n = x.shape[axis]
        if interior and n > 1:
            shape = list(x.shape)
            x = B.reshape(ctx, x, shape[:axis + 1] + [1] + shape[axis + 1:])
            x = _pad_block(ctx, x, axis + 1, 0, interior, value, fill)
            x = B.reshape(ctx, x, shape[:axis] + [n * (interior + 1)] + shape[axis + 1:])
            start, stop = [0] * len(shape), list(x.shape)
            stop[axis] = n + (n - 1) * interior
            x = ctx.op("slice", x, start=tuple(start), stop=tuple(stop))
        x = _pad_block(ctx, x, axis, max(lo, 0), max(hi, 0), value, fill)
        if lo < 0 or hi < 0:
            start, stop = [0] * len(x.shape), list(x.shape)
            start[axis], stop[axis] = max(-lo, 0), x.shape[axis] - max(-hi, 0)
            x = ctx.op("slice", x, start=tuple(start), stop=tuple(stop))
    return x
