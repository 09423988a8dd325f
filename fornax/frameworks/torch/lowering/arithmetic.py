"""Elementwise arithmetic lowerings: ``add``, ``sub``, ``rsub``, ``mul``, ``div`` (with its
rounding modes), ``floor_divide``, ``remainder``, ``fmod``, ``pow``, ``maximum``/``max.other``,
``minimum``/``min.other``, ``atan2``, ``clamp``/``clamp_min``/``clamp_max``, ``where``,
``masked_fill``, ``lerp``, ``addcmul``, ``addcdiv``, ``hypot``, ``logaddexp``, ``xlogy``."""

from __future__ import annotations

import numpy as np

from fornax.layers.graph import DType, Value
from fornax.frameworks.builders import full as _full, log1p as _log1p, trunc as _trunc

from .comparison import inf_mask
from .operands import binop, operand
from .promotion import compute_dtype, promote
from .table import lowering


# ---- elementwise arithmetic ----------------------------------------------------------------------
@lowering("aten::add.Tensor", "aten::add.Scalar")
def add(ctx, self, other, alpha=1):
    cdt, _ = promote(self, other)
    b = operand(ctx, other, cdt)
    if alpha != 1:
        b = ctx.op("mul", b, ctx.scalar(alpha, cdt))
    return ctx.op("add", operand(ctx, self, cdt), b)


@lowering("aten::sub.Tensor", "aten::sub.Scalar")
def sub(ctx, self, other, alpha=1):
    cdt, _ = promote(self, other)
    if cdt is DType.BOOL:
        raise ctx.fail("subtracting bool tensors is not supported (torch refuses it too)")
    b = operand(ctx, other, cdt)
    if alpha != 1:
        b = ctx.op("mul", b, ctx.scalar(alpha, cdt))
    return ctx.op("sub", operand(ctx, self, cdt), b)


@lowering("aten::rsub.Tensor", "aten::rsub.Scalar")
def rsub(ctx, self, other, alpha=1):
    return sub(ctx, other, self, alpha)


@lowering("aten::mul.Tensor", "aten::mul.Scalar")
def mul(ctx, self, other):
    return binop(ctx, "mul", self, other)


@lowering("aten::div.Tensor", "aten::div.Scalar", "aten::div.Tensor_mode", "aten::div.Scalar_mode")
def div(ctx, self, other, rounding_mode=None):
    if rounding_mode is None:
        cdt, _ = promote(self, other, kind="float")
        return ctx.op("div", operand(ctx, self, cdt), operand(ctx, other, cdt))
    cdt, _ = promote(self, other)
    a, b = operand(ctx, self, cdt), operand(ctx, other, cdt)
    if rounding_mode == "floor":
        return ctx.op("floor_divide", a, b)
    if rounding_mode != "trunc":
        raise ctx.fail(f"rounding_mode {rounding_mode!r} is not 'trunc', 'floor' or None")
    if cdt.is_float:
        return _trunc(ctx, ctx.op("div", a, b))
    # integers: floor division, plus one where the quotient is negative and inexact
    q = ctx.op("floor_divide", a, b)
    inexact = ctx.op("ne", ctx.op("mul", q, b), a)
    neg = ctx.op("ne", ctx.op("lt", a, ctx.scalar(0, cdt)), ctx.op("lt", b, ctx.scalar(0, cdt)))
    return ctx.op("add", q, ctx.cast(ctx.op("logical_and", inexact, neg), cdt))


@lowering("aten::floor_divide.default", "aten::floor_divide.Scalar")
def floor_divide(ctx, self, other):
    return binop(ctx, "floor_divide", self, other)


@lowering("aten::remainder.Tensor", "aten::remainder.Scalar", "aten::remainder.Scalar_Tensor")
def remainder(ctx, self, other):
    return binop(ctx, "remainder", self, other)


@lowering("aten::fmod.Tensor", "aten::fmod.Scalar")
def fmod(ctx, self, other):
    """C fmod (sign of the dividend) from remainder (sign of the divisor): they differ by
    the divisor where the remainder is non-zero and its sign is not the dividend's."""
    cdt, _ = promote(self, other)
    a, b = operand(ctx, self, cdt), operand(ctx, other, cdt)
    r = ctx.op("remainder", a, b)
    zero = ctx.scalar(0, cdt)
    fix = ctx.op("logical_and", ctx.op("ne", r, zero),
                 ctx.op("ne", ctx.op("lt", r, zero), ctx.op("lt", a, zero)))
    return ctx.op("where", fix, ctx.op("sub", r, b), r)


_POW_SPECIAL = {2: lambda c, x: c.op("mul", x, x),
                3: lambda c, x: c.op("mul", c.op("mul", x, x), x),
                0.5: lambda c, x: c.op("sqrt", x),
                -0.5: lambda c, x: c.op("rsqrt", x),
                -1: lambda c, x: c.op("reciprocal", x),
                -2: lambda c, x: c.op("reciprocal", c.op("mul", x, x))}


@lowering("aten::pow.Tensor_Tensor", "aten::pow.Tensor_Scalar", "aten::pow.Scalar")
def pow_(ctx, self, exponent):
    cdt, _ = promote(self, exponent)
    if isinstance(self, Value) and not isinstance(exponent, Value):
        if not cdt.is_float and exponent < 0:
            raise ctx.fail("integers to negative integer powers are not allowed")
        x = ctx.cast(self, cdt)
        if exponent == 1:
            return x
        if exponent == 0:
            return _full(ctx, x.shape, 1, cdt)
        special = _POW_SPECIAL.get(exponent)
        if special is not None and (cdt.is_float or exponent in (2, 3)):
            return special(ctx, x)
    return ctx.op("pow", operand(ctx, self, cdt), operand(ctx, exponent, cdt))


# ``pow_.Tensor`` is the in-place form of ``pow.Tensor_Tensor``: its overload name differs, so the
# table's in-place sharing (:func:`.table.register_inplace`) cannot find it
lowering("aten::pow_.Tensor")(pow_)


@lowering("aten::maximum.default", "aten::max.other")
def maximum(ctx, self, other):
    return binop(ctx, "maximum", self, other)


@lowering("aten::minimum.default", "aten::min.other")
def minimum(ctx, self, other):
    return binop(ctx, "minimum", self, other)


@lowering("aten::atan2.default")
def atan2(ctx, self, other):
    return binop(ctx, "atan2", self, other, kind="float")


@lowering("aten::clamp.default", "aten::clamp.Tensor")
def clamp(ctx, self, min=None, max=None):
    cdt, _ = promote(self, min, max)
    x = ctx.cast(self, cdt)
    if min is not None and max is not None:
        lo, hi = operand(ctx, min, cdt), operand(ctx, max, cdt)
        if tuple(np.broadcast_shapes(lo.shape, hi.shape, x.shape)) == tuple(x.shape):
            return ctx.op("clamp", x, lo, hi)
    if min is not None:
        x = ctx.op("maximum", x, operand(ctx, min, cdt))
    if max is not None:
        x = ctx.op("minimum", x, operand(ctx, max, cdt))
    return x


@lowering("aten::clamp_min.default", "aten::clamp_min.Tensor")
def clamp_min(ctx, self, min):
    return clamp(ctx, self, min, None)


@lowering("aten::clamp_max.default", "aten::clamp_max.Tensor")
def clamp_max(ctx, self, max):
    return clamp(ctx, self, None, max)


@lowering("aten::where.self", "aten::where.ScalarOther", "aten::where.ScalarSelf", "aten::where.Scalar")
def where(ctx, condition, self, other):
    dt = ctx.out()
    return ctx.op("where", ctx.cast(condition, DType.BOOL), operand(ctx, self, dt), operand(ctx, other, dt))


@lowering("aten::masked_fill.Scalar", "aten::masked_fill.Tensor")
def masked_fill(ctx, self, mask, value):
    return ctx.op("where", ctx.cast(mask, DType.BOOL), operand(ctx, value, self.dtype), self)


@lowering("aten::lerp.Scalar", "aten::lerp.Tensor")
def lerp(ctx, self, end, weight):
    """torch's two-sided form: ``a + w(b-a)`` for |w| < 1/2, else ``b - (b-a)(1-w)``."""
    dt = compute_dtype(ctx)
    a, b, w = ctx.cast(self, dt), ctx.cast(end, dt), operand(ctx, weight, dt)
    d = ctx.op("sub", b, a)
    lo = ctx.op("add", a, ctx.op("mul", w, d))
    hi = ctx.op("sub", b, ctx.op("mul", d, ctx.op("sub", ctx.scalar(1, dt), w)))
    small = ctx.op("lt", ctx.op("abs", w), ctx.scalar(0.5, dt))
    return ctx.op("where", small, lo, hi)


@lowering("aten::addcmul.default")
def addcmul(ctx, self, tensor1, tensor2, value=1):
    dt = compute_dtype(ctx)
    p = ctx.op("mul", ctx.cast(tensor1, dt), ctx.cast(tensor2, dt))
    if value != 1:
        p = ctx.op("mul", ctx.scalar(value, dt), p)
    return ctx.op("add", ctx.cast(self, dt), p)


@lowering("aten::addcdiv.default")
def addcdiv(ctx, self, tensor1, tensor2, value=1):
    dt = compute_dtype(ctx)
    if not dt.is_float:
        raise ctx.fail("addcdiv of integer tensors is not supported (torch refuses it too)")
    q = ctx.op("div", ctx.cast(tensor1, dt), ctx.cast(tensor2, dt))
    if value != 1:
        q = ctx.op("mul", ctx.scalar(value, dt), q)
    return ctx.op("add", ctx.cast(self, dt), q)


# ---- binary math ---------------------------------------------------------------------------------
@lowering("aten::hypot.default")
def hypot(ctx, self, other):
    cdt, _ = promote(self, other, kind="float")
    a, b = ctx.cast(self, cdt), ctx.cast(other, cdt)
    return ctx.op("sqrt", ctx.op("add", ctx.op("mul", a, a), ctx.op("mul", b, b)))


@lowering("aten::logaddexp.default")
def logaddexp(ctx, self, other):
    """max + log1p(exp(-|a - b|)); equal infinities give that infinity."""
    cdt, _ = promote(self, other, kind="float")
    a, b = ctx.cast(self, cdt), ctx.cast(other, cdt)
    m = ctx.op("maximum", a, b)
    r = ctx.op("add", m, _log1p(ctx, ctx.op("exp", ctx.op("neg", ctx.op("abs", ctx.op("sub", a, b))))))
    return ctx.op("where", ctx.op("logical_and", inf_mask(ctx, a), ctx.op("eq", a, b)), a, r)


@lowering("aten::xlogy.Tensor", "aten::xlogy.Scalar_Other", "aten::xlogy.Scalar_Self")
def xlogy(ctx, self, other):
    cdt, _ = promote(self, other, kind="float")
    x, y = operand(ctx, self, cdt), operand(ctx, other, cdt)
    r = ctx.op("where", ctx.op("eq", x, ctx.scalar(0, cdt)), ctx.scalar(0, cdt), ctx.op("mul", x, ctx.op("log", y)))
    return ctx.op("where", ctx.op("isnan", y), y, r)
