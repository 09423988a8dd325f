"""Lowering rules of jax's contractions and convolution: ``dot_general`` and
``conv_general_dilated``.

Float operands of float16/bfloat16 contract in float32 and round once.  Refused: integer
convolutions and integer dot products whose broadcast product exceeds :data:`MAX_INT_DOT`
elements.
"""

from __future__ import annotations

import math

from ....layers.graph import DType
from ....layers.nn_ops import _conv_via_im2col
from ... import builders as B
from ..lowering import device_dtype, lowering
from .common import compute_dtype, in_dtype, ints, out_dtype, out_shape

#: the most elements of the broadcast product an integer dot_general builds
MAX_INT_DOT = 1 << 24


@lowering("dot_general")
def dot_general(ctx, eqn, a, b):
    """Float operands contract in float32 (float16/bfloat16) or their own dtype and round once;
    integer ones as a broadcast product summed over the contracting dims, wrapping."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lc, rc, lb, rb = ints(lc), ints(rc), ints(lb), ints(rb)
    out = device_dtype(out_dtype(eqn))
    if out.is_float:
        cdt = compute_dtype(out)
        y = ctx.op("dot_general", ctx.cast(a, cdt), ctx.cast(b, cdt), lhs_contracting=lc, rhs_contracting=rc,
                   lhs_batch=lb, rhs_batch=rb)
        return ctx.cast(y, out)
    if out is DType.BOOL:
        raise ctx.fail("dot_general of bool operands")
    lf = [d for d in range(len(a.shape)) if d not in lc + lb]
    rf = [d for d in range(len(b.shape)) if d not in rc + rb]
    size = (lambda v, dims: math.prod(v.shape[d] for d in dims))
    nb, m, k, n = size(a, lb), size(a, lf), size(a, lc), size(b, rf)
    if nb * m * k * n > MAX_INT_DOT:
        raise ctx.fail(f"an integer dot_general forms its {nb}x{m}x{k}x{n} broadcast product; fornax "
                       f"builds at most {MAX_INT_DOT} elements (the graph IR has no integer matmul)")
    a4 = B.reshape(ctx, B.permute(ctx, ctx.cast(a, out), lb + tuple(lf) + lc), (nb, m, k, 1))
    b4 = B.reshape(ctx, B.permute(ctx, ctx.cast(b, out), rb + rc + tuple(rf)), (nb, 1, k, n))
    y = ctx.op("reduce_sum", ctx.op("mul", a4, b4), axis=2, keepdims=False)
    return ctx.wrap(B.reshape(ctx, y, out_shape(eqn)), out_dtype(eqn))


@lowering("conv_general_dilated")
def conv_general_dilated(ctx, eqn, lhs, rhs):
    """Operands transposed into (N, C, *spatial) / (O, I, *kernel) by the dimension numbers;
    the ``convolution`` op (routable to a DNN library) without input dilation or negative
    padding, else im2col (which dilates and crops) and one matmul per group.  A batch group
    count G splits the lhs batch into G contiguous groups, group g meeting the g-th block of
    output features: the batch groups become channel groups of a grouped convolution."""
    p = eqn.params
    out = device_dtype(out_dtype(eqn))
    if not out.is_float:
        raise ctx.fail(f"integer convolution ({in_dtype(eqn)} operands): the graph IR convolves floats only")
    dn = p["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = ints(dn.lhs_spec), ints(dn.rhs_spec), ints(dn.out_spec)
    cdt = compute_dtype(out)
    x = B.permute(ctx, ctx.cast(lhs, cdt), lhs_spec)
    w = B.permute(ctx, ctx.cast(rhs, cdt), rhs_spec)
    groups, bgroups = int(p["feature_group_count"]), int(p["batch_group_count"])
    if bgroups > 1:
        if groups > 1:
            raise ctx.fail("feature_group_count and batch_group_count both above 1")
        n, c, spatial = x.shape[0], x.shape[1], list(x.shape[2:])
        x = B.reshape(ctx, x, [bgroups, n // bgroups, c] + spatial)
        x = B.permute(ctx, x, [1, 0, 2] + list(range(3, 3 + len(spatial))))
        x = B.reshape(ctx, x, [n // bgroups, bgroups * c] + spatial)
        groups = bgroups
    oshape = out_shape(eqn)
    out_spatial = tuple(oshape[d] for d in out_spec[2:])
    stride, rhs_dil, lhs_dil = ints(p["window_strides"]), ints(p["rhs_dilation"]), ints(p["lhs_dilation"])
    padding = tuple((int(lo), int(hi)) for lo, hi in p["padding"])
    if set(lhs_dil) <= {1} and all(lo >= 0 and hi >= 0 for lo, hi in padding):
        y = ctx.op("convolution", x, w, stride=stride, padding=padding, dilation=rhs_dil, groups=groups)
    else:
        y = _conv_via_im2col(ctx.graph, x, w, x.shape[0], w.shape[0], groups, out_spatial, stride=stride,
                             padding=padding, dilation=rhs_dil, lhs_dilation=lhs_dil)
    back = [0] * len(out_spec)
    for i, d in enumerate(out_spec):
        back[d] = i
    return ctx.cast(B.permute(ctx, y, back), out)
