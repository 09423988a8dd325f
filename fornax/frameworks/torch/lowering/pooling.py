"""Pooling, resampling and index-padding lowerings: ``max_pool2d_with_indices``,
``avg_pool2d``, ``_adaptive_avg_pool2d``, ``upsample_nearest2d``, ``upsample_bilinear2d`` (each
with its backward; the ``.vec`` upsample forms too), ``avg_pool1d``, ``adaptive_avg_pool1d``,
and ``reflection_pad{1,2,3}d`` / ``replication_pad{1,2,3}d`` with their backward ops."""

from __future__ import annotations

import math

import numpy as np

from fornax.frameworks.builders import full as _full, reshape as _reshape

from .axes import ndim, sum_dims
from .context import LowerCtx, OutMeta
from .convolution import n_tuple
from .indexing import index_operand, scatter_add_along
from .operands import div_in
from .promotion import compute_dtype, opmath
from .shape import slice_dim, squeeze, unsqueeze
from .table import lowering


# ---- pooling and resampling ----------------------------------------------------------------------
def _pool_args(kernel_size, stride, padding, dilation=1):
    k = n_tuple(kernel_size, 2)
    return k, n_tuple(stride, 2) if stride else k, n_tuple(padding, 2), n_tuple(dilation, 2)


def _batched(ctx, x):
    """An (N, C, H, W) view of a 3-D or 4-D pooling input."""
    return _reshape(ctx, x, (1,) + tuple(x.shape)) if ndim(x) == 3 else x


@lowering("aten::max_pool2d_with_indices.default")
def max_pool2d_with_indices(ctx, self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """The max over kernel taps of strided slices of the -inf padded input; ties keep the first
    tap and NaN wins (torch's ``val > max || isnan(val)``)."""
    if not self.dtype.is_float:
        raise ctx.fail(f"max_pool2d of {self.dtype} is not lowered")
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = _pool_args(kernel_size, stride, padding, dilation)
    x = _batched(ctx, self)
    n, c, h, w = x.shape
    ho, wo = ctx.outs[0].shape[-2:]
    hi_h = max(0, (ho - 1) * sh + (kh - 1) * dh + 1 - ph - h)
    hi_w = max(0, (wo - 1) * sw + (kw - 1) * dw + 1 - pw - w)
    xp = ctx.op("pad", x, pads=((0, 0), (0, 0), (ph, hi_h), (pw, hi_w)), value=-math.inf)
    oh, ow = np.arange(ho)[:, None], np.arange(wo)[None, :]
    hs, ws = oh * sh - ph, ow * sw - pw
    hs0 = np.where(hs < 0, hs + ((-hs + dh - 1) // dh) * dh, hs)
    ws0 = np.where(ws < 0, ws + ((-ws + dw - 1) // dw) * dw, ws)
    best, bidx = ctx.scalar(-math.inf, x.dtype), ctx.const((hs0 * w + ws0).astype(np.int64), "pool_idx")
    for i in range(kh):
        for j in range(kw):
            v = ctx.op("slice", xp, start=(0, 0, i * dh, j * dw),
                       stop=(n, c, i * dh + (ho - 1) * sh + 1, j * dw + (wo - 1) * sw + 1), step=(1, 1, sh, sw))
            tap = ctx.const(((hs + i * dh) * w + ws + j * dw).astype(np.int64), "tap_idx")
            upd = ctx.op("logical_or", ctx.op("gt", v, best), ctx.op("isnan", v))
            best, bidx = ctx.op("where", upd, v, best), ctx.op("where", upd, tap, bidx)
    return _reshape(ctx, best, ctx.outs[0].shape), _reshape(ctx, bidx, ctx.outs[1].shape)


@lowering("aten::max_pool2d_with_indices_backward.default")
def max_pool2d_with_indices_backward(ctx, grad_output, self, kernel_size, stride, padding, dilation, ceil_mode,
                                     indices):
    dt = opmath(grad_output.dtype)
    lead = math.prod(self.shape[:-2])
    g = _reshape(ctx, ctx.cast(grad_output, dt), (lead, math.prod(grad_output.shape[-2:])))
    idx = _reshape(ctx, index_operand(ctx, indices), g.shape)
    gi = ctx.op("scatter", _full(ctx, (lead, math.prod(self.shape[-2:])), 0, dt), idx, g, axis=1, mode="add")
    return _reshape(ctx, gi, self.shape)


def _avg_divisor(h, w, ho, wo, k, s, p, count_include_pad, divisor_override):
    """torch's per-output divisor of avg_pool2d (AvgPoolKernel.cpp)."""
    if divisor_override:
        return np.full((ho, wo), float(divisor_override))
    out = np.empty((ho, wo))
    for a in range(ho):
        h0 = a * s[0] - p[0]
        h1 = min(h0 + k[0], h + p[0])
        for b in range(wo):
            w0 = b * s[1] - p[1]
            w1 = min(w0 + k[1], w + p[1])
            if count_include_pad:
                out[a, b] = (h1 - h0) * (w1 - w0)
            else:
                out[a, b] = (min(h1, h) - max(h0, 0)) * (min(w1, w) - max(w0, 0))
    return out


def _ones_kernel(ctx, c, k, dt):
    return _full(ctx, (c, 1) + tuple(k), 1, dt)


@lowering("aten::avg_pool2d.default")
def avg_pool2d(ctx, self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    k, s, p, _ = _pool_args(kernel_size, stride, padding)
    dt = compute_dtype(ctx)
    x = ctx.cast(_batched(ctx, self), dt)
    n, c, h, w = x.shape
    ho, wo = ctx.outs[0].shape[-2:]
    hi = [max(0, (o - 1) * s[d] + k[d] - p[d] - size) for d, (o, size) in enumerate(((ho, h), (wo, w)))]
    y = ctx.op("convolution", x, _ones_kernel(ctx, c, k, dt), stride=s, padding=((p[0], hi[0]), (p[1], hi[1])),
               groups=c)
    if tuple(y.shape[2:]) != (ho, wo):
        y = ctx.op("slice", y, start=(0, 0, 0, 0), stop=(n, c, ho, wo))
    div = _avg_divisor(h, w, ho, wo, k, s, p, count_include_pad, divisor_override)
    return _reshape(ctx, ctx.op("div", y, ctx.const(div.astype(dt.numpy), "divisor")), ctx.outs[0].shape)


@lowering("aten::avg_pool2d_backward.default")
def avg_pool2d_backward(ctx, grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    k, s, p, _ = _pool_args(kernel_size, stride, padding)
    dt = compute_dtype(ctx)
    g = ctx.cast(_batched(ctx, grad_output), dt)
    n, c, ho, wo = g.shape
    h, w = self.shape[-2:]
    div = _avg_divisor(h, w, ho, wo, k, s, p, count_include_pad, divisor_override)
    g = ctx.op("div", g, ctx.const(div.astype(dt.numpy), "divisor"))
    full = ctx.op("conv_transpose", g, _ones_kernel(ctx, c, k, dt), stride=s, groups=c)  # input coords - p
    # crop the padding off (and zero-fill rows no window reached)
    out = full
    for d, (size, pd) in enumerate(((h, p[0]), (w, p[1]))):
        ax = 2 + d
        have = out.shape[ax]
        out = slice_dim(ctx, out, ax, pd, min(have, pd + size))
        if out.shape[ax] < size:
            pads = [(0, 0)] * 4
            pads[ax] = (0, size - out.shape[ax])
            out = ctx.op("pad", out, pads=tuple(pads), value=0.0)
    return _reshape(ctx, out, self.shape)


def _adaptive_matrix(n_in, n_out):
    """(n_out, n_in) averaging matrix of adaptive pooling windows [floor(i*n/o), ceil((i+1)*n/o))."""
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        a, b = (i * n_in) // n_out, -(-((i + 1) * n_in) // n_out)
        m[i, a:b] = 1.0 / (b - a)
    return m


def _separable(ctx, x, mh, mw):
    """``mh @ x @ mw.T`` over the last two dims of x (``mh``/``mw`` numpy matrices)."""
    r = ndim(x)
    dt = x.dtype
    y = ctx.op("dot_general", x, ctx.const(mh.astype(dt.numpy), "rows"), lhs_contracting=(r - 2,),
               rhs_contracting=(1,))                                          # (..., W, Ho)
    return ctx.op("dot_general", y, ctx.const(mw.astype(dt.numpy), "cols"), lhs_contracting=(r - 2,),
                  rhs_contracting=(1,))                                       # (..., Ho, Wo)


@lowering("aten::_adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(ctx, self, output_size):
    """Equal windows (the input divides evenly): a reshape and two sums; otherwise averaging
    matrices (an inf or NaN there also reaches the other outputs of its row, 0*inf)."""
    dt = compute_dtype(ctx)
    x = ctx.cast(self, dt)
    h, w = x.shape[-2:]
    oh, ow = output_size
    lead = tuple(x.shape[:-2])
    if h % oh == 0 and w % ow == 0:
        x6 = _reshape(ctx, x, lead + (oh, h // oh, ow, w // ow))
        r = len(lead)
        s = sum_dims(ctx, x6, [r + 1, r + 3], False)
        return div_in(ctx, s, (h // oh) * (w // ow), dt)
    return _separable(ctx, x, _adaptive_matrix(h, oh), _adaptive_matrix(w, ow))


@lowering("aten::_adaptive_avg_pool2d_backward.default")
def _adaptive_avg_pool2d_backward(ctx, grad_output, self):
    dt = compute_dtype(ctx)
    g = ctx.cast(grad_output, dt)
    h, w = self.shape[-2:]
    oh, ow = g.shape[-2:]
    return _separable(ctx, g, _adaptive_matrix(h, oh).T, _adaptive_matrix(w, ow).T)


def _nearest_index(n_in, n_out, scale):
    """torch's nearest source index (UpSample.h: float32 arithmetic)."""
    if n_out == n_in:
        return np.arange(n_out)
    if n_out == 2 * n_in:
        return np.arange(n_out) >> 1
    sc = np.float32(1.0 / scale) if scale else np.float32(n_in) / np.float32(n_out)
    return np.minimum(np.floor(np.arange(n_out, dtype=np.float32) * sc).astype(np.int64), n_in - 1)


def _resample_size(input_shape, output_size, scale_factors):
    if output_size is not None:
        return tuple(output_size), (None, None)
    return tuple(int(math.floor(n * s)) for n, s in zip(input_shape[-2:], scale_factors)), tuple(scale_factors)


@lowering("aten::upsample_nearest2d.default")
def upsample_nearest2d(ctx, self, output_size, scales_h=None, scales_w=None):
    x = self
    for d, (n_out, sc) in enumerate(zip(output_size, (scales_h, scales_w))):
        ax = ndim(x) - 2 + d
        idx = _nearest_index(x.shape[ax], n_out, sc)
        if not np.array_equal(idx, np.arange(x.shape[ax])):
            x = ctx.op("index_select", x, ctx.const(idx, "nearest"), axis=ax)
    return x


@lowering("aten::upsample_nearest2d.vec")
def upsample_nearest2d_vec(ctx, input, output_size, scale_factors):
    size, scales = _resample_size(input.shape, output_size, scale_factors)
    return upsample_nearest2d(ctx, input, size, *scales)


@lowering("aten::upsample_nearest2d_backward.default")
def upsample_nearest2d_backward(ctx, grad_output, output_size, input_size, scales_h=None, scales_w=None):
    g = ctx.cast(grad_output, compute_dtype(ctx))
    for d, (n_out, sc) in enumerate(zip(output_size, (scales_h, scales_w))):
        ax = ndim(g) - 2 + d
        n_in = input_size[-2 + d]
        g = scatter_add_along(ctx, g, ax, ctx.const(_nearest_index(n_in, n_out, sc), "nearest"), n_in)
    return g


def _linear_matrix(n_in, n_out, align_corners, scale):
    """(n_out, n_in) linear interpolation weights, torch's source index rule (UpSample.h)."""
    if align_corners:
        sc = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        sc = 1.0 / scale if scale else n_in / n_out
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        src = i * sc if align_corners else max((i + 0.5) * sc - 0.5, 0.0)
        i0 = min(int(math.floor(src)), n_in - 1)
        i1 = min(i0 + 1, n_in - 1)
        lam = src - i0
        m[i, i0] += 1.0 - lam
        m[i, i1] += lam
    return m


@lowering("aten::upsample_bilinear2d.default")
def upsample_bilinear2d(ctx, self, output_size, align_corners, scales_h=None, scales_w=None):
    """Separable interpolation matrices (an inf or NaN also reaches the other outputs of its
    row, 0*inf)."""
    x = ctx.cast(self, compute_dtype(ctx))
    h, w = x.shape[-2:]
    return _separable(ctx, x, _linear_matrix(h, output_size[0], align_corners, scales_h),
                      _linear_matrix(w, output_size[1], align_corners, scales_w))


@lowering("aten::upsample_bilinear2d.vec")
def upsample_bilinear2d_vec(ctx, input, output_size, align_corners, scale_factors):
    size, scales = _resample_size(input.shape, output_size, scale_factors)
    return upsample_bilinear2d(ctx, input, size, align_corners, *scales)


@lowering("aten::upsample_bilinear2d_backward.default")
def upsample_bilinear2d_backward(ctx, grad_output, output_size, input_size, align_corners, scales_h=None,
                                 scales_w=None):
    g = ctx.cast(grad_output, compute_dtype(ctx))
    h, w = input_size[-2:]
    return _separable(ctx, g, _linear_matrix(h, output_size[0], align_corners, scales_h).T,
                      _linear_matrix(w, output_size[1], align_corners, scales_w).T)


def _pad_index(n, lo, hi, mode):
    i = np.arange(-lo, n + hi)
    if mode == "reflect":
        i = np.abs(i)
        i = np.where(i >= n, 2 * (n - 1) - i, i)
    else:
        i = np.clip(i, 0, n - 1)
    return i.astype(np.int64)


def _index_pad(ctx, x, padding, mode):
    for j in range(len(padding) // 2):
        ax = ndim(x) - 1 - j
        lo, hi = padding[2 * j], padding[2 * j + 1]
        if lo or hi:
            x = ctx.op("index_select", x, ctx.const(_pad_index(x.shape[ax], lo, hi, mode), "pad_idx"), axis=ax)
    return x


def _index_pad_backward(ctx, g, self, padding, mode):
    g = ctx.cast(g, opmath(g.dtype))
    for j in range(len(padding) // 2):
        ax = ndim(g) - 1 - j
        lo, hi = padding[2 * j], padding[2 * j + 1]
        if lo or hi:
            n = self.shape[ax]
            g = scatter_add_along(ctx, g, ax, ctx.const(_pad_index(n, lo, hi, mode), "pad_idx"), n)
    return g


for _nd in (1, 2, 3):
    for _mode, _aten in (("reflect", "reflection"), ("edge", "replication")):
        def _pad_fwd(ctx, self, padding, _mode=_mode):
            return _index_pad(ctx, self, padding, _mode)

        def _pad_bwd(ctx, grad_output, self, padding, _mode=_mode):
            return _index_pad_backward(ctx, grad_output, self, padding, _mode)
        lowering(f"aten::{_aten}_pad{_nd}d.default")(_pad_fwd)
        lowering(f"aten::{_aten}_pad{_nd}d_backward.default")(_pad_bwd)


# ---- 1-d pooling, as 2-d pooling of height 1 -----------------------------------------------------
def _pool1d(fn):
    """A 1-d pooling as its 2-d form over a height of one."""
    def run(ctx, self, *args):
        x = unsqueeze(ctx, self, -2)
        sub = LowerCtx(ctx.g, [OutMeta(ctx.outs[0].shape[:-1] + (1,) + ctx.outs[0].shape[-1:], ctx.outs[0].dtype)],
                       ctx._consts)
        sub.where = ctx.where
        return squeeze(ctx, fn(sub, x, *args), ndim(x) - 2)
    return run


@lowering("aten::avg_pool1d.default")
def avg_pool1d(ctx, self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True):
    k, s, p = n_tuple(kernel_size, 1), n_tuple(stride, 1) if stride else n_tuple(kernel_size, 1), n_tuple(padding, 1)
    return _pool1d(avg_pool2d)(ctx, self, [1, k[0]], [1, s[0]], [0, p[0]], ceil_mode, count_include_pad, None)


@lowering("aten::adaptive_avg_pool1d.default")
def adaptive_avg_pool1d(ctx, self, output_size):
    return _pool1d(_adaptive_avg_pool2d)(ctx, self, [1, n_tuple(output_size, 1)[0]])
