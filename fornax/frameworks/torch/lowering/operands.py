"""Operands in a dtype: :func:`operand` (a Value or a Python scalar as a Value of a given
dtype), :func:`binop` (a binary graph op in the promoted compute dtype), the
``*_in`` arithmetic helpers (both operands made the given dtype first) and :func:`zeros_as`."""

from __future__ import annotations

from fornax.layers.graph import DType, Value
from fornax.frameworks.builders import full as _full

from .context import LowerCtx
from .promotion import promote

#: what arithmetic takes: a graph Value or a Python number (bool and int included)
Operand = Value | float


def operand(ctx: LowerCtx, x: Operand, dt: DType) -> Value:
    """A Value or Python scalar as a Value of ``dt``."""
    return ctx.cast(x, dt) if isinstance(x, Value) else ctx.scalar(x, dt)


def binop(ctx: LowerCtx, name: str, a: Operand, b: Operand, kind: str = "default") -> Value:
    cdt, _ = promote(a, b, kind=kind)
    return ctx.op(name, operand(ctx, a, cdt), operand(ctx, b, cdt))


def zeros_as(ctx: LowerCtx, v: Value) -> Value:
    return _full(ctx, v.shape, 0, v.dtype)


def div_in(ctx: LowerCtx, a: Operand, b: Operand, dt: DType) -> Value:
    return ctx.op("div", operand(ctx, a, dt), operand(ctx, b, dt))


def mul_in(ctx: LowerCtx, a: Operand, b: Operand, dt: DType) -> Value:
    return ctx.op("mul", operand(ctx, a, dt), operand(ctx, b, dt))


def add_in(ctx: LowerCtx, a: Operand, b: Operand, dt: DType) -> Value:
    return ctx.op("add", operand(ctx, a, dt), operand(ctx, b, dt))


def sub_in(ctx: LowerCtx, a: Operand, b: Operand, dt: DType) -> Value:
    return ctx.op("sub", operand(ctx, a, dt), operand(ctx, b, dt))


def where_in(ctx: LowerCtx, cond: Value, a: Operand, b: Operand, dt: DType) -> Value:
    return ctx.op("where", cond, operand(ctx, a, dt), operand(ctx, b, dt))
