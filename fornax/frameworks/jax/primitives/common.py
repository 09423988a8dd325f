"""Helpers every family of primitive rules shares: the jax dtypes and shape of an equation's
operands and results, the dtype elementwise math runs in, integer ranges, and small graph
idioms (a scalar of an operand's dtype, ``where``, clipping, copying a sign).

``eqn`` is a jaxpr equation (or the key-data view :mod:`..lowering` makes of one): only its
``params`` and the avals of ``invars`` / ``outvars`` are read.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

from ....layers.graph import DType, Value
from ..lowering import LowerCtx, carried_of, device_dtype_of

#: the float dtypes whose arithmetic is done in float32 and rounded once per primitive
LOW_FLOATS = (DType.FLOAT16, DType.BFLOAT16)


# ---- types -----------------------------------------------------------------------------------------
def out_dtype(eqn: Any, i: int = 0) -> Any:
    """The jax dtype of result ``i``."""
    return eqn.outvars[i].aval.dtype


def in_dtype(eqn: Any, i: int = 0) -> Any:
    """The jax dtype of operand ``i``."""
    return eqn.invars[i].aval.dtype


def out_shape(eqn: Any, i: int = 0) -> tuple[int, ...]:
    """The shape of result ``i``."""
    return tuple(int(d) for d in eqn.outvars[i].aval.shape)


def compute_dtype(dt: DType) -> DType:
    """The dtype elementwise math on ``dt`` runs in (float32 for float16/bfloat16)."""
    return DType.FLOAT32 if dt in LOW_FLOATS else dt


def int_range(jdt: Any) -> tuple[int, int, int, bool]:
    """(bits, lo, hi, signed) of an integer jax dtype."""
    c = carried_of(jdt)
    if c.carried:
        return c.bits, c.lo, c.hi, c.signed
    info = np.iinfo(c.dtype.numpy)
    return info.bits, int(info.min), int(info.max), True


def ints(values: Iterable[Any]) -> tuple[int, ...]:
    """``values`` (a jaxpr parameter's sequence) as Python ints."""
    return tuple(int(v) for v in values)


# ---- computing in the right dtype ------------------------------------------------------------------
def float_math(ctx: LowerCtx, eqn: Any, fn: Callable[..., Value], *xs: Value) -> Value:
    """``fn(ctx, *xs)`` computed in the compute dtype of the (float) result, cast once."""
    out = device_dtype_of(out_dtype(eqn))
    if not out.is_float:
        raise ctx.fail(f"needs a floating-point result, got {out_dtype(eqn)}")
    cdt = compute_dtype(out)
    return ctx.cast(fn(ctx, *(ctx.cast(x, cdt) for x in xs)), out)


def numeric(ctx: LowerCtx, eqn: Any, fn: Callable[..., Value], *xs: Value) -> Value:
    """``fn(ctx, *xs)`` for any numeric result: floats as :func:`float_math`, integers in
    their device dtype, wrapped back into the jax type's range."""
    out = device_dtype_of(out_dtype(eqn))
    if out.is_float:
        return float_math(ctx, eqn, fn, *xs)
    return ctx.wrap(fn(ctx, *(ctx.cast(x, out) for x in xs)), out_dtype(eqn))


# ---- graph idioms -------------------------------------------------------------------------------------
def where(ctx: LowerCtx, cond: Value, a: Value, b: Value) -> Value:
    """``a`` where ``cond`` holds, else ``b``."""
    return ctx.op("where", cond, a, b)


def scalar_like(ctx: LowerCtx, x: Value, value: float) -> Value:
    """A scalar constant of ``x``'s dtype."""
    return ctx.scalar(value, x.dtype)


def clip(ctx: LowerCtx, x: Value, lo: float, hi: float) -> Value:
    """x limited to the numbers [lo, hi] (NaN stays NaN)."""
    return ctx.op("minimum", ctx.op("maximum", x, scalar_like(ctx, x, lo)), scalar_like(ctx, x, hi))


def with_sign(ctx: LowerCtx, x: Value, r: Value) -> Value:
    """``r`` (computed for |x|) with x's sign."""
    return where(ctx, ctx.op("lt", x, scalar_like(ctx, x, 0)), ctx.op("neg", r), r)
