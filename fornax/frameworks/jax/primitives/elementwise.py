"""Lowering rules of jax's elementwise math functions: exp/log/trigonometric/hyperbolic
functions (``_FLOAT_UNARY``), ``exp2``, ``erfc``, ``erf_inv``, ``round``, ``is_finite``,
``atan2``, ``pow``, ``integer_pow``, ``square``, ``neg``, ``abs`` and ``sign``.

float16/bfloat16 math is done in float32 and rounded once per primitive (a rule of several
graph ops, such as ``asinh``, rounds only its result); where jax itself lowers a primitive to
several operations in the narrow type (``integer_pow``'s multiplies, ``exp2`` as
exp(x · ln 2)), XLA rounds after each and so does the rule.  ``erf_inv`` is Giles'
single-precision approximation (XLA's, evaluated in float32); ``erfc`` is 1 - erf below 2 and
Laplace's continued fraction above, in float64, so its small values keep full float32
precision.  Refused: ``erfc``/``erf_inv`` of float64.
"""

from __future__ import annotations

import math

from ....layers.graph import DType
from ... import builders as B
from ..lowering import device_dtype, lowering
from .common import LOW_FLOATS, clip, float_math, numeric, out_dtype, scalar_like, where, with_sign


def _unary(op: str):
    return lambda ctx, x: ctx.op(op, x)


def _exp2(ctx, x):
    """2**x = 2**n · exp(f·ln 2) with n = round(x), |f| <= 1/2 exact, so the exponent's rounding
    does not scale with |x|; 2**n goes in as two halves so neither overflows early.  x is
    first clamped to ±2000 (beyond any float's range: inf stays inf, -inf gives 0)."""
    x = clip(ctx, x, -2000.0, 2000.0)
    n = ctx.op("round", x)
    e = ctx.op("exp", ctx.op("mul", ctx.op("sub", x, n), scalar_like(ctx, x, math.log(2.0))))
    n1 = ctx.op("floor", ctx.op("mul", n, scalar_like(ctx, x, 0.5)))
    two = scalar_like(ctx, x, 2.0)
    r = ctx.op("mul", ctx.op("mul", e, ctx.op("pow", two, n1)), ctx.op("pow", two, ctx.op("sub", n, n1)))
    return where(ctx, ctx.op("isnan", x), x, r)


def _tan(ctx, x):
    return ctx.op("div", ctx.op("sin", x), ctx.op("cos", x))


def _sqrt_one_minus_sq(ctx, x):
    """sqrt(1 - x²) as sqrt((1 - x)(1 + x)), exact-er near |x| = 1."""
    one = scalar_like(ctx, x, 1)
    return ctx.op("sqrt", ctx.op("mul", ctx.op("sub", one, x), ctx.op("add", one, x)))


def _asin(ctx, x):
    return ctx.op("atan2", x, _sqrt_one_minus_sq(ctx, x))


def _acos(ctx, x):
    return ctx.op("atan2", _sqrt_one_minus_sq(ctx, x), x)


def _atan(ctx, x):
    return ctx.op("atan2", x, scalar_like(ctx, x, 1))


def _big_exp_half(ctx, a):
    """exp(a) / 2 for large a, as (exp(a/2) / 2) · exp(a/2): finite wherever the result is."""
    h = ctx.op("exp", ctx.op("mul", a, scalar_like(ctx, a, 0.5)))
    return ctx.op("mul", ctx.op("mul", h, scalar_like(ctx, a, 0.5)), h)


def _sinh(ctx, x):
    """sinh|x| = (s + s/(s+1)) / 2 with s = expm1|x| (no cancellation near 0); exp(|x|)/2 when
    |x| > 10 (e^-|x| is then below the last bit)."""
    a = ctx.op("abs", x)
    s = B.expm1(ctx, a)
    small = ctx.op("mul", ctx.op("add", s, ctx.op("div", s, ctx.op("add", s, scalar_like(ctx, x, 1)))), scalar_like(ctx, x, 0.5))
    r = where(ctx, ctx.op("gt", a, scalar_like(ctx, x, 10)), _big_exp_half(ctx, a), small)
    return with_sign(ctx, x, r)


def _cosh(ctx, x):
    a = ctx.op("abs", x)
    e = ctx.op("exp", a)
    half = scalar_like(ctx, x, 0.5)
    small = ctx.op("add", ctx.op("mul", e, half), ctx.op("div", half, e))
    return where(ctx, ctx.op("gt", a, scalar_like(ctx, x, 10)), _big_exp_half(ctx, a), small)


def _log_2x(ctx, a):
    """log(2a): the value of asinh/acosh once a² + 1 rounds to a²."""
    return ctx.op("add", ctx.op("log", a), scalar_like(ctx, a, math.log(2.0)))


#: above this, sqrt(x² ± 1) rounds to |x| in float32 and float64 alike (and x² may overflow)
_HUGE = 2.0 ** 28


def _asinh(ctx, x):
    """sign(x) · log1p(|x| + x²/(1 + sqrt(1 + x²))); log(2|x|) for huge |x|."""
    a = ctx.op("abs", x)
    one = scalar_like(ctx, x, 1)
    x2 = ctx.op("mul", a, a)
    t = ctx.op("add", a, ctx.op("div", x2, ctx.op("add", one, ctx.op("sqrt", ctx.op("add", one, x2)))))
    r = where(ctx, ctx.op("gt", a, scalar_like(ctx, x, _HUGE)), _log_2x(ctx, a), B.log1p(ctx, t))
    return with_sign(ctx, x, r)


def _acosh(ctx, x):
    """log1p((x - 1) + sqrt((x - 1)(x + 1))); log(2x) for huge x; NaN below 1."""
    one = scalar_like(ctx, x, 1)
    xm = ctx.op("sub", x, one)
    r = B.log1p(ctx, ctx.op("add", xm, ctx.op("sqrt", ctx.op("mul", xm, ctx.op("add", x, one)))))
    return where(ctx, ctx.op("gt", x, scalar_like(ctx, x, _HUGE)), _log_2x(ctx, x), r)


def _atanh(ctx, x):
    """log1p(2x / (1 - x)) / 2: ±inf at ±1, NaN beyond."""
    q = ctx.op("div", ctx.op("mul", x, scalar_like(ctx, x, 2)), ctx.op("sub", scalar_like(ctx, x, 1), x))
    return ctx.op("mul", B.log1p(ctx, q), scalar_like(ctx, x, 0.5))


def _cbrt(ctx, x):
    """sign(x) |x|^(1/3), then one Newton step y - (y - x/y²)/3 (the power's exponent is
    rounded); zeros, infinities and NaN keep the first value."""
    a = ctx.op("abs", x)
    y = with_sign(ctx, x, ctx.op("pow", a, scalar_like(ctx, x, 1.0 / 3.0)))
    step = ctx.op("div", ctx.op("sub", y, ctx.op("div", x, ctx.op("mul", y, y))), scalar_like(ctx, x, 3))
    finite = ctx.op("logical_and", ctx.op("ne", y, scalar_like(ctx, x, 0)),
                    ctx.op("lt", ctx.op("abs", y), scalar_like(ctx, x, math.inf)))
    return where(ctx, finite, ctx.op("sub", y, step), y)


#: below this, 1 - erf(x) in float64 keeps float32 precision; above, the continued fraction
_ERFC_SPLIT = 2.0
#: depth of Laplace's continued fraction (relative error below 1e-10 from x = 2 up)
_ERFC_TERMS = 24


def _erfc(ctx, x):
    """erfc in float64 for a float32 (or narrower) operand: 1 - erf(|x|) below 2, above it
    exp(-x²)/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))) (x² is exact in float64);
    2 - erfc(|x|) for negative x."""
    a = ctx.op("abs", x)
    t = a
    for k in range(_ERFC_TERMS, 0, -1):
        t = ctx.op("add", a, ctx.op("div", scalar_like(ctx, x, k / 2), t))
    tail = ctx.op("div", ctx.op("exp", ctx.op("neg", ctx.op("mul", a, a))),
                  ctx.op("mul", t, scalar_like(ctx, x, math.sqrt(math.pi))))
    near = ctx.op("sub", scalar_like(ctx, x, 1), ctx.op("erf", a))
    r = where(ctx, ctx.op("lt", a, scalar_like(ctx, x, _ERFC_SPLIT)), near, tail)
    r = where(ctx, ctx.op("isnan", x), x, r)
    return where(ctx, ctx.op("lt", x, scalar_like(ctx, x, 0)), ctx.op("sub", scalar_like(ctx, x, 2), r), r)


# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011): single precision
_ERFINV_W_LT_5 = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                  -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_W_GE_5 = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                  -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _erf_inv(ctx, x):
    """XLA's float32 erf_inv: w = -log1p(-x²), a degree-8 polynomial in w - 2.5 (w < 5) or
    sqrt(w) - 3, times x; ±inf at ±1, NaN beyond."""
    w = ctx.op("neg", B.log1p(ctx, ctx.op("neg", ctx.op("mul", x, x))))
    lt = ctx.op("lt", w, scalar_like(ctx, x, 5.0))
    w = where(ctx, lt, ctx.op("sub", w, scalar_like(ctx, x, 2.5)), ctx.op("sub", ctx.op("sqrt", w), scalar_like(ctx, x, 3.0)))
    p = None
    for a, b in zip(_ERFINV_W_LT_5, _ERFINV_W_GE_5):
        c = where(ctx, lt, scalar_like(ctx, x, a), scalar_like(ctx, x, b))
        p = c if p is None else ctx.op("add", c, ctx.op("mul", p, w))
    r = ctx.op("mul", p, x)
    return where(ctx, ctx.op("eq", ctx.op("abs", x), scalar_like(ctx, x, 1)), ctx.op("mul", x, scalar_like(ctx, x, math.inf)), r)


def _round_away(ctx, x):
    """Half away from zero: trunc(x), plus sign(x) where the fraction x - trunc(x) (exact) is
    at least one half."""
    t = B.trunc(ctx, x)
    frac = ctx.op("abs", ctx.op("sub", x, t))
    return where(ctx, ctx.op("ge", frac, scalar_like(ctx, x, 0.5)), ctx.op("add", t, ctx.op("sign", x)), t)


_FLOAT_UNARY = {
    "exp": _unary("exp"), "log": _unary("log"), "tanh": _unary("tanh"), "sin": _unary("sin"),
    "cos": _unary("cos"), "sqrt": _unary("sqrt"), "rsqrt": _unary("rsqrt"), "erf": _unary("erf"),
    "floor": _unary("floor"), "ceil": _unary("ceil"), "logistic": _unary("sigmoid"),
    "log1p": B.log1p, "expm1": B.expm1, "tan": _tan, "asin": _asin, "acos": _acos,
    "atan": _atan, "sinh": _sinh, "cosh": _cosh, "asinh": _asinh, "acosh": _acosh, "atanh": _atanh,
    "cbrt": _cbrt,
}


def _float_unary_rule(fn):
    def rule(ctx, eqn, x):
        return float_math(ctx, eqn, fn, x)
    rule.__doc__ = fn.__doc__
    return rule


for _name, _fn in _FLOAT_UNARY.items():
    lowering(_name)(_float_unary_rule(_fn))


@lowering("exp2")
def exp2(ctx, eqn, x):
    """float32/float64: :func:`_exp2`.  float16/bfloat16: jax's own lowering, exp(x · ln 2) with
    ln 2 and the product rounded to the narrow type (XLA rounds each op there), so the
    result matches jax's rather than 2**x."""
    out = device_dtype(out_dtype(eqn))
    if out in LOW_FLOATS:
        return ctx.op("exp", ctx.op("mul", x, ctx.scalar(math.log(2.0), out)))
    return float_math(ctx, eqn, _exp2, x)


@lowering("erfc")
def erfc(ctx, eqn, x):
    out = device_dtype(out_dtype(eqn))
    if out is DType.FLOAT64:
        raise ctx.fail("float64 erfc needs a rational approximation accurate to float64 for "
                       "x in [0.5, 6]; fornax computes erfc in float64 for float32 and narrower only")
    return ctx.cast(_erfc(ctx, ctx.cast(x, DType.FLOAT64)), out)


@lowering("erf_inv")
def erf_inv(ctx, eqn, x):
    if device_dtype(out_dtype(eqn)) is DType.FLOAT64:
        raise ctx.fail("float64 erf_inv (XLA's double-precision Giles polynomial) is not "
                       "implemented; float32 and narrower are")
    return float_math(ctx, eqn, _erf_inv, x)


@lowering("round")
def round_(ctx, eqn, x):
    method = int(eqn.params.get("rounding_method", 0))
    return float_math(ctx, eqn, _unary("round") if method == 1 else _round_away, x)


@lowering("is_finite")
def is_finite(ctx, eqn, x):
    return ctx.op("lt", ctx.op("abs", x), scalar_like(ctx, x, math.inf))


@lowering("atan2")
def atan2(ctx, eqn, y, x):
    return float_math(ctx, eqn, lambda c, a, b: c.op("atan2", a, b), y, x)


@lowering("pow")
def pow_(ctx, eqn, x, y):
    """x**y with a float or integer exponent (converted to x's type, as jax lowers it)."""
    return float_math(ctx, eqn, lambda c, a, b: c.op("pow", a, b), x, y)


@lowering("integer_pow")
def integer_pow(ctx, eqn, x):
    """x**y for a constant integer y by repeated squaring in jax's order of products (exact
    for integers, wrapping); a negative y takes the reciprocal at the end.  jax lowers it as
    that chain of multiplies, so float16/bfloat16 round after each one, as here."""
    y = int(eqn.params["y"])

    def power(c, v):
        if y == 0:
            return B.full(c, v.shape, 1, v.dtype)
        n, acc = abs(y), None
        while n > 0:
            if n & 1:
                acc = v if acc is None else c.op("mul", acc, v)
            n >>= 1
            if n > 0:
                v = c.op("mul", v, v)
        return c.op("div", scalar_like(c, acc, 1), acc) if y < 0 else acc
    if x.dtype in LOW_FLOATS:
        return power(ctx, x)
    return numeric(ctx, eqn, power, x)


@lowering("square")
def square(ctx, eqn, x):
    return numeric(ctx, eqn, lambda c, v: c.op("mul", v, v), x)


@lowering("neg")
def neg(ctx, eqn, x):
    return numeric(ctx, eqn, lambda c, v: c.op("neg", v), x)


@lowering("abs")
def abs_(ctx, eqn, x):
    return numeric(ctx, eqn, lambda cx, v: cx.op("abs", v), x)


@lowering("sign")
def sign(ctx, eqn, x):
    return numeric(ctx, eqn, lambda c, v: c.op("sign", v), x)
