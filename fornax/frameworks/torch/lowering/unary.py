"""Unary math lowerings: ``exp``, ``log``, ``sqrt``, ``rsqrt``, ``sin``, ``cos``, ``tanh``,
``sigmoid``, ``erf``, ``reciprocal``, ``neg``, ``abs``, ``sign``/``sgn``, ``floor``, ``ceil``,
``trunc``/``fix``, ``frac``, ``round``, ``expm1``, ``log1p``, ``exp2``, ``log2``, ``log10``,
``tan``, ``atan``, ``asin``, ``acos``, ``sinh``, ``cosh``, ``asinh``, ``acosh``, ``atanh``, ``logit``."""

from __future__ import annotations

import math

from fornax.layers.graph import DType
from fornax.frameworks.builders import expm1 as _expm1, log1p as _log1p, trunc as _trunc

from .promotion import float_in
from .table import lowering


# ---- unary math ----------------------------------------------------------------------------------
def _unary_float(name):
    def fn(ctx, self):
        return ctx.op(name, float_in(ctx, self))
    return fn


for _name in ("exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "reciprocal"):
    lowering(f"aten::{_name}.default")(_unary_float(_name))


@lowering("aten::neg.default")
def neg(ctx, self):
    if self.dtype is DType.BOOL:
        raise ctx.fail("negating a bool tensor is not supported (torch refuses it too)")
    return ctx.op("neg", self)


@lowering("aten::abs.default")
def abs_(ctx, self):
    return self if self.dtype is DType.BOOL else ctx.op("abs", self)


@lowering("aten::sign.default", "aten::sgn.default")
def sign(ctx, self):
    return self if self.dtype is DType.BOOL else ctx.op("sign", self)


for _name in ("floor", "ceil"):
    def _rounding(ctx, self, _name=_name):
        return self if not self.dtype.is_float else ctx.op(_name, self)
    lowering(f"aten::{_name}.default")(_rounding)


@lowering("aten::trunc.default", "aten::fix.default")
def trunc(ctx, self):
    return _trunc(ctx, self)


@lowering("aten::frac.default")
def frac(ctx, self):
    return ctx.op("sub", self, _trunc(ctx, self))


@lowering("aten::round.default", "aten::round.decimals")
def round_(ctx, self, decimals=0):
    """Half to even; with ``decimals``, torch's ``nearbyint(x * 10^d) / 10^d``."""
    if not self.dtype.is_float:
        return self
    if decimals == 0:
        return ctx.op("round", self)
    dt = self.dtype
    p = ctx.scalar(10.0 ** abs(decimals), dt)
    if decimals > 0:
        return ctx.op("div", ctx.op("round", ctx.op("mul", self, p)), p)
    return ctx.op("mul", ctx.op("round", ctx.op("div", self, p)), p)


@lowering("aten::expm1.default")
def expm1(ctx, self):
    return _expm1(ctx, float_in(ctx, self))


@lowering("aten::log1p.default")
def log1p(ctx, self):
    return _log1p(ctx, float_in(ctx, self))


@lowering("aten::exp2.default")
def exp2(ctx, self):
    x = float_in(ctx, self)
    return ctx.op("exp", ctx.op("mul", x, ctx.scalar(math.log(2.0), x.dtype)))


@lowering("aten::log2.default")
def log2(ctx, self):
    x = float_in(ctx, self)
    return ctx.op("div", ctx.op("log", x), ctx.scalar(math.log(2.0), x.dtype))


@lowering("aten::log10.default")
def log10(ctx, self):
    x = float_in(ctx, self)
    return ctx.op("div", ctx.op("log", x), ctx.scalar(math.log(10.0), x.dtype))


@lowering("aten::tan.default")
def tan(ctx, self):
    x = float_in(ctx, self)
    return ctx.op("div", ctx.op("sin", x), ctx.op("cos", x))


@lowering("aten::atan.default")
def atan(ctx, self):
    x = float_in(ctx, self)
    return ctx.op("atan2", x, ctx.scalar(1, x.dtype))


@lowering("aten::asin.default")
def asin(ctx, self):
    x = float_in(ctx, self)
    c = ctx.op("sqrt", ctx.op("sub", ctx.scalar(1, x.dtype), ctx.op("mul", x, x)))
    return ctx.op("atan2", x, c)


@lowering("aten::acos.default")
def acos(ctx, self):
    x = float_in(ctx, self)
    s = ctx.op("sqrt", ctx.op("sub", ctx.scalar(1, x.dtype), ctx.op("mul", x, x)))
    return ctx.op("atan2", s, x)


@lowering("aten::sinh.default")
def sinh(ctx, self):
    x = float_in(ctx, self)
    return ctx.op("mul", ctx.op("sub", _expm1(ctx, x), _expm1(ctx, ctx.op("neg", x))), ctx.scalar(0.5, x.dtype))


@lowering("aten::cosh.default")
def cosh(ctx, self):
    x = float_in(ctx, self)
    return ctx.op("mul", ctx.op("add", ctx.op("exp", x), ctx.op("exp", ctx.op("neg", x))),
                  ctx.scalar(0.5, x.dtype))


# ---- inverse hyperbolic functions and logit ------------------------------------------------------
@lowering("aten::asinh.default")
def asinh(ctx, self):
    """sign(x) * log1p(|x| + x^2 / (1 + sqrt(1 + x^2)))"""
    x = float_in(ctx, self)
    one = ctx.scalar(1, x.dtype)
    a = ctx.op("abs", x)
    x2 = ctx.op("mul", x, x)
    t = ctx.op("add", a, ctx.op("div", x2, ctx.op("add", one, ctx.op("sqrt", ctx.op("add", one, x2)))))
    return ctx.op("mul", ctx.op("sign", x), _log1p(ctx, t))


@lowering("aten::acosh.default")
def acosh(ctx, self):
    """log1p((x - 1) + sqrt((x - 1)(x + 1)))"""
    x = float_in(ctx, self)
    one = ctx.scalar(1, x.dtype)
    xm = ctx.op("sub", x, one)
    return _log1p(ctx, ctx.op("add", xm, ctx.op("sqrt", ctx.op("mul", xm, ctx.op("add", x, one)))))


@lowering("aten::atanh.default")
def atanh(ctx, self):
    """sign(x) * 0.5 * log1p(2|x| / (1 - |x|)), on |x| as libm's atanh does: for x near -1
    the argument of log1p would sit near -1, where its rounding error is amplified."""
    x = float_in(ctx, self)
    dt = x.dtype
    a = ctx.op("abs", x)
    q = ctx.op("div", ctx.op("mul", a, ctx.scalar(2, dt)), ctx.op("sub", ctx.scalar(1, dt), a))
    r = ctx.op("mul", _log1p(ctx, q), ctx.scalar(0.5, dt))
    r = ctx.op("where", ctx.op("lt", x, ctx.scalar(0, dt)), ctx.op("neg", r), r)
    return ctx.op("where", ctx.op("eq", x, ctx.scalar(0, dt)), x, r)        # atanh(-0) is -0


@lowering("aten::logit.default")
def logit(ctx, self, eps=None):
    x = float_in(ctx, self)
    dt = x.dtype
    if eps is not None:
        x = ctx.op("clamp", x, ctx.scalar(eps, dt), ctx.scalar(1 - eps, dt))
    return ctx.op("log", ctx.op("div", x, ctx.op("sub", ctx.scalar(1, dt), x)))
