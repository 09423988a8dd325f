"""Lowering rules of jax's sorting: ``sort`` and ``top_k``.

``sort`` puts NaN last and treats -0.0 and 0.0 as equal (jax's sort comparator), and is
always stable; ``top_k`` follows XLA's total order (NaN largest, 0.0 above -0.0) and takes
equal values lower index first.  A NaN's sign is not observable in the graph IR: every NaN
counts as positive.  Refused: ``sort`` along axes longer than
:data:`~fornax.frameworks.builders.MAX_SORT`.
"""

from __future__ import annotations

import math

from ....layers.graph import DType
from ... import builders as B
from ..lowering import device_dtype, lowering
from .common import out_dtype, scalar_like, where


@lowering("sort")
def sort(ctx, eqn, *operands):
    """Every operand permuted by the stable lexicographic order of the first ``num_keys``."""
    d = int(eqn.params["dimension"])
    keys = list(operands[:int(eqn.params["num_keys"])])
    order = B.sort_order(ctx, keys, d)
    return [ctx.op("gather", v, order, axis=d) for v in operands]


@lowering("top_k")
def top_k(ctx, eqn, x):
    """The k largest along ``axis`` by XLA's total order: NaN above everything (a NaN's sign is
    not observable in the graph IR, so every NaN counts as positive), 0.0 above -0.0, equal
    values lower index first.  Narrower floats compare as float64 with -0.0 moved to the
    negative subnormal nearest zero (below every value they can hold); float64 sorts by
    value and then the sign of zero."""
    k = int(eqn.params["k"])
    d = int(eqn.params.get("axis", len(x.shape) - 1))
    idx_dt = device_dtype(out_dtype(eqn, 1))
    if not x.dtype.is_float:
        vals, idx = B.top_k(ctx, x, k, d, True)
        return vals, ctx.cast(idx, idx_dt)
    wide = ctx.cast(x, DType.FLOAT64)
    zero = scalar_like(ctx, wide, 0)
    neg_zero = ctx.op("logical_and", ctx.op("eq", wide, zero), ctx.op("lt", ctx.op("reciprocal", wide), zero))
    if x.dtype is not DType.FLOAT64:
        key = where(ctx, neg_zero, scalar_like(ctx, wide, -math.ldexp(1.0, -1074)), wide)
        vals, idx = B.top_k(ctx, key, k, d, True)
        return ctx.cast(vals, x.dtype), ctx.cast(idx, idx_dt)
    pos_zero = ctx.op("logical_and", ctx.op("eq", wide, zero), ctx.op("logical_not", neg_zero))
    order = B.sort_order(ctx, [x, ctx.cast(pos_zero, DType.INT32)], d, descending=True)
    stop = tuple(k if a == d else n for a, n in enumerate(x.shape))
    idx = ctx.op("slice", order, start=(0,) * len(x.shape), stop=stop)
    return ctx.op("gather", x, idx, axis=d), ctx.cast(idx, idx_dt)
