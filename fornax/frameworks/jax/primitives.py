"""Lowering rules of jax's core primitives: elementwise math, bit operations, comparisons,
conversions, reductions, cumulative scans, layout, contractions, convolution and sorting.

Every rule follows XLA's semantics as ``jax.jit`` on CPU computes them (see
:mod:`.lowering` for the rule contract and the device dtypes):

* float16/bfloat16 elementwise math is done in float32 and rounded once per
  primitive (a rule of several graph ops, such as ``asinh``, rounds only its
  result); sums, products, dot products and convolutions of them accumulate in
  float32.  Where jax itself lowers a primitive to several operations in the
  narrow type (``integer_pow``'s multiplies, ``exp2`` as exp(x · ln 2)), XLA
  rounds after each and so does the rule.  Results agree with jax's to one ulp.
* Integer arithmetic wraps in two's complement at the jax type's width, carried
  integers included (``uint32`` add/sub/mul in int64, then ``ctx.wrap``; int64
  products wrap mod 2**64, so their low bits are right).  Integer ``div``
  truncates toward zero, ``rem`` has the dividend's sign; x/0 is -1 (all ones
  unsigned), x%0 is x, INT_MIN/-1 is INT_MIN.  Shifts by at least the bit width
  (or by a negative amount) give 0, or the sign fill for ``shift_right_arithmetic``,
  which shifts the bit pattern of unsigned types as signed.
* float → integer conversion truncates toward zero and saturates at the target's
  range; NaN becomes 0 (XLA CPU).  integer → integer wraps; x → bool is x != 0.
* ``max``/``min`` (and the reductions, scans and ``clamp`` over them) propagate NaN;
  where both operands are zeros of different signs, the sign of the result may
  differ from XLA's (which orders -0.0 below 0.0);
  ``argmax``/``argmin`` take the first NaN as the extreme and the lowest index
  among ties; ``sort`` puts NaN last and treats -0.0 and 0.0 as equal (jax's sort
  comparator), and is always stable; ``top_k`` follows XLA's total order (NaN
  largest, 0.0 above -0.0) and takes equal values lower index first.  A NaN's sign
  is not observable in the graph IR: every NaN counts as positive.
* ``reduce_precision`` to bfloat16's or float16's format rounds through a cast;
  narrowing the exponent flushes results below the smallest normal to (signed)
  zero, as XLA does.
* ``erf_inv`` is Giles' single-precision approximation (XLA's, evaluated in
  float32); ``erfc`` is 1 - erf below 2 and Laplace's continued fraction above,
  in float64, so its small values keep full float32 precision.
* XLA CPU flushes subnormal float operands and results of arithmetic to zero;
  fornax's device keeps them (as IEEE arithmetic does), so the two differ there.

Refused (``NotLowerable``, so the equation runs on the host, or no rule):
``erfc``/``erf_inv`` of float64 (full float64 precision needs rational
approximations beyond this table), integer convolutions, integer dot products
whose broadcast product exceeds :data:`MAX_INT_DOT` elements, ``reduce_precision``
to formats other than bfloat16/float16/float32 and ``sort`` along axes longer than
:data:`~fornax.frameworks.builders.MAX_SORT`; ``lgamma``, ``digamma`` (no
approximation accurate to float32 across their poles here) and ``clz`` have no rule.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ...layers.graph import DType, Value
from ...layers.nn_ops import _conv_via_im2col
from .. import builders as B
from .lowering import carried, device_dtype, lowering

_LOW = (DType.FLOAT16, DType.BFLOAT16)
#: the most elements of the broadcast product an integer dot_general builds
MAX_INT_DOT = 1 << 24


# ---- types -----------------------------------------------------------------------------------------
def _out(eqn, i: int = 0):
    """The jax dtype of result ``i``."""
    return eqn.outvars[i].aval.dtype


def _in(eqn, i: int = 0):
    """The jax dtype of operand ``i``."""
    return eqn.invars[i].aval.dtype


def _shape(eqn, i: int = 0) -> tuple[int, ...]:
    return tuple(int(d) for d in eqn.outvars[i].aval.shape)


def _compute(dt: DType) -> DType:
    """The dtype elementwise math on ``dt`` runs in (float32 for float16/bfloat16)."""
    return DType.FLOAT32 if dt in _LOW else dt


def _int_range(jdt) -> tuple[int, int, int, bool]:
    """(bits, lo, hi, signed) of an integer jax dtype."""
    c = carried(jdt)
    if c.carried:
        return c.bits, c.lo, c.hi, c.signed
    info = np.iinfo(c.dtype.numpy)
    return info.bits, int(info.min), int(info.max), True


def _ints(values) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _float_math(ctx, eqn, fn, *xs: Value) -> Value:
    """``fn(ctx, *xs)`` computed in the compute dtype of the (float) result, cast once."""
    out = device_dtype(_out(eqn))
    if not out.is_float:
        raise ctx.fail(f"needs a floating-point result, got {_out(eqn)}")
    cdt = _compute(out)
    return ctx.cast(fn(ctx, *(ctx.cast(x, cdt) for x in xs)), out)


def _numeric(ctx, eqn, fn, *xs: Value) -> Value:
    """``fn(ctx, *xs)`` for any numeric result: floats as :func:`_float_math`, integers in
    their device dtype, wrapped back into the jax type's range."""
    out = device_dtype(_out(eqn))
    if out.is_float:
        return _float_math(ctx, eqn, fn, *xs)
    return ctx.wrap(fn(ctx, *(ctx.cast(x, out) for x in xs)), _out(eqn))


def _where(ctx, cond, a, b):
    return ctx.op("where", cond, a, b)


def _s(ctx, x: Value, value):
    """A scalar constant of ``x``'s dtype."""
    return ctx.scalar(value, x.dtype)


def _clip(ctx, x: Value, lo, hi) -> Value:
    """x limited to the numbers [lo, hi] (NaN stays NaN)."""
    return ctx.op("minimum", ctx.op("maximum", x, _s(ctx, x, lo)), _s(ctx, x, hi))


# ---- elementwise math ----------------------------------------------------------------------------------
def _unary(op: str):
    return lambda ctx, x: ctx.op(op, x)


def _exp2(ctx, x):
    """2**x = 2**n · exp(f·ln 2) with n = round(x), |f| <= 1/2 exact, so the exponent's rounding
    does not scale with |x|; 2**n goes in as two halves so neither overflows early.  x is
    first clamped to ±2000 (beyond any float's range: inf stays inf, -inf gives 0)."""
    x = _clip(ctx, x, -2000.0, 2000.0)
    n = ctx.op("round", x)
    e = ctx.op("exp", ctx.op("mul", ctx.op("sub", x, n), _s(ctx, x, math.log(2.0))))
    n1 = ctx.op("floor", ctx.op("mul", n, _s(ctx, x, 0.5)))
    two = _s(ctx, x, 2.0)
    r = ctx.op("mul", ctx.op("mul", e, ctx.op("pow", two, n1)), ctx.op("pow", two, ctx.op("sub", n, n1)))
    return _where(ctx, ctx.op("isnan", x), x, r)


def _tan(ctx, x):
    return ctx.op("div", ctx.op("sin", x), ctx.op("cos", x))


def _sqrt_one_minus_sq(ctx, x):
    """sqrt(1 - x²) as sqrt((1 - x)(1 + x)), exact-er near |x| = 1."""
    one = _s(ctx, x, 1)
    return ctx.op("sqrt", ctx.op("mul", ctx.op("sub", one, x), ctx.op("add", one, x)))


def _asin(ctx, x):
    return ctx.op("atan2", x, _sqrt_one_minus_sq(ctx, x))


def _acos(ctx, x):
    return ctx.op("atan2", _sqrt_one_minus_sq(ctx, x), x)


def _atan(ctx, x):
    return ctx.op("atan2", x, _s(ctx, x, 1))


def _signed(ctx, x, r):
    """``r`` (computed for |x|) with x's sign."""
    return _where(ctx, ctx.op("lt", x, _s(ctx, x, 0)), ctx.op("neg", r), r)


def _big_exp_half(ctx, a):
    """exp(a) / 2 for large a, as (exp(a/2) / 2) · exp(a/2): finite wherever the result is."""
    h = ctx.op("exp", ctx.op("mul", a, _s(ctx, a, 0.5)))
    return ctx.op("mul", ctx.op("mul", h, _s(ctx, a, 0.5)), h)


def _sinh(ctx, x):
    """sinh|x| = (s + s/(s+1)) / 2 with s = expm1|x| (no cancellation near 0); exp(|x|)/2 when
    |x| > 10 (e^-|x| is then below the last bit)."""
    a = ctx.op("abs", x)
    s = B.expm1(ctx, a)
    small = ctx.op("mul", ctx.op("add", s, ctx.op("div", s, ctx.op("add", s, _s(ctx, x, 1)))), _s(ctx, x, 0.5))
    r = _where(ctx, ctx.op("gt", a, _s(ctx, x, 10)), _big_exp_half(ctx, a), small)
    return _signed(ctx, x, r)


def _cosh(ctx, x):
    a = ctx.op("abs", x)
    e = ctx.op("exp", a)
    half = _s(ctx, x, 0.5)
    small = ctx.op("add", ctx.op("mul", e, half), ctx.op("div", half, e))
    return _where(ctx, ctx.op("gt", a, _s(ctx, x, 10)), _big_exp_half(ctx, a), small)


def _log_2x(ctx, a):
    """log(2a): the value of asinh/acosh once a² + 1 rounds to a²."""
    return ctx.op("add", ctx.op("log", a), _s(ctx, a, math.log(2.0)))


#: above this, sqrt(x² ± 1) rounds to |x| in float32 and float64 alike (and x² may overflow)
_HUGE = 2.0 ** 28


def _asinh(ctx, x):
    """sign(x) · log1p(|x| + x²/(1 + sqrt(1 + x²))); log(2|x|) for huge |x|."""
    a = ctx.op("abs", x)
    one = _s(ctx, x, 1)
    x2 = ctx.op("mul", a, a)
    t = ctx.op("add", a, ctx.op("div", x2, ctx.op("add", one, ctx.op("sqrt", ctx.op("add", one, x2)))))
    r = _where(ctx, ctx.op("gt", a, _s(ctx, x, _HUGE)), _log_2x(ctx, a), B.log1p(ctx, t))
    return _signed(ctx, x, r)


def _acosh(ctx, x):
    """log1p((x - 1) + sqrt((x - 1)(x + 1))); log(2x) for huge x; NaN below 1."""
    one = _s(ctx, x, 1)
    xm = ctx.op("sub", x, one)
    r = B.log1p(ctx, ctx.op("add", xm, ctx.op("sqrt", ctx.op("mul", xm, ctx.op("add", x, one)))))
    return _where(ctx, ctx.op("gt", x, _s(ctx, x, _HUGE)), _log_2x(ctx, x), r)


def _atanh(ctx, x):
    """log1p(2x / (1 - x)) / 2: ±inf at ±1, NaN beyond."""
    q = ctx.op("div", ctx.op("mul", x, _s(ctx, x, 2)), ctx.op("sub", _s(ctx, x, 1), x))
    return ctx.op("mul", B.log1p(ctx, q), _s(ctx, x, 0.5))


def _cbrt(ctx, x):
    """sign(x) |x|^(1/3), then one Newton step y - (y - x/y²)/3 (the power's exponent is
    rounded); zeros, infinities and NaN keep the first value."""
    a = ctx.op("abs", x)
    y = _signed(ctx, x, ctx.op("pow", a, _s(ctx, x, 1.0 / 3.0)))
    step = ctx.op("div", ctx.op("sub", y, ctx.op("div", x, ctx.op("mul", y, y))), _s(ctx, x, 3))
    finite = ctx.op("logical_and", ctx.op("ne", y, _s(ctx, x, 0)),
                    ctx.op("lt", ctx.op("abs", y), _s(ctx, x, math.inf)))
    return _where(ctx, finite, ctx.op("sub", y, step), y)


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
        t = ctx.op("add", a, ctx.op("div", _s(ctx, x, k / 2), t))
    tail = ctx.op("div", ctx.op("exp", ctx.op("neg", ctx.op("mul", a, a))),
                  ctx.op("mul", t, _s(ctx, x, math.sqrt(math.pi))))
    near = ctx.op("sub", _s(ctx, x, 1), ctx.op("erf", a))
    r = _where(ctx, ctx.op("lt", a, _s(ctx, x, _ERFC_SPLIT)), near, tail)
    r = _where(ctx, ctx.op("isnan", x), x, r)
    return _where(ctx, ctx.op("lt", x, _s(ctx, x, 0)), ctx.op("sub", _s(ctx, x, 2), r), r)


# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011): single precision
_ERFINV_W_LT_5 = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                  -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_W_GE_5 = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                  -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _erf_inv(ctx, x):
    """XLA's float32 erf_inv: w = -log1p(-x²), a degree-8 polynomial in w - 2.5 (w < 5) or
    sqrt(w) - 3, times x; ±inf at ±1, NaN beyond."""
    w = ctx.op("neg", B.log1p(ctx, ctx.op("neg", ctx.op("mul", x, x))))
    lt = ctx.op("lt", w, _s(ctx, x, 5.0))
    w = _where(ctx, lt, ctx.op("sub", w, _s(ctx, x, 2.5)), ctx.op("sub", ctx.op("sqrt", w), _s(ctx, x, 3.0)))
    p = None
    for a, b in zip(_ERFINV_W_LT_5, _ERFINV_W_GE_5):
        c = _where(ctx, lt, _s(ctx, x, a), _s(ctx, x, b))
        p = c if p is None else ctx.op("add", c, ctx.op("mul", p, w))
    r = ctx.op("mul", p, x)
    return _where(ctx, ctx.op("eq", ctx.op("abs", x), _s(ctx, x, 1)), ctx.op("mul", x, _s(ctx, x, math.inf)), r)


def _round_away(ctx, x):
    """Half away from zero: trunc(x), plus sign(x) where the fraction x - trunc(x) (exact) is
    at least one half."""
    t = B.trunc(ctx, x)
    frac = ctx.op("abs", ctx.op("sub", x, t))
    return _where(ctx, ctx.op("ge", frac, _s(ctx, x, 0.5)), ctx.op("add", t, ctx.op("sign", x)), t)


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
        return _float_math(ctx, eqn, fn, x)
    rule.__doc__ = fn.__doc__
    return rule


for _name, _fn in _FLOAT_UNARY.items():
    lowering(_name)(_float_unary_rule(_fn))


@lowering("exp2")
def exp2(ctx, eqn, x):
    """float32/float64: :func:`_exp2`.  float16/bfloat16: jax's own lowering, exp(x · ln 2) with
    ln 2 and the product rounded to the narrow type (XLA rounds each op there), so the
    result matches jax's rather than 2**x."""
    out = device_dtype(_out(eqn))
    if out in _LOW:
        return ctx.op("exp", ctx.op("mul", x, ctx.scalar(math.log(2.0), out)))
    return _float_math(ctx, eqn, _exp2, x)


@lowering("erfc")
def erfc(ctx, eqn, x):
    out = device_dtype(_out(eqn))
    if out is DType.FLOAT64:
        raise ctx.fail("float64 erfc needs a rational approximation accurate to float64 for "
                       "x in [0.5, 6]; fornax computes erfc in float64 for float32 and narrower only")
    return ctx.cast(_erfc(ctx, ctx.cast(x, DType.FLOAT64)), out)


@lowering("erf_inv")
def erf_inv(ctx, eqn, x):
    if device_dtype(_out(eqn)) is DType.FLOAT64:
        raise ctx.fail("float64 erf_inv (XLA's double-precision Giles polynomial) is not "
                       "implemented; float32 and narrower are")
    return _float_math(ctx, eqn, _erf_inv, x)


@lowering("round")
def round_(ctx, eqn, x):
    method = int(eqn.params.get("rounding_method", 0))
    return _float_math(ctx, eqn, _unary("round") if method == 1 else _round_away, x)


@lowering("is_finite")
def is_finite(ctx, eqn, x):
    return ctx.op("lt", ctx.op("abs", x), _s(ctx, x, math.inf))


@lowering("atan2")
def atan2(ctx, eqn, y, x):
    return _float_math(ctx, eqn, lambda c, a, b: c.op("atan2", a, b), y, x)


@lowering("pow")
def pow_(ctx, eqn, x, y):
    """x**y with a float or integer exponent (converted to x's type, as jax lowers it)."""
    return _float_math(ctx, eqn, lambda c, a, b: c.op("pow", a, b), x, y)


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
        return c.op("div", _s(c, acc, 1), acc) if y < 0 else acc
    if x.dtype in _LOW:
        return power(ctx, x)
    return _numeric(ctx, eqn, power, x)


@lowering("square")
def square(ctx, eqn, x):
    return _numeric(ctx, eqn, lambda c, v: c.op("mul", v, v), x)


@lowering("neg")
def neg(ctx, eqn, x):
    return _numeric(ctx, eqn, lambda c, v: c.op("neg", v), x)


@lowering("abs")
def abs_(ctx, eqn, x):
    return _numeric(ctx, eqn, lambda cx, v: cx.op("abs", v), x)


@lowering("sign")
def sign(ctx, eqn, x):
    return _numeric(ctx, eqn, lambda c, v: c.op("sign", v), x)


# ---- arithmetic --------------------------------------------------------------------------------------
def _binary(op: str):
    def rule(ctx, eqn, a, b):
        if device_dtype(_out(eqn)) is DType.BOOL:
            raise ctx.fail(f"{op} of bool operands")
        return _numeric(ctx, eqn, lambda c, x, y: c.op(op, x, y), a, b)
    return rule


lowering("add", "add_any")(_binary("add"))
lowering("sub")(_binary("sub"))
lowering("mul")(_binary("mul"))


def _int_div(ctx, jdt, a, b):
    """Integer division truncating toward zero, with XLA's answers where C has none."""
    _, _, hi, signed = _int_range(jdt)
    zero = ctx.op("eq", b, _s(ctx, b, 0))
    if not signed:
        q = ctx.op("floor_divide", a, _where(ctx, zero, _s(ctx, b, 1), b))
        return _where(ctx, zero, _s(ctx, a, hi), q)
    minus1 = ctx.op("eq", b, _s(ctx, b, -1))
    safe = _where(ctx, ctx.op("logical_or", zero, minus1), _s(ctx, b, 1), b)
    q = ctx.op("floor_divide", a, safe)
    inexact = ctx.op("ne", ctx.op("mul", q, safe), a)
    opposite = ctx.op("ne", ctx.op("lt", a, _s(ctx, a, 0)), ctx.op("lt", safe, _s(ctx, b, 0)))
    q = _where(ctx, ctx.op("logical_and", inexact, opposite), ctx.op("add", q, _s(ctx, q, 1)), q)
    q = _where(ctx, minus1, ctx.op("neg", a), q)                # INT_MIN / -1 wraps to INT_MIN
    return ctx.wrap(_where(ctx, zero, _s(ctx, a, -1), q), jdt)


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
    dt = device_dtype(_out(eqn))
    if dt in (DType.FLOAT32, DType.FLOAT64):
        c = _constant_of(b)
        if c is not None:
            recip = ctx.const(np.reciprocal(np.asarray(c, dt.numpy)))
            if tuple(recip.shape) != tuple(b.shape):
                recip = ctx.op("broadcast_to", recip, shape=tuple(b.shape))
            return ctx.op("mul", a, recip)
    if dt.is_float:
        return _float_math(ctx, eqn, lambda c, x, y: c.op("div", x, y), a, b)
    return _int_div(ctx, _out(eqn), a, b)


@lowering("empty", "empty2")
def empty(ctx, eqn, *args):
    """An array whose contents the program never reads before writing (a scan's stacked
    outputs under differentiation); XLA materialises it as zeros, and so does fornax."""
    dt = device_dtype(_out(eqn))
    shape = _shape(eqn)
    zero = ctx.scalar(False if dt is DType.BOOL else 0, dt)
    return ctx.op("broadcast_to", zero, shape=shape) if shape else zero


def _fmod(ctx, a, b):
    """C's fmod: sign(a) · fmod(|a|, |b|), the floor remainder of non-negative operands (exact)."""
    return _signed(ctx, a, ctx.op("remainder", ctx.op("abs", a), ctx.op("abs", b)))


@lowering("rem")
def rem(ctx, eqn, a, b):
    """The remainder with the dividend's sign (C fmod); an integer x % 0 is x."""
    if device_dtype(_out(eqn)).is_float:
        return _float_math(ctx, eqn, _fmod, a, b)
    zero = ctx.op("eq", b, _s(ctx, b, 0))
    safe = _where(ctx, ctx.op("logical_or", zero, ctx.op("eq", b, _s(ctx, b, -1))), _s(ctx, b, 1), b)
    r = ctx.op("remainder", a, safe)                             # the divisor's sign
    fix = ctx.op("logical_and", ctx.op("ne", r, _s(ctx, r, 0)),
                 ctx.op("ne", ctx.op("lt", r, _s(ctx, r, 0)), ctx.op("lt", a, _s(ctx, a, 0))))
    r = _where(ctx, fix, ctx.op("sub", r, safe), r)
    return _where(ctx, zero, a, r)


#: (mantissa bits, exponent of the smallest normal) of each float format
_FLOAT_FORMAT = {DType.FLOAT64: (52, -1022), DType.FLOAT32: (23, -126), DType.FLOAT16: (10, -14),
                 DType.BFLOAT16: (7, -126)}


@lowering("nextafter")
def nextafter(ctx, eqn, x, y):
    """The representable value next to x toward y: x ± the ulp 2**(e - m) of the binade of |x|
    (e from a log2 estimate corrected by comparing powers of two, at least the smallest normal
    exponent, so zero and subnormals step by the smallest subnormal), half of it moving toward
    zero from a normal power of two; ±inf steps to ±max; y when x == y; NaN with a NaN."""
    out = device_dtype(_out(eqn))
    m, emin = _FLOAT_FORMAT[out]
    cdt = _compute(out)
    x, y = ctx.cast(x, cdt), ctx.cast(y, cdt)
    a = ctx.op("abs", x)
    two = _s(ctx, x, 2.0)
    e = ctx.op("floor", ctx.op("div", ctx.op("log", a), _s(ctx, x, math.log(2.0))))
    e = _where(ctx, ctx.op("gt", ctx.op("pow", two, e), a), ctx.op("sub", e, _s(ctx, x, 1)), e)
    e = _where(ctx, ctx.op("le", ctx.op("pow", two, ctx.op("add", e, _s(ctx, x, 1))), a),
               ctx.op("add", e, _s(ctx, x, 1)), e)
    e = ctx.op("maximum", e, _s(ctx, x, emin))
    up = ctx.op("pow", two, ctx.op("sub", e, _s(ctx, x, m)))
    zero = _s(ctx, x, 0)
    rising = ctx.op("gt", y, x)
    away = ctx.op("logical_or", ctx.op("eq", x, zero), ctx.op("eq", rising, ctx.op("gt", x, zero)))
    binade_floor = ctx.op("logical_and", ctx.op("eq", a, ctx.op("pow", two, e)), ctx.op("gt", e, _s(ctx, x, emin)))
    step = _where(ctx, ctx.op("logical_or", away, ctx.op("logical_not", binade_floor)), up,
                  ctx.op("mul", up, _s(ctx, x, 0.5)))
    r = ctx.op("add", x, _where(ctx, rising, step, ctx.op("neg", step)))
    top = float(ml_dtypes.finfo(out.numpy).max)
    r = _where(ctx, ctx.op("eq", a, _s(ctx, x, math.inf)), ctx.op("mul", ctx.op("sign", x), _s(ctx, x, top)), r)
    r = _where(ctx, ctx.op("eq", x, y), y, r)
    r = _where(ctx, ctx.op("logical_or", ctx.op("isnan", x), ctx.op("isnan", y)), _s(ctx, x, math.nan), r)
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


# ---- bits and logic --------------------------------------------------------------------------------------
def _bitwise(logical: str, bitwise: str):
    def rule(ctx, eqn, a, b):
        return ctx.op(logical if a.dtype is DType.BOOL else bitwise, a, b)
    return rule


lowering("and")(_bitwise("logical_and", "bitwise_and"))
lowering("or")(_bitwise("logical_or", "bitwise_or"))
lowering("xor")(_bitwise("ne", "bitwise_xor"))


@lowering("not")
def not_(ctx, eqn, x):
    """Logical not of bool, bitwise not of integers (-x - 1 signed, max - x unsigned)."""
    if x.dtype is DType.BOOL:
        return ctx.op("logical_not", x)
    _, _, hi, signed = _int_range(_out(eqn))
    if not signed:
        return ctx.op("sub", _s(ctx, x, hi), x)
    return ctx.op("sub", ctx.op("neg", x), _s(ctx, x, 1))


def _pow2(ctx, s: Value) -> Value:
    """2**s for 0 <= s < the width of s's dtype (2**(width-1) wraps to the minimum)."""
    return ctx.op("pow", _s(ctx, s, 2), s)


def _shift_parts(ctx, eqn, x, s):
    """(bits, signed, the shift amount as x's dtype, "s is out of [0, bits)")."""
    bits, _, _, signed = _int_range(_out(eqn))
    s = ctx.cast(s, x.dtype)
    out = ctx.op("logical_or", ctx.op("lt", s, _s(ctx, s, 0)), ctx.op("ge", s, _s(ctx, s, bits)))
    return bits, signed, s, out


def _arith_right(ctx, v, s, bits):
    """v >> s with sign fill for a signed value ``v`` and any s >= 0: floor division by 2**s
    (s <= bits - 2, so the power is positive), the sign fill from bits - 1 on."""
    fill = _where(ctx, ctx.op("lt", v, _s(ctx, v, 0)), _s(ctx, v, -1), _s(ctx, v, 0))
    q = ctx.op("floor_divide", v, _pow2(ctx, _clip(ctx, s, 0, bits - 2)))
    return _where(ctx, ctx.op("ge", s, _s(ctx, s, bits - 1)), fill, q)


def _as_signed(ctx, x, bits, signed):
    """The value of x's bit pattern read as a signed integer (carried unsigned values above
    the sign bit go negative)."""
    if signed:
        return x
    return _where(ctx, ctx.op("ge", x, _s(ctx, x, 1 << (bits - 1))), ctx.op("sub", x, _s(ctx, x, 1 << bits)), x)


@lowering("shift_left")
def shift_left(ctx, eqn, x, s):
    bits, _, s, out = _shift_parts(ctx, eqn, x, s)
    r = ctx.op("mul", x, _pow2(ctx, _clip(ctx, s, 0, bits - 1)))
    return ctx.wrap(_where(ctx, out, _s(ctx, x, 0), r), _out(eqn))


@lowering("shift_right_arithmetic")
def shift_right_arithmetic(ctx, eqn, x, s):
    bits, signed, s, out = _shift_parts(ctx, eqn, x, s)
    v = _as_signed(ctx, x, bits, signed)
    r = _arith_right(ctx, v, _where(ctx, out, _s(ctx, s, bits - 1), s), bits)
    return ctx.wrap(r, _out(eqn))


@lowering("shift_right_logical")
def shift_right_logical(ctx, eqn, x, s):
    """The arithmetic shift of the bit pattern with its top s bits cleared (a mask 2**(bits-s) - 1,
    whose power wraps to the minimum for s = 1, the mask then wrapping to the maximum)."""
    bits, signed, s, out = _shift_parts(ctx, eqn, x, s)
    v = _as_signed(ctx, x, bits, signed)
    sc = _clip(ctx, s, 1, bits - 1)
    mask = ctx.op("sub", _pow2(ctx, ctx.op("sub", _s(ctx, s, bits), sc)), _s(ctx, s, 1))
    r = ctx.op("bitwise_and", _arith_right(ctx, v, sc, bits), mask)
    r = _where(ctx, ctx.op("eq", s, _s(ctx, s, 0)), x, ctx.wrap(r, _out(eqn)))
    return _where(ctx, out, _s(ctx, x, 0), r)


def _popcount32(ctx, u):
    """Set bits of int64 values in [0, 2**32) (the SWAR reduction)."""
    def band(v, m):
        return ctx.op("bitwise_and", v, _s(ctx, v, m))

    def shr(v, n):
        return ctx.op("floor_divide", v, _s(ctx, v, 1 << n))
    u = ctx.op("sub", u, band(shr(u, 1), 0x55555555))
    u = ctx.op("add", band(u, 0x33333333), band(shr(u, 2), 0x33333333))
    u = band(ctx.op("add", u, shr(u, 4)), 0x0F0F0F0F)
    return band(shr(ctx.op("mul", u, _s(ctx, u, 0x01010101)), 24), 0xFF)


@lowering("population_count")
def population_count(ctx, eqn, x):
    bits, _, _, _ = _int_range(_out(eqn))
    w = ctx.cast(x, DType.INT64)
    n = _popcount32(ctx, ctx.op("bitwise_and", w, _s(ctx, w, (1 << min(bits, 32)) - 1)))
    if bits == 64:
        high = ctx.op("bitwise_and", ctx.op("floor_divide", w, _s(ctx, w, 1 << 32)), _s(ctx, w, 0xFFFFFFFF))
        n = ctx.op("add", n, _popcount32(ctx, high))
    return ctx.cast(n, device_dtype(_out(eqn)))


def _compare(op: str):
    def rule(ctx, eqn, a, b):
        return ctx.op(op, a, b)
    return rule


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    lowering(_name)(_compare(_name))


@lowering("select_n")
def select_n(ctx, eqn, which, *cases):
    """``cases[which]``: a bool predicate picks case 1 where true; an int32 one indexes."""
    if len(cases) == 1:
        return B.broadcast(ctx, cases[0], _shape(eqn))
    if which.dtype is DType.BOOL:
        r = _where(ctx, which, cases[1], cases[0])
    else:
        r = cases[-1]
        for i in reversed(range(len(cases) - 1)):
            r = _where(ctx, ctx.op("eq", which, _s(ctx, which, i)), cases[i], r)
    return B.broadcast(ctx, r, _shape(eqn))


# ---- conversions -------------------------------------------------------------------------------------------
def _float_to_int(ctx, x, jdt):
    """Truncation toward zero, saturating at the range of ``jdt``, NaN to 0 (XLA CPU).  The
    bounds lo and hi + 1 are powers of two (exact in any float); x is clamped to lo and the
    float below hi + 1, truncated through int64, and hi taken from hi + 1 up."""
    _, lo, hi, _ = _int_range(jdt)
    x = ctx.cast(x, _compute(x.dtype))
    x = _where(ctx, ctx.op("isnan", x), _s(ctx, x, 0), x)
    top = float(hi + 1)
    below = float(np.nextafter(x.dtype.numpy.type(top), 0))     # the largest float under top
    r = ctx.cast(_clip(ctx, x, float(lo), below), DType.INT64)
    r = _where(ctx, ctx.op("ge", x, _s(ctx, x, top)), ctx.scalar(hi, DType.INT64), r)
    return ctx.cast(r, device_dtype(jdt))


@lowering("convert_element_type")
def convert_element_type(ctx, eqn, x):
    src, dst = _in(eqn), _out(eqn)
    sd, dd = device_dtype(src), device_dtype(dst)
    if dd is DType.BOOL:
        return x if sd is DType.BOOL else ctx.op("ne", x, _s(ctx, x, 0))
    if dd.is_float or sd is DType.BOOL:
        return ctx.cast(x, dd)
    if sd.is_float:
        return _float_to_int(ctx, x, dst)
    return ctx.wrap(ctx.cast(x, dd), dst)


#: (exponent_bits, mantissa_bits) of the formats reduce_precision rounds to by a cast
_FORMATS = {(8, 7): DType.BFLOAT16, (5, 10): DType.FLOAT16, (8, 23): DType.FLOAT32, (11, 52): DType.FLOAT64}
_BITS = {dt: fmt for fmt, dt in _FORMATS.items()}


@lowering("reduce_precision")
def reduce_precision(ctx, eqn, x):
    """Round to a narrower format's mantissa (to nearest even, overflowing to inf) and, where the
    exponent narrows, flush results below its smallest normal to signed zero; the mantissa
    of such small values is rounded at the scale of their own exponent (not the format's
    subnormal grid), as XLA does."""
    e, m = int(eqn.params["exponent_bits"]), int(eqn.params["mantissa_bits"])
    out = device_dtype(_out(eqn))
    src = _compute(out)
    se, sm = _BITS[out]
    if e >= se and m >= sm:
        return x
    fmt = _FORMATS.get((e, m))
    if fmt is None:
        raise ctx.fail(f"reduce_precision to {e} exponent and {m} mantissa bits: fornax rounds only "
                       f"to the formats it has ({', '.join(f'{d.value} {k}' for k, d in _FORMATS.items())})")
    v = ctx.cast(x, src)
    y = ctx.cast(ctx.cast(v, fmt), src)
    if e < se:
        tiny = 2.0 ** (2 - (1 << (e - 1)))                     # the smallest normal of the format
        scale = 2.0 ** (m + 1)
        ys = ctx.op("div", ctx.cast(ctx.cast(ctx.op("mul", v, _s(ctx, v, scale)), fmt), src), _s(ctx, v, scale))
        kept = _where(ctx, ctx.op("ge", ctx.op("abs", ys), _s(ctx, v, tiny)), ys, ctx.op("mul", v, _s(ctx, v, 0)))
        y = _where(ctx, ctx.op("lt", ctx.op("abs", v), _s(ctx, v, tiny)), kept, y)
    return ctx.cast(y, out)


@lowering("copy", "optimization_barrier", "stop_gradient")
def identity(ctx, eqn, *xs):
    """Values pass through (``stop_gradient`` only matters to differentiation, which has run)."""
    return list(xs)


# ---- reductions ----------------------------------------------------------------------------------------------
def _axes(eqn) -> list[int]:
    return sorted(int(a) for a in eqn.params["axes"])


def _over_axes(ctx, eqn, x, reduce_one) -> Value:
    """``reduce_one(x, axis)`` (keeping the axis) for each reduced axis, then the result's shape."""
    for a in _axes(eqn):
        x = reduce_one(x, a)
    return B.reshape(ctx, x, _shape(eqn))


def _accumulating(ctx, eqn, x, reduce_one) -> Value:
    """A sum-like reduction: floats in their compute dtype (float32 for float16/bfloat16),
    integers in their device dtype wrapped once at the end (exact mod 2**bits)."""
    out = device_dtype(_out(eqn))
    r = _over_axes(ctx, eqn, ctx.cast(x, _compute(out)), reduce_one)
    return ctx.cast(r, out) if out.is_float else ctx.wrap(r, _out(eqn))


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
        return _where(ctx, ctx.op("eq", ctx.op("abs", hi), _s(ctx, hi, math.inf)), hi, r)
    return combine


def _cumulative(kind: str):
    def rule(ctx, eqn, x):
        axis, reverse = int(eqn.params["axis"]), bool(eqn.params["reverse"])
        jdt = _out(eqn)
        out = device_dtype(jdt)
        v = ctx.cast(x, _compute(out))
        if kind in ("max", "min"):
            if out.is_float:
                unit = -math.inf if kind == "max" else math.inf
            else:
                _, lo, hi, _ = _int_range(jdt)
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


# ---- layout --------------------------------------------------------------------------------------------------
@lowering("broadcast_in_dim")
def broadcast_in_dim(ctx, eqn, x, *dyn):
    if dyn:
        raise ctx.fail("dynamic shapes are not supported")
    shape = _ints(eqn.params["shape"])
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
        x = B.permute(ctx, x, _ints(dims))
    return B.reshape(ctx, x, _ints(eqn.params["new_sizes"]))


@lowering("squeeze")
def squeeze(ctx, eqn, x):
    return B.reshape(ctx, x, _shape(eqn))


@lowering("transpose")
def transpose(ctx, eqn, x):
    return B.permute(ctx, x, _ints(eqn.params["permutation"]))


@lowering("rev")
def rev(ctx, eqn, x):
    for d in sorted({int(d) for d in eqn.params["dimensions"]}):
        n = x.shape[d]
        if n > 1:
            x = ctx.op("index_select", x, ctx.const(np.arange(n - 1, -1, -1, dtype=np.int64)), axis=d)
    return x


@lowering("slice")
def slice_(ctx, eqn, x):
    start = _ints(eqn.params["start_indices"])
    stop = _ints(eqn.params["limit_indices"])
    step = _ints(eqn.params["strides"] or (1,) * len(start))
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
    for n in _ints(eqn.params["sizes"]):
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
    r = ctx.op("iota", shape=_ints(eqn.params["shape"]), axis=int(eqn.params["dimension"]), dtype="int64")
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


# ---- contractions and convolution -------------------------------------------------------------------------
@lowering("dot_general")
def dot_general(ctx, eqn, a, b):
    """Float operands contract in float32 (float16/bfloat16) or their own dtype and round once;
    integer ones as a broadcast product summed over the contracting dims, wrapping."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lc, rc, lb, rb = _ints(lc), _ints(rc), _ints(lb), _ints(rb)
    out = device_dtype(_out(eqn))
    if out.is_float:
        cdt = _compute(out)
        y = ctx.op("dot_general", ctx.cast(a, cdt), ctx.cast(b, cdt), lhs_contracting=lc, rhs_contracting=rc,
                   lhs_batch=lb, rhs_batch=rb)
        return ctx.cast(y, out)
    if out is DType.BOOL:
        raise ctx.fail("dot_general of bool operands")
    lf = [d for d in range(len(a.shape)) if d not in lc + lb]
    rf = [d for d in range(len(b.shape)) if d not in rc + rb]
    size = (lambda v, dims: math.prod(v.shape[d] for d in dims))
    nb, m, k, n = size(a, lb), size(a, lf), size(a, lc), size(b, rf)
    if nb * m * k * n > MAX_INT_DOT:
        raise ctx.fail(f"an integer dot_general forms its {nb}x{m}x{k}x{n} broadcast product; fornax "
                       f"builds at most {MAX_INT_DOT} elements (the graph IR has no integer matmul)")
    a4 = B.reshape(ctx, B.permute(ctx, ctx.cast(a, out), lb + tuple(lf) + lc), (nb, m, k, 1))
    b4 = B.reshape(ctx, B.permute(ctx, ctx.cast(b, out), rb + rc + tuple(rf)), (nb, 1, k, n))
    y = ctx.op("reduce_sum", ctx.op("mul", a4, b4), axis=2, keepdims=False)
    return ctx.wrap(B.reshape(ctx, y, _shape(eqn)), _out(eqn))


@lowering("conv_general_dilated")
def conv_general_dilated(ctx, eqn, lhs, rhs):
    """Operands transposed into (N, C, *spatial) / (O, I, *kernel) by the dimension numbers;
    the ``convolution`` op (routable to a DNN library) without input dilation or negative
    padding, else im2col (which dilates and crops) and one matmul per group.  A batch group
    count G splits the lhs batch into G contiguous groups, group g meeting the g-th block of
    output features: the batch groups become channel groups of a grouped convolution."""
    p = eqn.params
    out = device_dtype(_out(eqn))
    if not out.is_float:
        raise ctx.fail(f"integer convolution ({_in(eqn)} operands): the graph IR convolves floats only")
    dn = p["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = _ints(dn.lhs_spec), _ints(dn.rhs_spec), _ints(dn.out_spec)
    cdt = _compute(out)
    x = B.permute(ctx, ctx.cast(lhs, cdt), lhs_spec)
    w = B.permute(ctx, ctx.cast(rhs, cdt), rhs_spec)
    groups, bgroups = int(p["feature_group_count"]), int(p["batch_group_count"])
    if bgroups > 1:
        if groups > 1:
            raise ctx.fail("feature_group_count and batch_group_count both above 1")
        n, c, spatial = x.shape[0], x.shape[1], list(x.shape[2:])
        x = B.reshape(ctx, x, [bgroups, n // bgroups, c] + spatial)
        x = B.permute(ctx, x, [1, 0, 2] + list(range(3, 3 + len(spatial))))
        x = B.reshape(ctx, x, [n // bgroups, bgroups * c] + spatial)
        groups = bgroups
    oshape = _shape(eqn)
    out_spatial = tuple(oshape[d] for d in out_spec[2:])
    stride, rhs_dil, lhs_dil = _ints(p["window_strides"]), _ints(p["rhs_dilation"]), _ints(p["lhs_dilation"])
    padding = tuple((int(lo), int(hi)) for lo, hi in p["padding"])
    if set(lhs_dil) <= {1} and all(lo >= 0 and hi >= 0 for lo, hi in padding):
        y = ctx.op("convolution", x, w, stride=stride, padding=padding, dilation=rhs_dil, groups=groups)
    else:
        y = _conv_via_im2col(ctx.graph, x, w, x.shape[0], w.shape[0], groups, out_spatial, stride=stride,
                             padding=padding, dilation=rhs_dil, lhs_dilation=lhs_dil)
    back = [0] * len(out_spec)
    for i, d in enumerate(out_spec):
        back[d] = i
    return ctx.cast(B.permute(ctx, y, back), out)


# ---- sorting ---------------------------------------------------------------------------------------------
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
    idx_dt = device_dtype(_out(eqn, 1))
    if not x.dtype.is_float:
        vals, idx = B.top_k(ctx, x, k, d, True)
        return vals, ctx.cast(idx, idx_dt)
    wide = ctx.cast(x, DType.FLOAT64)
    zero = _s(ctx, wide, 0)
    neg_zero = ctx.op("logical_and", ctx.op("eq", wide, zero), ctx.op("lt", ctx.op("reciprocal", wide), zero))
    if x.dtype is not DType.FLOAT64:
        key = _where(ctx, neg_zero, _s(ctx, wide, -math.ldexp(1.0, -1074)), wide)
        vals, idx = B.top_k(ctx, key, k, d, True)
        return ctx.cast(vals, x.dtype), ctx.cast(idx, idx_dt)
    pos_zero = ctx.op("logical_and", ctx.op("eq", wide, zero), ctx.op("logical_not", neg_zero))
    order = B.sort_order(ctx, [x, ctx.cast(pos_zero, DType.INT32)], d, descending=True)
    stop = tuple(k if a == d else n for a, n in enumerate(x.shape))
    idx = ctx.op("slice", order, start=(0,) * len(x.shape), stop=stop)
    return ctx.op("gather", x, idx, axis=d), ctx.cast(idx, idx_dt)
