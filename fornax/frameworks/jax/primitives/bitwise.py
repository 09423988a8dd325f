"""Lowering rules of jax's bit and logic operations, comparisons and ``select_n``: ``and`` /
``or`` / ``xor`` / ``not`` (logical on bool, bitwise on integers), the three shifts,
``population_count``, ``eq``/``ne``/``lt``/``le``/``gt``/``ge``.

Shifts by at least the bit width (or by a negative amount) give 0, or the sign fill for
``shift_right_arithmetic``, which shifts the bit pattern of unsigned types as signed.
"""

from __future__ import annotations

from ....layers.graph import DType, Value
from ... import builders as B
from ..lowering import device_dtype, lowering
from .common import clip, int_range, out_dtype, out_shape, scalar_like, where


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
    _, _, hi, signed = int_range(out_dtype(eqn))
    if not signed:
        return ctx.op("sub", scalar_like(ctx, x, hi), x)
    return ctx.op("sub", ctx.op("neg", x), scalar_like(ctx, x, 1))


def _pow2(ctx, s: Value) -> Value:
    """2**s for 0 <= s < the width of s's dtype (2**(width-1) wraps to the minimum)."""
    return ctx.op("pow", scalar_like(ctx, s, 2), s)


def _shift_parts(ctx, eqn, x, s):
    """(bits, signed, the shift amount as x's dtype, "s is out of [0, bits)")."""
    bits, _, _, signed = int_range(out_dtype(eqn))
    s = ctx.cast(s, x.dtype)
    out = ctx.op("logical_or", ctx.op("lt", s, scalar_like(ctx, s, 0)), ctx.op("ge", s, scalar_like(ctx, s, bits)))
    return bits, signed, s, out


def _arith_right(ctx, v, s, bits):
    """v >> s with sign fill for a signed value ``v`` and any s >= 0: floor division by 2**s
    (s <= bits - 2, so the power is positive), the sign fill from bits - 1 on."""
    fill = where(ctx, ctx.op("lt", v, scalar_like(ctx, v, 0)), scalar_like(ctx, v, -1), scalar_like(ctx, v, 0))
    q = ctx.op("floor_divide", v, _pow2(ctx, clip(ctx, s, 0, bits - 2)))
    return where(ctx, ctx.op("ge", s, scalar_like(ctx, s, bits - 1)), fill, q)


def _as_signed(ctx, x, bits, signed):
    """The value of x's bit pattern read as a signed integer (carried unsigned values above
    the sign bit go negative)."""
    if signed:
        return x
    return where(ctx, ctx.op("ge", x, scalar_like(ctx, x, 1 << (bits - 1))), ctx.op("sub", x, scalar_like(ctx, x, 1 << bits)), x)


@lowering("shift_left")
def shift_left(ctx, eqn, x, s):
    bits, _, s, out = _shift_parts(ctx, eqn, x, s)
    r = ctx.op("mul", x, _pow2(ctx, clip(ctx, s, 0, bits - 1)))
    return ctx.wrap(where(ctx, out, scalar_like(ctx, x, 0), r), out_dtype(eqn))


@lowering("shift_right_arithmetic")
def shift_right_arithmetic(ctx, eqn, x, s):
    bits, signed, s, out = _shift_parts(ctx, eqn, x, s)
    v = _as_signed(ctx, x, bits, signed)
    r = _arith_right(ctx, v, where(ctx, out, scalar_like(ctx, s, bits - 1), s), bits)
    return ctx.wrap(r, out_dtype(eqn))


@lowering("shift_right_logical")
def shift_right_logical(ctx, eqn, x, s):
    """The arithmetic shift of the bit pattern with its top s bits cleared (a mask 2**(bits-s) - 1,
    whose power wraps to the minimum for s = 1, the mask then wrapping to the maximum)."""
    bits, signed, s, out = _shift_parts(ctx, eqn, x, s)
    v = _as_signed(ctx, x, bits, signed)
    sc = clip(ctx, s, 1, bits - 1)
    mask = ctx.op("sub", _pow2(ctx, ctx.op("sub", scalar_like(ctx, s, bits), sc)), scalar_like(ctx, s, 1))
    r = ctx.op("bitwise_and", _arith_right(ctx, v, sc, bits), mask)
    r = where(ctx, ctx.op("eq", s, scalar_like(ctx, s, 0)), x, ctx.wrap(r, out_dtype(eqn)))
    return where(ctx, out, scalar_like(ctx, x, 0), r)


def _popcount32(ctx, u):
    """Set bits of int64 values in [0, 2**32) (the SWAR reduction)."""
    def band(v, m):
        return ctx.op("bitwise_and", v, scalar_like(ctx, v, m))

    def shr(v, n):
        return ctx.op("floor_divide", v, scalar_like(ctx, v, 1 << n))
    u = ctx.op("sub", u, band(shr(u, 1), 0x55555555))
    u = ctx.op("add", band(u, 0x33333333), band(shr(u, 2), 0x33333333))
    u = band(ctx.op("add", u, shr(u, 4)), 0x0F0F0F0F)
    return band(shr(ctx.op("mul", u, scalar_like(ctx, u, 0x01010101)), 24), 0xFF)


@lowering("population_count")
def population_count(ctx, eqn, x):
    bits, _, _, _ = int_range(out_dtype(eqn))
    w = ctx.cast(x, DType.INT64)
    n = _popcount32(ctx, ctx.op("bitwise_and", w, scalar_like(ctx, w, (1 << min(bits, 32)) - 1)))
    if bits == 64:
        high = ctx.op("bitwise_and", ctx.op("floor_divide", w, scalar_like(ctx, w, 1 << 32)), scalar_like(ctx, w, 0xFFFFFFFF))
        n = ctx.op("add", n, _popcount32(ctx, high))
    return ctx.cast(n, device_dtype(out_dtype(eqn)))


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
        return B.broadcast(ctx, cases[0], out_shape(eqn))
    if which.dtype is DType.BOOL:
        r = where(ctx, which, cases[1], cases[0])
    else:
        r = cases[-1]
        for i in reversed(range(len(cases) - 1)):
            r = where(ctx, ctx.op("eq", which, scalar_like(ctx, which, i)), cases[i], r)
    return B.broadcast(ctx, r, out_shape(eqn))
