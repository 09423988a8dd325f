"""Lowering rules of jax's arithmetic: ``add``/``sub``/``mul``, ``div``, ``rem``, ``nextafter``,
``max``/``min``, ``clamp`` and ``empty``.

Integer arithmetic wraps in two's complement at the jax type's width, carried integers
included.  Integer ``div`` truncates toward zero, ``rem`` has the dividend's sign; x/0 is -1
(all ones unsigned), x%0 is x, INT_MIN/-1 is INT_MIN.  ``max``/``min`` and ``clamp`` propagate
NaN; where both operands are zeros of different signs, the sign of the result may differ
from XLA's (which orders -0.0 below 0.0).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ....layers.graph import DType, Value
from ..lowering import device_dtype, lowering
from .common import (compute_dtype, float_math, int_range, numeric, out_dtype, out_shape, scalar_like,
                     where, with_sign)


def _binary(op: str):
    def rule(ctx, eqn, a, b):
        if device_dtype(out_dtype(eqn)) is DType.BOOL:
            raise ctx.fail(f"{op} of bool operands")
        return numeric(ctx, eqn, lambda c, x, y: c.op(op, x, y), a, b)
    return rule


lowering("add", "add_any")(_binary("add"))
lowering("sub")(_binary("sub"))
lowering("mul")(_binary("mul"))


def _int_div(ctx, jdt, a, b):
    """Integer division truncating toward zero, with XLA's answers where C has none."""
    _, _, hi, signed = int_range(jdt)
    zero = ctx.op("eq", b, scalar_like(ctx, b, 0))
    if not signed:
        q = ctx.op("floor_divide", a, where(ctx, zero, scalar_like(ctx, b, 1), b))
        return where(ctx, zero, scalar_like(ctx, a, hi), q)
    minus1 = ctx.op("eq", b, scalar_like(ctx, b, -1))
    safe = where(ctx, ctx.op("logical_or", zero, minus1), scalar_like(ctx, b, 1), b)
    q = ctx.op("floor_divide", a, safe)
    inexact = ctx.op("ne", ctx.op("mul", q, safe), a)
    opposite = ctx.op("ne", ctx.op("lt", a, scalar_like(ctx, a, 0)), ctx.op("lt", safe, scalar_like(ctx, b, 0)))
    q = where(ctx, ctx.op("logical_and", inexact, opposite), ctx.op("add", q, scalar_like(ctx, q, 1)), q)
    q = where(ctx, minus1, ctx.op("neg", a), q)                # INT_MIN / -1 wraps to INT_MIN
    return ctx.wrap(where(ctx, zero, scalar_like(ctx, a, -1), q), jdt)


def _constant_of(v: Value):
    """The constant array behind ``v`` (a graph constant, or one broadcast), else None."""
    while v.const is None and v.producer is not None and v.producer.op == "broadcast_to":
        v = v.producer.inputs[0]
    return v.const


@lowering("div")
def div(ctx, eqn, a, b):
    """Float division; by a constant divisor, multiplication by its reciprocal rounded to the
    dtype, as XLA's algebraic simplifier rewrites ``x / c`` (float32/float64 only: narrower
    types are computed in float32 and rounded once).  Integers truncate toward zero."""
    dt = device_dtype(out_dtype(eqn))
    if dt in (DType.FLOAT32, DType.FLOAT64):
        c = _constant_of(b)
        if c is not None:
            recip = ctx.const(np.reciprocal(np.asarray(c, dt.numpy)))
            if tuple(recip.shape) != tuple(b.shape):
                recip = ctx.op("broadcast_to", recip, shape=tuple(b.shape))
            return ctx.op("mul", a, recip)
    if dt.is_float:
        return float_math(ctx, eqn, lambda c, x, y: c.op("div", x, y), a, b)
    return _int_div(ctx, out_dtype(eqn), a, b)


@lowering("empty", "empty2")
def empty(ctx, eqn, *args):
    """An array whose contents the program never reads before writing (a scan's stacked
    outputs under differentiation); XLA materialises it as zeros, and so does fornax."""
    dt = device_dtype(out_dtype(eqn))
    shape = out_shape(eqn)
    zero = ctx.scalar(False if dt is DType.BOOL else 0, dt)
    return ctx.op("broadcast_to", zero, shape=shape) if shape else zero


def _fmod(ctx, a, b):
    """C's fmod: sign(a) · fmod(|a|, |b|), the floor remainder of non-negative operands (exact)."""
    return with_sign(ctx, a, ctx.op("remainder", ctx.op("abs", a), ctx.op("abs", b)))


@lowering("rem")
def rem(ctx, eqn, a, b):
    """The remainder with the dividend's sign (C fmod); an integer x % 0 is x."""
    if device_dtype(out_dtype(eqn)).is_float:
        return float_math(ctx, eqn, _fmod, a, b)
    zero = ctx.op("eq", b, scalar_like(ctx, b, 0))
    safe = where(ctx, ctx.op("logical_or", zero, ctx.op("eq", b, scalar_like(ctx, b, -1))), scalar_like(ctx, b, 1), b)
    r = ctx.op("remainder", a, safe)                             # the divisor's sign
    fix = ctx.op("logical_and", ctx.op("ne", r, scalar_like(ctx, r, 0)),
                 ctx.op("ne", ctx.op("lt", r, scalar_like(ctx, r, 0)), ctx.op("lt", a, scalar_like(ctx, a, 0))))
    r = where(ctx, fix, ctx.op("sub", r, safe), r)
    return where(ctx, zero, a, r)


#: (mantissa bits, exponent of the smallest normal) of each float format
_FLOAT_FORMAT = {DType.FLOAT64: (52, -1022), DType.FLOAT32: (23, -126), DType.FLOAT16: (10, -14),
                 DType.BFLOAT16: (7, -126)}


@lowering("nextafter")
def nextafter(ctx, eqn, x, y):
    """The representable value next to x toward y: x ± the ulp 2**(e - m) of the binade of |x|
    (e from a log2 estimate corrected by comparing powers of two, at least the smallest normal
    exponent, so zero and subnormals step by the smallest subnormal), half of it moving toward
    zero from a normal power of two; ±inf steps to ±max; y when x == y; NaN with a NaN."""
    out = device_dtype(out_dtype(eqn))
    m, emin = _FLOAT_FORMAT[out]
    cdt = compute_dtype(out)
    x, y = ctx.cast(x, cdt), ctx.cast(y, cdt)
    a = ctx.op("abs", x)
    two = scalar_like(ctx, x, 2.0)
    e = ctx.op("floor", ctx.op("div", ctx.op("log", a), scalar_like(ctx, x, math.log(2.0))))
    e = where(ctx, ctx.op("gt", ctx.op("pow", two, e), a), ctx.op("sub", e, scalar_like(ctx, x, 1)), e)
    e = where(ctx, ctx.op("le", ctx.op("pow", two, ctx.op("add", e, scalar_like(ctx, x, 1))), a),
               ctx.op("add", e, scalar_like(ctx, x, 1)), e)
    e = ctx.op("maximum", e, scalar_like(ctx, x, emin))
    up = ctx.op("pow", two, ctx.op("sub", e, scalar_like(ctx, x, m)))
    zero = scalar_like(ctx, x, 0)
    rising = ctx.op("gt", y, x)
    away = ctx.op("logical_or", ctx.op("eq", x, zero), ctx.op("eq", rising, ctx.op("gt", x, zero)))
    binade_floor = ctx.op("logical_and", ctx.op("eq", a, ctx.op("pow", two, e)), ctx.op("gt", e, scalar_like(ctx, x, emin)))
    step = where(ctx, ctx.op("logical_or", away, ctx.op("logical_not", binade_floor)), up,
                  ctx.op("mul", up, scalar_like(ctx, x, 0.5)))
    r = ctx.op("add", x, where(ctx, rising, step, ctx.op("neg", step)))
    top = float(ml_dtypes.finfo(out.numpy).max)
    r = where(ctx, ctx.op("eq", a, scalar_like(ctx, x, math.inf)), ctx.op("mul", ctx.op("sign", x), scalar_like(ctx, x, top)), r)
    r = where(ctx, ctx.op("eq", x, y), y, r)
    r = where(ctx, ctx.op("logical_or", ctx.op("isnan", x), ctx.op("isnan", y)), scalar_like(ctx, x, math.nan), r)
    return ctx.cast(r, out)


@lowering("max")
def max_(ctx, eqn, a, b):
    return ctx.op("maximum", a, b)


@lowering("min")
def min_(ctx, eqn, a, b):
    return ctx.op("minimum", a, b)


@lowering("clamp")
def clamp(ctx, eqn, lo, x, hi):
    """XLA's clamp(min, x, max) = min(max(x, min), max); NaN in any operand gives NaN."""
    return ctx.op("minimum", ctx.op("maximum", x, lo), hi)
