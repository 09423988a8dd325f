"""Dropout lowerings: ``native_dropout`` when it draws no random numbers (``p`` of 0 or 1, or
not training: random draws belong to the framework's generator) and ``native_dropout_backward``."""

from __future__ import annotations

from fornax.layers.graph import DType
from fornax.frameworks.builders import full as _full

from .operands import zeros_as
from .promotion import compute_dtype
from .table import lowering


@lowering("aten::native_dropout.default")
def native_dropout(ctx, input, p, train):
    if train is False or p == 0:
        return input, _full(ctx, input.shape, True, DType.BOOL)
    if p == 1:
        return zeros_as(ctx, input), _full(ctx, input.shape, False, DType.BOOL)
    raise ctx.fail(f"dropout with p={p} in training draws random numbers; fornax lowers it only for "
                   "p == 0, p == 1 or eval (the framework's generator owns RNG)")


@lowering("aten::native_dropout_backward.default")
def native_dropout_backward(ctx, grad_output, mask, scale):
    dt = compute_dtype(ctx)
    g = ctx.op("mul", ctx.cast(grad_output, dt), ctx.cast(mask, dt))
    return ctx.op("mul", g, ctx.scalar(scale, dt))
