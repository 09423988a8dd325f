"""Softmax lowerings: ``_softmax``, ``_log_softmax``, ``_safe_softmax`` and the backward ops
``_softmax_backward_data``, ``_log_softmax_backward_data``."""

from __future__ import annotations

import math

from fornax.layers.graph import DType
from fornax.frameworks.builders import reshape as _reshape

from .axes import ndim, reduce_dims, reduction_dims, sum_dims, wrap_dim
from .promotion import compute_dtype, float_in
from .table import lowering


def _axis_op(ctx, name, x, dim, **attrs):
    """A graph op with an ``axis`` on ``x``; a 0-d ``x`` is treated as shape (1,)."""
    if ndim(x) == 0:
        return _reshape(ctx, ctx.op(name, _reshape(ctx, x, (1,)), axis=0, **attrs), ())
    return ctx.op(name, x, axis=wrap_dim(dim, ndim(x)), **attrs)


@lowering("aten::_softmax.default")
def _softmax(ctx, self, dim, half_to_float=False):
    return _axis_op(ctx, "softmax", float_in(ctx, self), dim)


@lowering("aten::_log_softmax.default")
def _log_softmax(ctx, self, dim, half_to_float=False):
    return _axis_op(ctx, "log_softmax", float_in(ctx, self), dim)


@lowering("aten::_softmax_backward_data.default")
def _softmax_backward_data(ctx, grad_output, output, dim, input_dtype):
    dt = compute_dtype(ctx)
    g, y = ctx.cast(grad_output, dt), ctx.cast(output, dt)
    gy = ctx.op("mul", g, y)
    d = reduction_dims(dim, ndim(y))
    return ctx.op("mul", y, ctx.op("sub", g, sum_dims(ctx, gy, d)))


@lowering("aten::_log_softmax_backward_data.default")
def _log_softmax_backward_data(ctx, grad_output, output, dim, input_dtype):
    dt = compute_dtype(ctx)
    g, y = ctx.cast(grad_output, dt), ctx.cast(output, dt)
    d = reduction_dims(dim, ndim(y))
    return ctx.op("sub", g, ctx.op("mul", ctx.op("exp", y), sum_dims(ctx, g, d)))


@lowering("aten::_safe_softmax.default")
def _safe_softmax(ctx, self, dim, dtype=None):
    """softmax, but 0 (not NaN) along rows that are all -inf (the SDPA math path's masking)."""
    x = float_in(ctx, self)
    y = _axis_op(ctx, "softmax", x, dim)
    if ndim(x) == 0:
        return y
    d = wrap_dim(dim, ndim(x))
    dead = reduce_dims(ctx, "reduce_max", ctx.cast(ctx.op("ne", x, ctx.scalar(-math.inf, x.dtype)), DType.INT32),
                   [d], True)
    return ctx.op("where", ctx.op("eq", dead, ctx.scalar(0, DType.INT32)), ctx.scalar(0, x.dtype), y)
