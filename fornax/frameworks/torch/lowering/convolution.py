"""Convolution lowerings: ``convolution``, ``convolution_overrideable``, ``_convolution``,
``convolution_backward`` and ``convolution_backward_overrideable``."""

from __future__ import annotations

from fornax.frameworks.builders import permute as _permute, reshape as _reshape

from .axes import ndim, sum_dims
from .linalg import require_float
from .promotion import opmath
from .table import lowering


def _bias_add(ctx, y, bias):
    if bias is None:
        return y
    b = _reshape(ctx, ctx.cast(bias, y.dtype), (1, bias.shape[0]) + (1,) * (ndim(y) - 2))
    return ctx.op("add", y, b)


@lowering("aten::convolution.default", "aten::convolution_overrideable.default", "aten::_convolution.default")
def convolution(ctx, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
                benchmark=None, deterministic=None, cudnn_enabled=None, allow_tf32=None):
    require_float(ctx, input, weight)
    out = input.dtype
    if opmath(out) != out:      # half types: accumulate and add the bias in float32, round once
        input, weight = ctx.cast(input, opmath(out)), ctx.cast(weight, opmath(out))
    nd = ndim(input) - 2
    st, pad, dil = n_tuple(stride, nd), n_tuple(padding, nd), n_tuple(dilation, nd)
    if transposed:
        y = ctx.op("conv_transpose", input, weight, stride=st, padding=pad, dilation=dil, groups=groups,
                   output_padding=n_tuple(output_padding, nd))
    else:
        y = ctx.op("convolution", input, weight, stride=st, padding=pad, dilation=dil, groups=groups)
    return ctx.cast(_bias_add(ctx, y, bias), out)


def n_tuple(v, n):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(v * n if len(v) == 1 else v)


def _conv_input_grad(ctx, gy, w, in_spatial, st, pad, dil, groups):
    """The input gradient of a convolution: a transposed convolution sized back to the input."""
    k = w.shape[2:]
    full = [(gy.shape[2 + d] - 1) * st[d] - 2 * pad[d] + dil[d] * (k[d] - 1) + 1 for d in range(len(k))]
    extra = [in_spatial[d] - full[d] for d in range(len(k))]
    if any(e < 0 or e >= max(st[d], dil[d]) for d, e in enumerate(extra)):
        raise ctx.fail(f"no transposed convolution gives back the input size {tuple(in_spatial)}")
    return ctx.op("conv_transpose", gy, w, stride=st, padding=pad, dilation=dil, groups=groups,
                  output_padding=tuple(extra))


def _conv_weight_grad(ctx, x, gy, kernel, st, pad, dil, groups):
    """dL/dw of ``y = conv(x, w)``: a grouped convolution of the input (channels as batch) with
    the output gradient as the weight, stride and dilation swapped, cropped to the kernel."""
    n, c = x.shape[:2]
    cg = c // groups
    sp = x.shape[2:]
    nd = len(sp)
    rest = tuple(range(3, 3 + nd))
    xr = _reshape(ctx, x, (n, groups, cg) + tuple(sp))
    xr = _reshape(ctx, _permute(ctx, xr, (2, 1, 0) + rest), (cg, groups * n) + tuple(sp))
    wr = _permute(ctx, gy, (1, 0) + tuple(range(2, 2 + nd)))                 # (O, N, *out)
    r = ctx.op("convolution", xr, wr, stride=tuple(dil), padding=tuple(pad), dilation=tuple(st), groups=groups)
    if tuple(r.shape[2:]) != tuple(kernel):
        r = ctx.op("slice", r, start=(0,) * (2 + nd), stop=tuple(r.shape[:2]) + tuple(kernel))
    return _permute(ctx, r, (1, 0) + tuple(range(2, 2 + nd)))               # (O, C/G, *k)


@lowering("aten::convolution_backward.default", "aten::convolution_backward_overrideable.default")
def convolution_backward(ctx, grad_output, input, weight, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask, bias_sizes=None):
    require_float(ctx, grad_output, input, weight)
    nd = ndim(input) - 2
    st, pad, dil = n_tuple(stride, nd), n_tuple(padding, nd), n_tuple(dilation, nd)
    gi = gw = gb = None
    if transposed:      # y = conv_transpose(x, w) is the adjoint of conv(., w): swap the roles
        if output_mask[0]:
            gi = ctx.op("convolution", grad_output, weight, stride=st, padding=pad, dilation=dil, groups=groups)
        if output_mask[1]:
            gw = _conv_weight_grad(ctx, grad_output, input, weight.shape[2:], st, pad, dil, groups)
    else:
        if output_mask[0]:
            gi = _conv_input_grad(ctx, grad_output, weight, input.shape[2:], st, pad, dil, groups)
        if output_mask[1]:
            gw = _conv_weight_grad(ctx, input, grad_output, weight.shape[2:], st, pad, dil, groups)
    if output_mask[2]:
        g = ctx.cast(grad_output, opmath(grad_output.dtype))
        gb = sum_dims(ctx, g, [0] + list(range(2, ndim(g))), False)
    return gi, gw, gb
