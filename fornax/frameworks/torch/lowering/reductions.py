"""Reduction and scan lowerings: ``sum``, ``mean``, ``amax``, ``amin``, ``max``/``min`` (whole
and ``.dim``), ``argmax``, ``argmin``, ``any``, ``all``, ``var``, ``std``, ``var_mean``,
``std_mean`` (with torch's corrections), ``logsumexp``, ``prod``, ``cumsum``, ``cumprod``,
``linalg_vector_norm`` and ``norm``."""

from __future__ import annotations

import math

from fornax.layers.graph import DType
from fornax.frameworks.builders import full as _full, halving as _halving, reshape as _reshape, scan as _scan

from .axes import count_dims, ndim, reduce_dims, reduction_dims, sum_dims, wrap_dim
from .comparison import inf_mask
from .operands import div_in
from .promotion import compute_dtype, float_in, opmath
from .table import lowering


@lowering("aten::sum.default", "aten::sum.dim_IntList")
def sum_(ctx, self, dim=None, keepdim=False, dtype=None):
    dt = compute_dtype(ctx)
    return sum_dims(ctx, ctx.cast(self, dt), reduction_dims(dim, ndim(self)), keepdim)


@lowering("aten::mean.default", "aten::mean.dim")
def mean(ctx, self, dim=None, keepdim=False, dtype=None):
    dt = compute_dtype(ctx)
    if not dt.is_float:
        raise ctx.fail(f"mean needs a floating-point input or dtype, got {dt} (torch refuses it too)")
    dims = reduction_dims(dim, ndim(self))
    return div_in(ctx, sum_dims(ctx, ctx.cast(self, dt), dims, keepdim), count_dims(self, dims), dt)


def _minmax(ctx, name, x, dims, keepdim):
    if x.dtype is DType.BOOL:       # graph reductions take no bool: reduce 0/1 as int32
        return ctx.cast(reduce_dims(ctx, name, ctx.cast(x, DType.INT32), dims, keepdim), DType.BOOL)
    return reduce_dims(ctx, name, x, dims, keepdim)


@lowering("aten::amax.default")
def amax(ctx, self, dim=(), keepdim=False):
    return _minmax(ctx, "reduce_max", self, reduction_dims(dim, ndim(self)), keepdim)


@lowering("aten::amin.default")
def amin(ctx, self, dim=(), keepdim=False):
    return _minmax(ctx, "reduce_min", self, reduction_dims(dim, ndim(self)), keepdim)


@lowering("aten::max.default")
def max_(ctx, self):
    return _minmax(ctx, "reduce_max", self, reduction_dims(None, ndim(self)), False)


@lowering("aten::min.default")
def min_(ctx, self):
    return _minmax(ctx, "reduce_min", self, reduction_dims(None, ndim(self)), False)


def _arg(ctx, name, x, dim, keepdim):
    if x.dtype is DType.BOOL:
        x = ctx.cast(x, DType.INT32)
    if ndim(x) == 0:
        return _full(ctx, (), 0, DType.INT64)
    if dim is None:
        r = ctx.op(name, _reshape(ctx, x, (-1,)), axis=0, keepdims=False)
        return _reshape(ctx, r, (1,) * ndim(x)) if keepdim else r
    return ctx.op(name, x, axis=wrap_dim(dim, ndim(x)), keepdims=keepdim)


@lowering("aten::argmax.default")
def argmax(ctx, self, dim=None, keepdim=False):
    return _arg(ctx, "argmax", self, dim, keepdim)


@lowering("aten::argmin.default")
def argmin(ctx, self, dim=None, keepdim=False):
    return _arg(ctx, "argmin", self, dim, keepdim)


@lowering("aten::max.dim")
def max_dim(ctx, self, dim, keepdim=False):
    return (_minmax(ctx, "reduce_max", self, reduction_dims(dim, ndim(self)), keepdim),
            _arg(ctx, "argmax", self, dim, keepdim))


@lowering("aten::min.dim")
def min_dim(ctx, self, dim, keepdim=False):
    return (_minmax(ctx, "reduce_min", self, reduction_dims(dim, ndim(self)), keepdim),
            _arg(ctx, "argmin", self, dim, keepdim))


@lowering("aten::any.default", "aten::any.dim", "aten::any.dims")
def any_(ctx, self, dim=None, keepdim=False):
    b = ctx.cast(ctx.cast(self, DType.BOOL), DType.INT32)
    return ctx.cast(reduce_dims(ctx, "reduce_max", b, reduction_dims(dim, ndim(self)), keepdim), DType.BOOL)


@lowering("aten::all.default", "aten::all.dim", "aten::all.dims")
def all_(ctx, self, dim=None, keepdim=False):
    b = ctx.cast(ctx.cast(self, DType.BOOL), DType.INT32)
    return ctx.cast(reduce_dims(ctx, "reduce_min", b, reduction_dims(dim, ndim(self)), keepdim), DType.BOOL)


def _var_mean(ctx, x, dim, correction, keepdim, unbiased=None):
    """(variance, mean) in the compute dtype, torch's correction (default 1; dof clamped at 0)."""
    dt = opmath(x.dtype) if x.dtype.is_float else DType.FLOAT32
    if not x.dtype.is_float:
        raise ctx.fail(f"var/std need a floating-point input, got {x.dtype} (torch refuses it too)")
    x = ctx.cast(x, dt)
    dims = reduction_dims(dim, ndim(x))
    corr = (1 if unbiased is None or unbiased else 0) if correction is None else correction
    n = count_dims(x, dims)
    m = div_in(ctx, sum_dims(ctx, x, dims), n, dt)
    if ndim(x) and len(dims) == 1 and float(corr).is_integer() and n - corr > 0 and corr >= 0:
        v = ctx.op("var", x, axis=dims[0], keepdims=keepdim, correction=int(corr))
    else:
        d = ctx.op("sub", x, m)
        v = div_in(ctx, sum_dims(ctx, ctx.op("mul", d, d), dims, keepdim), max(0, n - corr), dt)
    if not keepdim:
        m = _reshape(ctx, m, [s for i, s in enumerate(m.shape) if i not in dims])
    return v, m


@lowering("aten::var.default", "aten::var.dim", "aten::var.correction")
def var(ctx, self, dim=None, unbiased=None, keepdim=False, correction=None):
    return _var_mean(ctx, self, dim, correction, keepdim, unbiased)[0]


@lowering("aten::std.default", "aten::std.dim", "aten::std.correction")
def std(ctx, self, dim=None, unbiased=None, keepdim=False, correction=None):
    return ctx.op("sqrt", _var_mean(ctx, self, dim, correction, keepdim, unbiased)[0])


@lowering("aten::var_mean.default", "aten::var_mean.dim", "aten::var_mean.correction")
def var_mean(ctx, self, dim=None, unbiased=None, keepdim=False, correction=None):
    return _var_mean(ctx, self, dim, correction, keepdim, unbiased)


@lowering("aten::std_mean.default", "aten::std_mean.dim", "aten::std_mean.correction")
def std_mean(ctx, self, dim=None, unbiased=None, keepdim=False, correction=None):
    v, m = _var_mean(ctx, self, dim, correction, keepdim, unbiased)
    return ctx.op("sqrt", v), m


@lowering("aten::logsumexp.default")
def logsumexp(ctx, self, dim, keepdim=False):
    x = float_in(ctx, self)
    dims = reduction_dims(dim, ndim(x))
    m = reduce_dims(ctx, "reduce_max", x, dims, True)
    m = ctx.op("where", inf_mask(ctx, m), ctx.scalar(0, x.dtype), m)
    s = sum_dims(ctx, ctx.op("exp", ctx.op("sub", x, m)), dims, True)
    r = ctx.op("add", ctx.op("log", s), m)
    return r if keepdim else _reshape(ctx, r, ctx.outs[0].shape)


@lowering("aten::prod.default", "aten::prod.dim_int")
def prod(ctx, self, dim=None, keepdim=False, dtype=None):
    dt = compute_dtype(ctx)
    x = ctx.cast(self, dt)
    dims = reduction_dims(dim, ndim(x))
    if dt is DType.BOOL:
        x, dt = ctx.cast(x, DType.INT64), DType.INT64
    for d in dims:
        x = _halving(ctx, x, d, "mul", 1)
    return x if keepdim else _reshape(ctx, x, ctx.outs[0].shape)


@lowering("aten::cumsum.default")
def cumsum(ctx, self, dim, dtype=None):
    x = ctx.cast(self, compute_dtype(ctx))
    if ndim(x) == 0:
        return x
    return _scan(ctx, x, wrap_dim(dim, ndim(x)), "add", 0)


@lowering("aten::cumprod.default")
def cumprod(ctx, self, dim, dtype=None):
    x = ctx.cast(self, compute_dtype(ctx))
    if ndim(x) == 0:
        return x
    return _scan(ctx, x, wrap_dim(dim, ndim(x)), "mul", 1)


@lowering("aten::linalg_vector_norm.default")
def linalg_vector_norm(ctx, self, ord=2, dim=None, keepdim=False, dtype=None):
    dt = compute_dtype(ctx)
    x = ctx.op("abs", ctx.cast(self, dt))
    dims = reduction_dims(dim, ndim(x))
    if ord == math.inf:
        return reduce_dims(ctx, "reduce_max", x, dims, keepdim)
    if ord == -math.inf:
        return reduce_dims(ctx, "reduce_min", x, dims, keepdim)
    if ord == 0:
        return sum_dims(ctx, ctx.cast(ctx.op("ne", x, ctx.scalar(0, dt)), dt), dims, keepdim)
    if ord == 1:
        return sum_dims(ctx, x, dims, keepdim)
    if ord == 2:
        return ctx.op("sqrt", sum_dims(ctx, ctx.op("mul", x, x), dims, keepdim))
    s = sum_dims(ctx, ctx.op("pow", x, ctx.scalar(ord, dt)), dims, keepdim)
    return ctx.op("pow", s, ctx.scalar(1.0 / ord, dt))


@lowering("aten::norm.Scalar", "aten::norm.ScalarOpt_dim", "aten::norm.ScalarOpt_dim_dtype",
          "aten::norm.ScalarOpt_dtype")
def norm(ctx, self, p=2, dim=None, keepdim=False, dtype=None):
    return linalg_vector_norm(ctx, self, 2 if p is None else p, dim, keepdim, dtype)
