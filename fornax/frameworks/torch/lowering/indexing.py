"""Indexing lowerings (gather, scatter and index ops): ``index_select``, ``gather``, ``scatter``,
``scatter_add``, ``scatter_reduce``, ``index_add``, ``index``/``_unsafe_index``,
``index_put``/``_unsafe_index_put``/``_index_put_impl``, ``embedding``,
``embedding_dense_backward``, ``_unsafe_masked_index``,
``_unsafe_masked_index_put_accumulate``; :func:`index_operand` and :func:`scatter_add_along`
are shared with other families."""

from __future__ import annotations

import math

import numpy as np

from fornax.layers.graph import DType, Value
from fornax.frameworks.builders import (broadcast as _bcast, full as _full, halving as _halving, permute as _permute,
                                        reshape as _reshape)
from .. import scatter as _scatter

from .axes import ndim, wrap_dim
from .operands import operand, zeros_as
from .promotion import opmath
from .table import lowering


# ---- indexing ------------------------------------------------------------------------------------
def index_operand(ctx, v: Value) -> Value:
    if v.dtype not in (DType.INT64, DType.INT32):
        raise ctx.fail(f"indices must be int64 or int32, got {v.dtype}"
                       + (" (a boolean mask gives a data-dependent shape)" if v.dtype is DType.BOOL else ""))
    return ctx.cast(v, DType.INT64)


def _along(ctx, idx: Value, d: int, shape) -> Value:
    """A 1-D index laid along dim ``d`` and broadcast to ``shape``."""
    return _bcast(ctx, _reshape(ctx, idx, [-1 if i == d else 1 for i in range(len(shape))]), shape)


def scatter_add_along(ctx, upd: Value, d: int, idx: Value, n: int) -> Value:
    """A tensor like ``upd`` but ``n`` long in dim ``d``, holding the sums of ``upd`` slices
    at positions ``idx`` (1-D, one per slice of ``upd`` along ``d``)."""
    shape = list(upd.shape)
    shape[d] = n
    return ctx.op("scatter", _full(ctx, shape, 0, upd.dtype), _along(ctx, idx, d, upd.shape), upd, axis=d,
                  mode="add")


@lowering("aten::index_select.default")
def index_select(ctx, self, dim, index):
    idx = _reshape(ctx, index_operand(ctx, index), (max(1, math.prod(index.shape)),))
    if ndim(self) == 0:
        return _reshape(ctx, self, ctx.outs[0].shape)
    return _reshape(ctx, ctx.op("index_select", self, idx, axis=wrap_dim(dim, ndim(self))), ctx.outs[0].shape)


@lowering("aten::gather.default")
def gather(ctx, self, dim, index, sparse_grad=False):
    if ndim(self) == 0:
        return _reshape(ctx, self, index.shape)
    return ctx.op("gather", self, index_operand(ctx, index), axis=wrap_dim(dim, ndim(self)))


def _scatter_src(ctx, index, src):
    """``src`` cut to ``index``'s shape (torch uses only that part)."""
    if tuple(src.shape) != tuple(index.shape):
        src = ctx.op("slice", src, start=(0,) * ndim(src), stop=tuple(index.shape))
    return src


@lowering("aten::scatter.src", "aten::scatter.value", "aten::scatter.reduce", "aten::scatter.value_reduce")
def scatter(ctx, self, dim, index, src=None, value=None, reduce=None):
    if ndim(self) == 0:                # a 0-d tensor scatters as a 1-element vector
        one = (lambda v: _reshape(ctx, v, (1,)))
        src = one(src) if isinstance(src, Value) else src
        return _reshape(ctx, scatter(ctx, one(self), 0, one(index), src, value, reduce), ())
    upd = _scatter_src(ctx, index, ctx.cast(src, self.dtype)) if src is not None else \
        _full(ctx, index.shape, value, self.dtype)
    d = wrap_dim(dim, ndim(self))
    if reduce == "multiply":
        return _scatter_dense(ctx, self, d, index_operand(ctx, index), upd, "prod", True)
    if reduce not in (None, "add"):
        raise ctx.fail(f"scatter with reduce={reduce!r} is not lowered (torch takes 'add' or 'multiply')")
    return ctx.op("scatter", self, index_operand(ctx, index), upd, axis=d, mode="add" if reduce == "add" else "set")


@lowering("aten::scatter_add.default")
def scatter_add(ctx, self, dim, index, src):
    return scatter(ctx, self, dim, index, src, reduce="add")


#: (graph op combining two values, its identity) of the scatter reductions done densely
_DENSE_REDUCE = {"prod": ("mul", 1), "amax": ("maximum", -math.inf), "amin": ("minimum", math.inf)}


#: the most elements of the one-hot comparison a dense scatter builds
DENSE_SCATTER_LIMIT = 1 << 22


def _scatter_dense(ctx, self: Value, d: int, idx: Value, upd: Value, reduce: str, include_self: bool) -> Value:
    """A scatter reduction the graph's scatter (add/set only) has no mode for, done densely:
    every update is compared with every position of axis ``d`` (a one-hot of ``idx``), the
    updates are combined per position in log2 rounds, and the result is combined with
    ``self`` (positions nothing scatters to keep ``self``)."""
    n, ishape = self.shape[d], tuple(idx.shape)
    if math.prod(ishape) * n > DENSE_SCATTER_LIMIT:
        raise ctx.fail(f"scatter reduce={reduce!r} compares {math.prod(ishape)} updates with {n} positions; "
                       f"fornax lowers at most {DENSE_SCATTER_LIMIT} pairs")
    if self.dtype is DType.BOOL:
        raise ctx.fail(f"scatter reduce={reduce!r} of a bool tensor is not lowered")
    name, unit = _DENSE_REDUCE[reduce]
    if not self.dtype.is_float and not math.isfinite(unit):
        info = np.iinfo(self.dtype.numpy)
        unit = info.min if unit < 0 else info.max
    r = len(ishape)
    pos = _bcast(ctx, _reshape(ctx, ctx.const(np.arange(n, dtype=np.int64), "pos"), (1,) * r + (n,)), ishape + (n,))
    hit = ctx.op("eq", _bcast(ctx, _reshape(ctx, idx, ishape + (1,)), ishape + (n,)), pos)
    vals = ctx.op("where", hit, _bcast(ctx, _reshape(ctx, upd, ishape + (1,)), ishape + (n,)),
                  ctx.scalar(unit, self.dtype))
    any_hit = ctx.cast(hit, DType.INT64)
    vals = _halving(ctx, vals, d, name, unit)                 # (.., 1 at d, .., n)
    any_hit = _halving(ctx, any_hit, d, "maximum", 0)
    rest = ishape[:d] + ishape[d + 1:]
    perm = list(range(d)) + [r - 1] + list(range(d, r - 1))  # the positions axis back at d

    def place(v, fill):
        v = _permute(ctx, _reshape(ctx, v, rest + (n,)), perm)
        pads = tuple((0, self.shape[i] - v.shape[i]) for i in range(r))
        return ctx.op("pad", v, pads=pads, value=fill) if any(p for _, p in pads) else v
    vals, any_hit = place(vals, unit), ctx.op("ne", place(any_hit, 0), ctx.scalar(0, DType.INT64))
    if include_self:
        return ctx.op(name, self, vals)
    return ctx.op("where", any_hit, vals, self)


@lowering("aten::scatter_reduce.two")
def scatter_reduce(ctx, self, dim, index, src, reduce, include_self=True):
    if ndim(self) == 0:
        one = (lambda v: _reshape(ctx, v, (1,)))
        return _reshape(ctx, scatter_reduce(ctx, one(self), 0, one(index), one(src), reduce, include_self), ())
    d = wrap_dim(dim, ndim(self))
    idx = index_operand(ctx, index)
    upd = _scatter_src(ctx, index, ctx.cast(src, self.dtype))
    if reduce in _DENSE_REDUCE:
        return _scatter_dense(ctx, self, d, idx, upd, reduce, include_self)
    if reduce == "mean":
        if not self.dtype.is_float:
            raise ctx.fail("scatter_reduce mean of integers (floor division) is not lowered")
        total = scatter_reduce(ctx, self, d, index, src, "sum", include_self)
        ones = _full(ctx, index.shape, 1, self.dtype)
        count = ctx.op("scatter", _full(ctx, self.shape, 1 if include_self else 0, self.dtype), idx, ones,
                       axis=d, mode="add")
        count = ctx.op("where", ctx.op("eq", count, ctx.scalar(0, self.dtype)), ctx.scalar(1, self.dtype), count)
        return ctx.op("div", total, count)
    if reduce != "sum":
        raise ctx.fail(f"scatter_reduce with reduce={reduce!r} is not lowered")
    base = self
    if not include_self:
        hit = ctx.op("scatter", _full(ctx, self.shape, False, DType.BOOL), idx,
                     _full(ctx, index.shape, True, DType.BOOL), axis=d, mode="set")
        base = ctx.op("where", hit, ctx.scalar(0, self.dtype), self)
    return ctx.op("scatter", base, idx, upd, axis=d, mode="add")


@lowering("aten::index_add.default")
def index_add(ctx, self, dim, index, source, alpha=1):
    d = wrap_dim(dim, ndim(self))
    upd = ctx.cast(source, self.dtype)
    if alpha != 1:
        upd = ctx.op("mul", upd, ctx.scalar(alpha, self.dtype))
    lin = _reshape(ctx, index_operand(ctx, index), (-1,))
    if ndim(self) > 0 and _scatter.applies(lin, self):     # a long index list: sort, don't walk
        a, k, z = math.prod(self.shape[:d]), self.shape[d], math.prod(self.shape[d + 1:])
        out = _scatter.rows(ctx, _reshape(ctx, self, (a, k, z)), lin,
                            _reshape(ctx, upd, (a, lin.shape[0], z)), True)
        return _reshape(ctx, out, self.shape)
    idx = _along(ctx, lin, d, upd.shape)
    return ctx.op("scatter", self, idx, upd, axis=d, mode="add")


def _advanced(ctx, x: Value, indices):
    """Advanced indexing laid out as one axis: x viewed as (A, K, Z) where K merges the
    indexed dims (moved to the front when they are not adjacent, as torch does), the linear
    index into K (1-D), and the shapes (before, index-broadcast, after, permuted x)."""
    r = ndim(x)
    pos = [i for i, ix in enumerate(indices) if ix is not None]
    if not pos:
        raise ctx.fail("indexing with no index tensors")
    idxs = [index_operand(ctx, indices[i]) for i in pos]
    bshape = tuple(np.broadcast_shapes(*(tuple(v.shape) for v in idxs)))
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    perm = list(range(r)) if adjacent else pos + [d for d in range(r) if d not in pos]
    first = pos[0] if adjacent else 0
    xp = _permute(ctx, x, perm)
    kdims = [x.shape[d] for d in pos]
    before, after = xp.shape[:first], xp.shape[first + len(pos):]
    lin: Value | None = None
    for j, (v, n) in enumerate(zip(idxs, kdims)):
        v = _bcast(ctx, v, bshape)
        v = ctx.op("where", ctx.op("lt", v, ctx.scalar(0, DType.INT64)),
                   ctx.op("add", v, ctx.scalar(n, DType.INT64)), v)
        stride = math.prod(kdims[j + 1:])
        if stride != 1:
            v = ctx.op("mul", v, ctx.scalar(stride, DType.INT64))
        lin = v if lin is None else ctx.op("add", lin, v)
    assert lin is not None                     # pos, so idxs, is not empty
    lin = _reshape(ctx, lin, (max(1, math.prod(bshape)),))
    xr = _reshape(ctx, xp, (math.prod(before), math.prod(kdims), math.prod(after)))
    return xr, lin, tuple(before), bshape, tuple(after), xp, perm


@lowering("aten::index.Tensor", "aten::_unsafe_index.Tensor", "aten::index.Tensor_hacked_twin",
          "aten::_unsafe_index.Tensor_hacked_twin")
def index(ctx, self, indices):
    xr, lin, before, bshape, after, _, _ = _advanced(ctx, self, indices)
    return _reshape(ctx, ctx.op("index_select", xr, lin, axis=1), before + bshape + after)


@lowering("aten::index_put.default", "aten::_unsafe_index_put.default", "aten::index_put.hacked_twin",
          "aten::_index_put_impl.default")
def index_put(ctx, self, indices, values, accumulate=False, unsafe=False):
    if accumulate and self.dtype is DType.BOOL:
        raise ctx.fail("accumulating index_put into a bool tensor is not lowered")
    if any(ix is not None and ix.dtype is DType.BOOL for ix in indices):
        return _masked_put(ctx, self, indices, values, accumulate)
    xr, lin, before, bshape, after, xp, perm = _advanced(ctx, self, indices)
    vals = _bcast(ctx, ctx.cast(values, self.dtype), before + bshape + after)
    vals = _reshape(ctx, vals, (xr.shape[0], lin.shape[0], xr.shape[2]))
    if _scatter.applies(lin, xr):          # a long update list: sort it instead of walking it
        out = _scatter.rows(ctx, xr, lin, vals, accumulate)
    else:
        out = ctx.op("scatter", xr, _along(ctx, lin, 1, vals.shape), vals, axis=1, mode="add" if accumulate else "set")
    inv = [perm.index(d) for d in range(len(perm))]
    return _permute(ctx, _reshape(ctx, out, xp.shape), inv)


def _masked_put(ctx, self, indices, values, accumulate):
    """``self[mask] = values`` (or ``+=``) with one boolean mask: a ``where`` over the mask
    when ``values`` is the same for every selected element (size 1 along the selected
    axis), which needs no count of the selected elements."""
    pos = [i for i, ix in enumerate(indices) if ix is not None]
    mask = indices[pos[0]]
    k, m = pos[0], ndim(indices[pos[0]])
    if len(pos) != 1 or tuple(mask.shape) != tuple(self.shape[k:k + m]):
        raise ctx.fail("a boolean mask index mixed with other indices gives a data-dependent shape")
    before, after = tuple(self.shape[:k]), tuple(self.shape[k + m:])
    vshape = tuple(values.shape)
    if len(vshape) > len(after) + 1 + len(before) or \
            (len(vshape) > len(after) and vshape[len(vshape) - len(after) - 1] != 1):
        raise ctx.fail("values that differ per selected element give a data-dependent shape")
    lead = vshape[:max(0, len(vshape) - len(after) - 1)]
    vals = _reshape(ctx, ctx.cast(values, self.dtype), lead + (1,) * m + vshape[len(vshape) - min(len(vshape),
                                                                                                len(after)):])
    vals = _bcast(ctx, vals, self.shape)
    cond = _bcast(ctx, _reshape(ctx, mask, (1,) * k + tuple(mask.shape) + (1,) * len(after)), self.shape)
    if accumulate:
        return ctx.op("add", self, ctx.op("where", cond, vals, zeros_as(ctx, vals)))
    return ctx.op("where", cond, vals, self)


@lowering("aten::embedding.default")
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    idx = _reshape(ctx, index_operand(ctx, indices), (max(1, math.prod(indices.shape)),))
    rows = ctx.op("index_select", weight, idx, axis=0)
    return _reshape(ctx, rows, tuple(indices.shape) + tuple(weight.shape[1:]))


@lowering("aten::embedding_dense_backward.default")
def embedding_dense_backward(ctx, grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    dt = opmath(grad_output.dtype)
    m = max(1, math.prod(indices.shape))
    idx = _reshape(ctx, index_operand(ctx, indices), (m,))
    g = _reshape(ctx, ctx.cast(grad_output, dt), (m, grad_output.shape[-1]))
    if padding_idx >= 0:
        pad = _reshape(ctx, ctx.op("eq", idx, ctx.scalar(padding_idx, DType.INT64)), (m, 1))
        g = ctx.op("where", pad, ctx.scalar(0, dt), g)
    if scale_grad_by_freq:
        counts = scatter_add_along(ctx, _full(ctx, (m,), 1, dt), 0, idx, num_weights)
        g = ctx.op("div", g, _reshape(ctx, ctx.op("index_select", counts, idx, axis=0), (m, 1)))
    return scatter_add_along(ctx, g, 0, idx, num_weights)


# ---- masked indexing (decompositions of interpolation) -------------------------------------------
@lowering("aten::_unsafe_masked_index.default")
def _unsafe_masked_index(ctx, self, mask, indices, fill):
    return ctx.op("where", ctx.cast(mask, DType.BOOL), index(ctx, self, indices), operand(ctx, fill, self.dtype))


@lowering("aten::_unsafe_masked_index_put_accumulate.default")
def _unsafe_masked_index_put_accumulate(ctx, self, mask, indices, values):
    vals = ctx.op("where", ctx.cast(mask, DType.BOOL), ctx.cast(values, self.dtype), ctx.scalar(0, self.dtype))
    return index_put(ctx, self, indices, vals, True)
