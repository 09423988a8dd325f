"""Lowering rules of jax's reductions and cumulative scans: ``reduce_sum`` / ``_prod`` /
``_max`` / ``_min`` / ``_and`` / ``_or`` / ``_xor``, ``argmax`` / ``argmin`` and ``cumsum`` /
``cumprod`` / ``cummax`` / ``cummin`` / ``cumlogsumexp``.

Sums and products of float16/bfloat16 accumulate in float32; integers wrap once at the end
(exact mod 2**bits).  The max/min reductions and scans propagate NaN; ``argmax``/``argmin``
take the first NaN as the extreme and the lowest index among ties.
"""

from __future__ import annotations

import math

from ....layers.graph import DType, Value
from ... import builders as B
from ..lowering import device_dtype, device_dtype_of, lowering
from .common import compute_dtype, int_range, out_dtype, out_shape, scalar_like, where


def _axes(eqn) -> list[int]:
    return sorted(int(a) for a in eqn.params["axes"])


def _over_axes(ctx, eqn, x, reduce_one) -> Value:
    """``reduce_one(x, axis)`` (keeping the axis) for each reduced axis, then the result's shape."""
    for a in _axes(eqn):
        x = reduce_one(x, a)
    return B.reshape(ctx, x, out_shape(eqn))


def _accumulating(ctx, eqn, x, reduce_one) -> Value:
    """A sum-like reduction: floats in their compute dtype (float32 for float16/bfloat16),
    integers in their device dtype wrapped once at the end (exact mod 2**bits)."""
    out = device_dtype_of(out_dtype(eqn))
    r = _over_axes(ctx, eqn, ctx.cast(x, compute_dtype(out)), reduce_one)
    return ctx.cast(r, out) if out.is_float else ctx.wrap(r, out_dtype(eqn))


@lowering("reduce_sum")
def reduce_sum(ctx, eqn, x):
    return _accumulating(ctx, eqn, x, lambda v, a: ctx.op("reduce_sum", v, axis=a, keepdims=True))


@lowering("reduce_prod")
def reduce_prod(ctx, eqn, x):
    """Pairwise products in log2(n) steps (the graph IR has no product reduction)."""
    return _accumulating(ctx, eqn, x, lambda v, a: B.halving(ctx, v, a, "mul", 1))


def _minmax(op: str):
    def rule(ctx, eqn, x):
        if x.dtype is DType.BOOL:
            r = _over_axes(ctx, eqn, ctx.cast(x, DType.INT32), lambda v, a: ctx.op(op, v, axis=a, keepdims=True))
            return ctx.cast(r, DType.BOOL)
        return _over_axes(ctx, eqn, x, lambda v, a: ctx.op(op, v, axis=a, keepdims=True))
    return rule


lowering("reduce_max")(_minmax("reduce_max"))
lowering("reduce_min")(_minmax("reduce_min"))


def _bit_reduction(logical: str, bitwise: str, unit_bool: bool, unit_int: int):
    """A reduction by pairwise halving: ``logical`` on bool, ``bitwise`` on integers."""
    def rule(ctx, eqn, x):
        if x.dtype is DType.BOOL:
            return _over_axes(ctx, eqn, x, lambda v, a: B.halving(ctx, v, a, logical, int(unit_bool)))
        return _over_axes(ctx, eqn, x, lambda v, a: B.halving(ctx, v, a, bitwise, unit_int))
    return rule


lowering("reduce_and")(_bit_reduction("logical_and", "bitwise_and", True, -1))
lowering("reduce_or")(_bit_reduction("logical_or", "bitwise_or", False, 0))
lowering("reduce_xor")(_bit_reduction("ne", "bitwise_xor", False, 0))


def _arg(op: str):
    def rule(ctx, eqn, x):
        (axis,) = eqn.params["axes"]
        if x.dtype is DType.BOOL:
            x = ctx.cast(x, DType.INT32)
        r = ctx.op(op, x, axis=int(axis), keepdims=False)
        return ctx.cast(r, device_dtype(eqn.params["index_dtype"]))
    rule.__doc__ = f"The first index of the {op[3:]} along the axis (NaN counts as the extreme)."
    return rule


lowering("argmax")(_arg("argmax"))
lowering("argmin")(_arg("argmin"))


# ---- cumulative ---------------------------------------------------------------------------------------------
def _logaddexp(ctx):
    """log(e^a + e^b) = max + log1p(e^-(max - min)); an infinite max is the answer itself."""
    def combine(a, b):
        hi, lo = ctx.op("maximum", a, b), ctx.op("minimum", a, b)
        r = ctx.op("add", hi, B.log1p(ctx, ctx.op("exp", ctx.op("sub", lo, hi))))
        return where(ctx, ctx.op("eq", ctx.op("abs", hi), scalar_like(ctx, hi, math.inf)), hi, r)
    return combine


def _cumulative(kind: str):
    def rule(ctx, eqn, x):
        axis, reverse = int(eqn.params["axis"]), bool(eqn.params["reverse"])
        jdt = out_dtype(eqn)
        out = device_dtype(jdt)
        v = ctx.cast(x, compute_dtype(out))
        if kind in ("max", "min"):
            if out.is_float:
                unit = -math.inf if kind == "max" else math.inf
            else:
                _, lo, hi, _ = int_range(jdt)
                unit = lo if kind == "max" else hi
            combine = "maximum" if kind == "max" else "minimum"
        elif kind == "logsumexp":
            if not out.is_float:
                raise ctx.fail(f"cumlogsumexp needs a floating-point operand, got {jdt}")
            combine, unit = _logaddexp(ctx), -math.inf
        else:
            combine, unit = ("add", 0) if kind == "sum" else ("mul", 1)
        r = B.scan(ctx, v, axis, combine, unit, reverse)
        return ctx.cast(r, out) if out.is_float else ctx.wrap(r, jdt)
    rule.__doc__ = (f"Inclusive cumulative {kind} along ``axis`` (from the end with ``reverse``); "
                    "float16/bfloat16 in float32, integers wrapped once at the end.")
    return rule


for _kind in ("sum", "prod", "max", "min", "logsumexp"):
    lowering(f"cum{_kind}")(_cumulative(_kind))
