"""Factory and copy lowerings: ``full``/``new_full``, ``zeros``/``new_zeros``, ``ones``/``new_ones``,
``full_like``, ``zeros_like``, ``ones_like``, ``fill``, ``zero``, ``scalar_tensor``, ``arange``, the
identities (``_to_copy``, ``clone``, ``alias``, ``detach``, ``lift_fresh``, ``contiguous``,
``positive`` and their ``_copy`` forms) and ``copy``."""

from __future__ import annotations

from fornax.layers.graph import DType
from fornax.frameworks.builders import broadcast as _bcast, full as _full

from .operands import operand, zeros_as
from .table import lowering


@lowering("aten::full.default", "aten::new_full.default")
def full(ctx, size, fill_value, dtype=None, self=None):
    return _full(ctx, tuple(size), fill_value, ctx.out())


@lowering("aten::zeros.default", "aten::new_zeros.default")
def zeros(ctx, size, dtype=None, self=None):
    return _full(ctx, tuple(size), 0, ctx.out())


@lowering("aten::ones.default", "aten::new_ones.default")
def ones(ctx, size, dtype=None, self=None):
    return _full(ctx, tuple(size), 1, ctx.out())


@lowering("aten::full_like.default")
def full_like(ctx, self, fill_value, dtype=None):
    return _full(ctx, self.shape, fill_value, ctx.out())


@lowering("aten::zeros_like.default")
def zeros_like(ctx, self, dtype=None):
    return _full(ctx, self.shape, 0, ctx.out())


@lowering("aten::ones_like.default")
def ones_like(ctx, self, dtype=None):
    return _full(ctx, self.shape, 1, ctx.out())


@lowering("aten::fill.Scalar", "aten::fill.Tensor")
def fill(ctx, self, value):
    return _bcast(ctx, operand(ctx, value, self.dtype), self.shape)


@lowering("aten::scalar_tensor.default")
def scalar_tensor(ctx, s, dtype=None):
    return ctx.scalar(s, ctx.out())


@lowering("aten::arange.default")
def arange(ctx, end, start=0, step=1, dtype=None):
    """``start + i*step``, computed in float64 (int64 for integers) as torch's CPU kernel
    accumulates, then cast."""
    n = ctx.outs[0].shape[0]
    dt = ctx.out()
    wide = DType.FLOAT64 if dt.is_float else DType.INT64
    i = ctx.op("iota", shape=(n,), axis=0, dtype=wide.value)
    if step != 1:
        i = ctx.op("mul", i, ctx.scalar(step, wide))
    return ctx.op("add", i, ctx.scalar(start, wide)) if start != 0 else i


@lowering("aten::arange.start", "aten::arange.start_step")
def arange_start(ctx, start, end, step=1, dtype=None):
    return arange(ctx, end, start, step, dtype)


@lowering("aten::_to_copy.default", "aten::clone.default", "aten::alias.default", "aten::detach.default",
          "aten::lift_fresh_copy.default", "aten::lift_fresh.default", "aten::alias_copy.default",
          "aten::detach_copy.default", "aten::contiguous.default", "aten::positive.default")
def identity(ctx, self, dtype=None, memory_format=None):
    """A copy or a dtype conversion: :func:`lower` casts to the output dtype."""
    return self


@lowering("aten::copy.default")
def copy(ctx, self, src, non_blocking=False):
    return _bcast(ctx, ctx.cast(src, self.dtype), self.shape)


@lowering("aten::zero.default")
def zero(ctx, self):
    return zeros_as(ctx, self)
