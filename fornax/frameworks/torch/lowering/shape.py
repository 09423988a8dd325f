"""Shape and view lowerings: ``view``/``_unsafe_view``/``_reshape_alias``/``reshape``, ``permute``,
``t``, ``numpy_T``, ``transpose``, ``expand``, ``squeeze``, ``unsqueeze``, ``slice``, ``narrow``,
``select``, ``as_strided`` (each with its ``_copy`` form), ``cat``, ``stack``, ``split``,
``split_with_sizes``, ``unsafe_split``, ``unsafe_split_with_sizes``, ``unbind``,
``constant_pad_nd``, ``flip``, ``roll``, ``repeat``, ``tril``, ``triu``, ``slice_scatter``,
``select_scatter``, ``slice_backward``, ``select_backward``, ``diagonal`` and
``diagonal_backward``."""

from __future__ import annotations

import math

import numpy as np

from fornax.frameworks.builders import broadcast as _bcast, full as _full, permute as _permute, reshape as _reshape
from .. import concatenation as _concatenation

from .axes import ndim, wrap_dim
from .indexing import scatter_add_along
from .promotion import compute_dtype
from .table import lowering


# ---- layout --------------------------------------------------------------------------------------
@lowering("aten::view.default", "aten::_unsafe_view.default", "aten::view_copy.default",
          "aten::_reshape_alias.default")
def view(ctx, self, size, stride=None):
    return _reshape(ctx, self, ctx.outs[0].shape if -1 in tuple(size) else size)


@lowering("aten::reshape.default")
def reshape(ctx, self, shape):
    return view(ctx, self, shape)


@lowering("aten::permute.default", "aten::permute_copy.default")
def permute(ctx, self, dims):
    r = ndim(self)
    return _permute(ctx, self, [wrap_dim(d, r) for d in dims])


@lowering("aten::t.default", "aten::t_copy.default", "aten::numpy_T.default")
def t(ctx, self):
    return _permute(ctx, self, tuple(reversed(range(ndim(self)))))


@lowering("aten::transpose.int", "aten::transpose_copy.int")
def transpose(ctx, self, dim0, dim1):
    r = ndim(self)
    if r == 0:
        return self
    perm = list(range(r))
    a, b = wrap_dim(dim0, r), wrap_dim(dim1, r)
    perm[a], perm[b] = perm[b], perm[a]
    return _permute(ctx, self, perm)


@lowering("aten::expand.default", "aten::expand_copy.default")
def expand(ctx, self, size, implicit=False):
    size = list(size)
    lead = len(size) - ndim(self)
    shape = [s if s != -1 else self.shape[i - lead] for i, s in enumerate(size)]
    return _bcast(ctx, self, shape)


@lowering("aten::squeeze.default", "aten::squeeze.dim", "aten::squeeze.dims",
          "aten::squeeze_copy.default", "aten::squeeze_copy.dim", "aten::squeeze_copy.dims")
def squeeze(ctx, self, dim=None):
    r = ndim(self)
    dims = set(range(r)) if dim is None else {wrap_dim(d, r) for d in ([dim] if isinstance(dim, int) else dim)}
    return _reshape(ctx, self, [s for i, s in enumerate(self.shape) if not (i in dims and s == 1)])


@lowering("aten::unsqueeze.default", "aten::unsqueeze_copy.default")
def unsqueeze(ctx, self, dim):
    d = wrap_dim(dim, ndim(self) + 1)
    shape = list(self.shape)
    shape.insert(d, 1)
    return _reshape(ctx, self, shape)


def _slice_bounds(n: int, start, end, step) -> tuple[int, int]:
    start = 0 if start is None else start
    end = n if end is None else end
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    return min(max(start, 0), n), min(max(end, 0), n)


def slice_dim(ctx, x, d, start, end, step=1):
    if start == 0 and end == x.shape[d] and step == 1:
        return x
    r = ndim(x)
    s, e, st = [0] * r, list(x.shape), [1] * r
    s[d], e[d], st[d] = start, end, step
    return ctx.op("slice", x, start=tuple(s), stop=tuple(e), step=tuple(st))


@lowering("aten::slice.Tensor", "aten::slice_copy.Tensor")
def slice_(ctx, self, dim=0, start=None, end=None, step=1):
    d = wrap_dim(dim, ndim(self))
    a, b = _slice_bounds(self.shape[d], start, end, step)
    return slice_dim(ctx, self, d, a, b, step)


@lowering("aten::narrow.default", "aten::narrow_copy.default")
def narrow(ctx, self, dim, start, length):
    d = wrap_dim(dim, ndim(self))
    start = start + self.shape[d] if start < 0 else start
    return slice_dim(ctx, self, d, start, start + length)


@lowering("aten::select.int", "aten::select_copy.int")
def select(ctx, self, dim, index):
    d = wrap_dim(dim, ndim(self))
    i = index + self.shape[d] if index < 0 else index
    out = slice_dim(ctx, self, d, i, i + 1)
    return _reshape(ctx, out, self.shape[:d] + self.shape[d + 1:])


@lowering("aten::as_strided.default", "aten::as_strided_copy.default")
def as_strided(ctx, self, size, stride, storage_offset=None):
    """Elements ``offset + sum(i_d * stride_d)`` of the input's row-major contiguous elements."""
    off = storage_offset or 0
    idx = np.full(tuple(size), off, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape([-1 if i == d else 1 for i in range(len(size))])
    numel = math.prod(self.shape)
    if idx.size and (idx.min() < 0 or idx.max() >= numel):
        raise ctx.fail(f"as_strided reaches element {int(idx.max())} of an input with {numel} elements; "
                       "fornax lowers as_strided over the input's own contiguous elements")
    flat = _reshape(ctx, self, (numel,))
    out = ctx.op("index_select", flat, ctx.const(idx.reshape(-1), "strided_idx"), axis=0)
    return _reshape(ctx, out, tuple(size))


@lowering("aten::cat.default")
def cat(ctx, tensors, dim=0):
    dt = ctx.out()
    vals = [ctx.cast(t, dt) for t in tensors if t is not None and math.prod(t.shape) > 0]
    if len(vals) == 1:
        return vals[0]
    return _concatenation.concat(ctx, vals, wrap_dim(dim, ndim(vals[0])))


@lowering("aten::stack.default")
def stack(ctx, tensors, dim=0):
    d = wrap_dim(dim, ndim(tensors[0]) + 1)
    vals = [unsqueeze(ctx, ctx.cast(t, ctx.out()), d) for t in tensors]
    return vals[0] if len(vals) == 1 else _concatenation.concat(ctx, vals, d)


def split_parts(ctx, x, sizes, d):
    out, start = [], 0
    for s in sizes:
        out.append(slice_dim(ctx, x, d, start, start + s) if s > 0 else None)
        start += s
    return out


@lowering("aten::split_with_sizes.default", "aten::split_with_sizes_copy.default")
def split_with_sizes(ctx, self, split_sizes, dim=0):
    return split_parts(ctx, self, list(split_sizes), wrap_dim(dim, ndim(self)))


@lowering("aten::split.sizes")
def split_sizes(ctx, self, split_size, dim=0):
    return split_with_sizes(ctx, self, split_size, dim)


@lowering("aten::split.Tensor", "aten::split_copy.Tensor")
def split(ctx, self, split_size, dim=0):
    d = wrap_dim(dim, ndim(self))
    n = self.shape[d]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] if split_size else [n]
    return split_parts(ctx, self, sizes, d)


@lowering("aten::unbind.int", "aten::unbind_copy.int")
def unbind(ctx, self, dim=0):
    d = wrap_dim(dim, ndim(self))
    return [select(ctx, self, d, i) for i in range(self.shape[d])]


@lowering("aten::constant_pad_nd.default")
def constant_pad_nd(ctx, self, pad, value=0):
    """``pad`` pairs run from the last dim backwards; negative amounts crop."""
    x = self
    r = ndim(x)
    pairs = [(0, 0)] * r
    for i in range(len(pad) // 2):
        d = r - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        if lo < 0 or hi < 0:
            x = slice_dim(ctx, x, d, max(0, -lo), x.shape[d] - max(0, -hi))
        pairs[d] = (max(0, lo), max(0, hi))
    if all(p == (0, 0) for p in pairs):
        return x
    v = float(value) if x.dtype.is_float else int(value)
    return ctx.op("pad", x, pads=tuple(pairs), value=v)


@lowering("aten::flip.default")
def flip(ctx, self, dims):
    x = self
    for d in {wrap_dim(d, ndim(x)) for d in dims}:
        n = x.shape[d]
        if n > 1:
            x = ctx.op("index_select", x, ctx.const(np.arange(n - 1, -1, -1, dtype=np.int64), "flip"), axis=d)
    return x


@lowering("aten::roll.default")
def roll(ctx, self, shifts, dims=()):
    x = self
    if not dims:
        flat = _reshape(ctx, x, (math.prod(x.shape),))
        return _reshape(ctx, roll(ctx, flat, shifts, [0]), x.shape)
    for s, d in zip(shifts, dims):
        d = wrap_dim(d, ndim(x))
        n = x.shape[d]
        s %= n
        if s:
            x = ctx.op("concat", slice_dim(ctx, x, d, n - s, n), slice_dim(ctx, x, d, 0, n - s), axis=d)
    return x


@lowering("aten::repeat.default")
def repeat(ctx, self, repeats):
    reps = list(repeats)
    shape = [1] * (len(reps) - ndim(self)) + list(self.shape)
    inter, big = [], []
    for r, s in zip(reps, shape):
        inter += [1, s]
        big += [r, s]
    x = _bcast(ctx, _reshape(ctx, self, inter), big)
    return _reshape(ctx, x, [r * s for r, s in zip(reps, shape)])


def _tri(ctx, x, diagonal, lower):
    r, c = x.shape[-2], x.shape[-1]
    rows, cols = np.arange(r)[:, None], np.arange(c)[None, :]
    mask = (cols - rows <= diagonal) if lower else (cols - rows >= diagonal)
    return ctx.op("where", ctx.const(mask, "tri"), x, ctx.scalar(0, x.dtype))


@lowering("aten::tril.default")
def tril(ctx, self, diagonal=0):
    return _tri(ctx, self, diagonal, True)


@lowering("aten::triu.default")
def triu(ctx, self, diagonal=0):
    return _tri(ctx, self, diagonal, False)


def _slice_scatter(ctx, x, src, d, start, end, step):
    src = ctx.cast(src, x.dtype)
    n = x.shape[d]
    if step == 1:
        parts = [p for p in (slice_dim(ctx, x, d, 0, start) if start > 0 else None, src,
                             slice_dim(ctx, x, d, end, n) if end < n else None) if p is not None]
        return parts[0] if len(parts) == 1 else ctx.op("concat", *parts, axis=d)
    idx = np.arange(start, end, step, dtype=np.int64).reshape([-1 if i == d else 1 for i in range(ndim(x))])
    idx = _bcast(ctx, ctx.const(idx, "slice_idx"), src.shape)
    return ctx.op("scatter", x, idx, src, axis=d, mode="set")


@lowering("aten::slice_scatter.default")
def slice_scatter(ctx, self, src, dim=0, start=None, end=None, step=1):
    d = wrap_dim(dim, ndim(self))
    a, b = _slice_bounds(self.shape[d], start, end, step)
    return _slice_scatter(ctx, self, src, d, a, b, step)


@lowering("aten::select_scatter.default")
def select_scatter(ctx, self, src, dim, index):
    d = wrap_dim(dim, ndim(self))
    i = index + self.shape[d] if index < 0 else index
    return _slice_scatter(ctx, self, unsqueeze(ctx, src, d), d, i, i + 1, 1)


@lowering("aten::slice_backward.default")
def slice_backward(ctx, grad_output, input_sizes, dim, start, end, step):
    d = wrap_dim(dim, len(input_sizes))
    a, b = _slice_bounds(input_sizes[d], start, end, step)
    return _slice_scatter(ctx, _full(ctx, tuple(input_sizes), 0, grad_output.dtype), grad_output, d, a, b, step)


@lowering("aten::select_backward.default")
def select_backward(ctx, grad_output, input_sizes, dim, index):
    d = wrap_dim(dim, len(input_sizes))
    i = index + input_sizes[d] if index < 0 else index
    return _slice_scatter(ctx, _full(ctx, tuple(input_sizes), 0, grad_output.dtype),
                          unsqueeze(ctx, grad_output, d), d, i, i + 1, 1)


@lowering("aten::unsafe_split.Tensor")
def unsafe_split(ctx, self, split_size, dim=0):
    return split(ctx, self, split_size, dim)


@lowering("aten::unsafe_split_with_sizes.default")
def unsafe_split_with_sizes(ctx, self, split_sizes, dim=0):
    return split_with_sizes(ctx, self, split_sizes, dim)


# ---- diagonals -----------------------------------------------------------------------------------
def _diag_index(shape, offset, d1, d2):
    """(the tensor's dims with d1, d2 moved last, flat diagonal indices into the last two)."""
    n, m = shape[d1], shape[d2]
    i = np.arange(max(0, min(n, m - offset) if offset >= 0 else min(n + offset, m)))
    rows, cols = (i, i + offset) if offset >= 0 else (i - offset, i)
    return rows * m + cols


@lowering("aten::diagonal.default", "aten::diagonal_copy.default")
def diagonal(ctx, self, offset=0, dim1=0, dim2=1):
    r = ndim(self)
    d1, d2 = wrap_dim(dim1, r), wrap_dim(dim2, r)
    rest = [d for d in range(r) if d not in (d1, d2)]
    x = _permute(ctx, self, rest + [d1, d2])
    lead = tuple(self.shape[d] for d in rest)
    flat = _reshape(ctx, x, lead + (self.shape[d1] * self.shape[d2],))
    idx = _diag_index(self.shape, offset, d1, d2)
    return ctx.op("index_select", flat, ctx.const(idx.astype(np.int64), "diag"), axis=len(lead))


@lowering("aten::diagonal_backward.default")
def diagonal_backward(ctx, grad_output, input_sizes, offset, dim1, dim2):
    r = len(input_sizes)
    d1, d2 = wrap_dim(dim1, r), wrap_dim(dim2, r)
    rest = [d for d in range(r) if d not in (d1, d2)]
    idx = ctx.const(_diag_index(tuple(input_sizes), offset, d1, d2).astype(np.int64), "diag")
    flat = scatter_add_along(ctx, ctx.cast(grad_output, compute_dtype(ctx)), len(rest), idx,
                             input_sizes[d1] * input_sizes[d2])
    x = _reshape(ctx, flat, tuple(input_sizes[d] for d in rest) + (input_sizes[d1], input_sizes[d2]))
    perm = rest + [d1, d2]
    return _permute(ctx, x, [perm.index(d) for d in range(r)])
