"""Normalisation lowerings: ``native_layer_norm`` (and backward), ``_fused_rms_norm``,
``native_batch_norm`` in evaluation or without running statistics,
``_native_batch_norm_legit`` (``_no_training``, ``_functional``), ``native_batch_norm_backward``,
``native_group_norm`` (and backward)."""

from __future__ import annotations

import functools

import torch

from fornax.frameworks.builders import full as _full, reshape as _reshape

from .axes import count_dims, ndim, sum_dims
from .dtypes import DTYPE_TO_TORCH
from .operands import div_in
from .promotion import opmath
from .table import lowering


def _norm_stats(ctx, x, dims, eps):
    """(x - mean, mean, rstd) over ``dims`` (biased variance), all keepdim."""
    n = count_dims(x, dims)
    dt = x.dtype
    m = div_in(ctx, sum_dims(ctx, x, dims), n, dt)
    d = ctx.op("sub", x, m)
    v = div_in(ctx, sum_dims(ctx, ctx.op("mul", d, d), dims), n, dt)
    return d, m, ctx.op("rsqrt", ctx.op("add", v, ctx.scalar(eps, dt)))


@lowering("aten::native_layer_norm.default")
def native_layer_norm(ctx, input, normalized_shape, weight, bias, eps):
    dt = opmath(input.dtype)
    x = ctx.cast(input, dt)
    k = len(normalized_shape)
    dims = list(range(ndim(x) - k, ndim(x)))
    d, m, rstd = _norm_stats(ctx, x, dims, eps)
    if k == 1:      # the graph's layer_norm (compiled natively or routed to the library)
        w = ctx.cast(weight, dt) if weight is not None else _full(ctx, x.shape[-1:], 1, dt)
        b = ctx.cast(bias, dt) if bias is not None else _full(ctx, x.shape[-1:], 0, dt)
        out = ctx.op("layer_norm", x, w, b, eps=float(eps))
    else:
        out = ctx.op("mul", d, rstd)
        if weight is not None:
            out = ctx.op("mul", out, ctx.cast(weight, dt))
        if bias is not None:
            out = ctx.op("add", out, ctx.cast(bias, dt))
    return out, m, rstd


def _norm_input_grad(ctx, gxhat, xhat, rstd, dims):
    """dL/dx of xhat = (x - mean) * rstd over ``dims`` given dL/dxhat:
    rstd/n * (n*g - sum(g) - xhat*sum(g*xhat))."""
    dt = gxhat.dtype
    n = count_dims(gxhat, dims)
    a = ctx.op("sub", ctx.op("mul", gxhat, ctx.scalar(n, dt)), sum_dims(ctx, gxhat, dims))
    a = ctx.op("sub", a, ctx.op("mul", xhat, sum_dims(ctx, ctx.op("mul", gxhat, xhat), dims)))
    return ctx.op("mul", a, ctx.op("div", rstd, ctx.scalar(n, dt)))


@lowering("aten::native_layer_norm_backward.default")
def native_layer_norm_backward(ctx, grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    dt = opmath(input.dtype)
    x, g = ctx.cast(input, dt), ctx.cast(grad_out, dt)
    mean, rstd = ctx.cast(mean, dt), ctx.cast(rstd, dt)
    k = len(normalized_shape)
    r = ndim(x)
    dims, batch = list(range(r - k, r)), list(range(r - k))
    xhat = ctx.op("mul", ctx.op("sub", x, mean), rstd)
    gi = gw = gb = None
    if output_mask[0]:
        gx = ctx.op("mul", g, ctx.cast(weight, dt)) if weight is not None else g
        gi = _norm_input_grad(ctx, gx, xhat, rstd, dims)
    if output_mask[1] and weight is not None:
        gw = sum_dims(ctx, ctx.op("mul", g, xhat), batch, False)
    if output_mask[2] and bias is not None:
        gb = sum_dims(ctx, g, batch, False)
    return gi, gw, gb


@lowering("aten::_fused_rms_norm.default")
def _fused_rms_norm(ctx, input, normalized_shape, weight, eps=None):
    dt = opmath(input.dtype)
    x = ctx.cast(input, dt)
    eps = float(torch.finfo(DTYPE_TO_TORCH[input.dtype]).eps) if eps is None else float(eps)
    k = len(normalized_shape)
    dims = list(range(ndim(x) - k, ndim(x)))
    ms = div_in(ctx, sum_dims(ctx, ctx.op("mul", x, x), dims), count_dims(x, dims), dt)
    rstd = ctx.op("rsqrt", ctx.op("add", ms, ctx.scalar(eps, dt)))
    if k == 1 and weight is not None:
        out = ctx.op("rms_norm", x, ctx.cast(weight, dt), eps=eps)
    else:
        out = ctx.op("mul", x, rstd)
        if weight is not None:
            out = ctx.op("mul", out, ctx.cast(weight, dt))
    return out, rstd


def _chan(ctx, v, rank, dt):
    """A per-channel (C,) vector shaped (1, C, 1, ...) for an NC... tensor."""
    return _reshape(ctx, ctx.cast(v, dt), (1, v.shape[0]) + (1,) * (rank - 2))


def _bn_apply(ctx, x, mean, rstd, weight, bias):
    r, dt = ndim(x), x.dtype
    out = ctx.op("mul", ctx.op("sub", x, mean), rstd)
    if weight is not None:
        out = ctx.op("mul", out, _chan(ctx, weight, r, dt))
    if bias is not None:
        out = ctx.op("add", out, _chan(ctx, bias, r, dt))
    return out


def _batch_norm(ctx, input, weight, bias, running_mean, running_var, training, momentum, eps,
                functional=False):
    dt = opmath(input.dtype)
    x = ctx.cast(input, dt)
    r = ndim(x)
    c = x.shape[1]
    dims = [0] + list(range(2, r))
    if not training:
        if running_mean is None or running_var is None:
            raise ctx.fail("batch norm in eval mode needs running statistics")
        m = _chan(ctx, running_mean, r, dt)
        rstd = ctx.op("rsqrt", ctx.op("add", _chan(ctx, running_var, r, dt), ctx.scalar(eps, dt)))
        out = _bn_apply(ctx, x, m, rstd, weight, bias)
        # CPU returns empty save_mean/save_invstd in eval; other devices (and meta) return the
        # running mean and its inverse std: give those, lower() drops them where torch says empty
        res = [out, _reshape(ctx, m, (c,)), _reshape(ctx, rstd, (c,))]
        if functional:
            res += [running_mean, running_var]
        return res
    if running_mean is not None and not functional:
        raise ctx.fail("batch norm in training updates running_mean/running_var in place; lower the "
                       "functional form (_native_batch_norm_legit_functional) instead")
    d, m, rstd = _norm_stats(ctx, x, dims, eps)
    out = _bn_apply(ctx, x, m, rstd, weight, bias)
    res = [out, _reshape(ctx, m, (c,)), _reshape(ctx, rstd, (c,))]
    if functional:
        n = count_dims(x, dims)
        var = div_in(ctx, sum_dims(ctx, ctx.op("mul", d, d), dims, False), n, dt)
        mom = functools.partial(ctx.scalar, dtype=dt)
        rm, rv = ctx.cast(running_mean, dt), ctx.cast(running_var, dt)
        new_m = ctx.op("add", ctx.op("mul", rm, mom(1 - momentum)), ctx.op("mul", res[1], mom(momentum)))
        unbiased = ctx.op("mul", var, mom(n / max(n - 1, 1)))
        new_v = ctx.op("add", ctx.op("mul", rv, mom(1 - momentum)), ctx.op("mul", unbiased, mom(momentum)))
        res += [new_m, new_v]
    return res


@lowering("aten::native_batch_norm.default", "aten::_native_batch_norm_legit.default")
def native_batch_norm(ctx, input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(ctx, input, weight, bias, running_mean, running_var, training, momentum, eps)


@lowering("aten::_native_batch_norm_legit.no_stats")
def _native_batch_norm_legit_no_stats(ctx, input, weight, bias, training, momentum, eps):
    return _batch_norm(ctx, input, weight, bias, None, None, training, momentum, eps)


@lowering("aten::_native_batch_norm_legit_no_training.default")
def _native_batch_norm_legit_no_training(ctx, input, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(ctx, input, weight, bias, running_mean, running_var, False, momentum, eps)


@lowering("aten::_native_batch_norm_legit_functional.default")
def _native_batch_norm_legit_functional(ctx, input, weight, bias, running_mean, running_var, training,
                                        momentum, eps):
    return _batch_norm(ctx, input, weight, bias, running_mean, running_var, training, momentum, eps,
                       functional=True)


@lowering("aten::native_batch_norm_backward.default")
def native_batch_norm_backward(ctx, grad_out, input, weight, running_mean, running_var, save_mean,
                               save_invstd, train, eps, output_mask):
    dt = opmath(input.dtype)
    x, g = ctx.cast(input, dt), ctx.cast(grad_out, dt)
    r = ndim(x)
    dims = [0] + list(range(2, r))
    if train:
        m, rstd = _chan(ctx, save_mean, r, dt), _chan(ctx, save_invstd, r, dt)
    else:
        m = _chan(ctx, running_mean, r, dt)
        rstd = ctx.op("rsqrt", ctx.op("add", _chan(ctx, running_var, r, dt), ctx.scalar(eps, dt)))
    xhat = ctx.op("mul", ctx.op("sub", x, m), rstd)
    gi = gw = gb = None
    if output_mask[0]:
        gx = ctx.op("mul", g, _chan(ctx, weight, r, dt)) if weight is not None else g
        gi = _norm_input_grad(ctx, gx, xhat, rstd, dims) if train else ctx.op("mul", gx, rstd)
    if output_mask[1]:
        gw = sum_dims(ctx, ctx.op("mul", g, xhat), dims, False)
    if output_mask[2]:
        gb = sum_dims(ctx, g, dims, False)
    return gi, gw, gb


@lowering("aten::native_group_norm.default")
def native_group_norm(ctx, input, weight, bias, N, C, HxW, group, eps):
    dt = opmath(input.dtype)
    x = _reshape(ctx, ctx.cast(input, dt), (N, group, C // group * HxW))
    d, m, rstd = _norm_stats(ctx, x, [2], eps)
    out = _reshape(ctx, ctx.op("mul", d, rstd), (N, C, HxW))
    if weight is not None:
        out = ctx.op("mul", out, _reshape(ctx, ctx.cast(weight, dt), (1, C, 1)))
    if bias is not None:
        out = ctx.op("add", out, _reshape(ctx, ctx.cast(bias, dt), (1, C, 1)))
    return _reshape(ctx, out, input.shape), _reshape(ctx, m, (N, group)), _reshape(ctx, rstd, (N, group))


@lowering("aten::native_group_norm_backward.default")
def native_group_norm_backward(ctx, grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    dt = opmath(input.dtype)
    x = _reshape(ctx, ctx.cast(input, dt), (N, C, HxW))
    g = _reshape(ctx, ctx.cast(grad_out, dt), (N, C, HxW))
    gm = (N, group, C // group * HxW)
    m3, r3 = _reshape(ctx, ctx.cast(mean, dt), (N, group, 1)), _reshape(ctx, ctx.cast(rstd, dt), (N, group, 1))
    xhat = _reshape(ctx, ctx.op("mul", ctx.op("sub", _reshape(ctx, x, gm), m3), r3), (N, C, HxW))
    gi = gw = gb = None
    if output_mask[0]:
        gx = ctx.op("mul", g, _reshape(ctx, ctx.cast(weight, dt), (1, C, 1))) if weight is not None else g
        gi = _norm_input_grad(ctx, _reshape(ctx, gx, gm), _reshape(ctx, xhat, gm), r3, [2])
        gi = _reshape(ctx, gi, input.shape)
    if output_mask[1]:
        gw = sum_dims(ctx, ctx.op("mul", g, xhat), [0, 2], False)
    if output_mask[2]:
        gb = sum_dims(ctx, g, [0, 2], False)
    return gi, gw, gb
