"""Convolution: the patch-gathering ``im2col`` and the composites ``convolution`` and
``conv_transpose``.

Both composites are N-d, NC(spatial) layout, with stride, padding, dilation
and groups (PyTorch's conventions; the weight of ``conv_transpose`` is
``(C_in, C_out / groups, *kernel)``, and ``conv_transpose`` is the input
gradient of ``convolution``).  Both decompose into ``im2col`` (padding and
the zeros a transposed convolution inserts between input elements are
masked loads) and one batched ``matmul`` per group
(:func:`conv_via_im2col`).  :func:`conv_geometry` and
:func:`im2col_geometry` check and normalise the attributes; the library
router and the code generator use them too.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..errors import GraphError
from ..ir import DType, TensorType, Value
from .registry import (Array, Attrs, GraphBuilder, OpDef, float_only, permute, register, reshape,
                       same_dtype)

#: (low, high) padding per spatial dim
Pads = tuple[tuple[int, int], ...]
#: (stride, pads, dilation, groups, output_padding, output spatial shape) of a convolution
ConvGeometry = tuple[tuple[int, ...], Pads, tuple[int, ...], int, tuple[int, ...], tuple[int, ...]]
#: (kernel, stride, dilation, lhs_dilation, pads, groups, output spatial shape) of an im2col
Im2colGeometry = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], Pads, int,
                       tuple[int, ...]]


def _ints(op: str, name: str, value: object, n: int, minimum: int) -> tuple[int, ...]:
    """An int or a sequence of ``n`` ints, each >= minimum, as a tuple."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,) * n
    if not isinstance(value, (tuple, list)) or len(value) != n or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in value):
        raise GraphError(f"{op}: {name} must be an int or {n} ints >= {minimum}, got {value!r}", op=op)
    return tuple(value)


def _pads(op: str, value: object, n: int, allow_negative: bool = False) -> Pads:
    """Padding as one (low, high) pair per spatial dim (from an int, n ints or n pairs)."""
    lo = None if allow_negative else 0
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,) * n
    if isinstance(value, (tuple, list)) and len(value) == n:
        pairs: list[tuple[Any, ...]] = [tuple(p) if isinstance(p, (tuple, list)) else (p, p) for p in value]
        if all(len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and (lo is None or x >= lo)
                                   for x in p) for p in pairs):
            return tuple((p[0], p[1]) for p in pairs)
    raise GraphError(f"{op}: padding must be an int, {n} ints or {n} (low, high) pairs"
                     f"{'' if allow_negative else ' of non-negative ints'}, got {value!r}", op=op)


def conv_geometry(op: str, x_shape: Sequence[int], kernel: Sequence[int], attrs: Attrs,
                  transposed: bool = False) -> ConvGeometry:
    """Checked (stride, pads, dilation, groups, output_padding, out_spatial) of a convolution."""
    nd = len(kernel)
    stride = _ints(op, "stride", attrs.get("stride", 1), nd, 1)
    dilation = _ints(op, "dilation", attrs.get("dilation", 1), nd, 1)
    groups = attrs.get("groups", 1)
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise GraphError(f"{op}: groups must be a positive int, got {groups!r}", op=op)
    pads = _pads(op, attrs.get("padding", 0), nd)
    spatial = x_shape[2:]
    if transposed:
        outpad = _ints(op, "output_padding", attrs.get("output_padding", 0), nd, 0)
        for d in range(nd):
            if outpad[d] >= max(stride[d], dilation[d]):
                raise GraphError(f"{op}: output_padding {outpad[d]} must be smaller than stride or "
                                 f"dilation in spatial dim {d}", op=op)
        out = tuple((spatial[d] - 1) * stride[d] - pads[d][0] - pads[d][1] + dilation[d] * (kernel[d] - 1)
                    + outpad[d] + 1 for d in range(nd))
    else:
        outpad = (0,) * nd
        out = tuple((spatial[d] + pads[d][0] + pads[d][1] - dilation[d] * (kernel[d] - 1) - 1) // stride[d] + 1
                    for d in range(nd))
    if any(o < 1 for o in out):
        raise GraphError(f"{op}: output spatial size {out} is empty (input {spatial}, kernel {kernel}, "
                         f"stride {stride}, padding {pads}, dilation {dilation})", op=op)
    return stride, pads, dilation, groups, outpad, out


def _check_conv_operands(op: str, types: list[TensorType]) -> DType:
    x, w = types
    dt = same_dtype(op, types)
    float_only(op, dt)
    if len(x.shape) < 3 or len(w.shape) != len(x.shape):
        raise GraphError(f"{op}: input must be (N, C, *spatial) with at least one spatial dim and the "
                         f"weight of the same rank; got {x.shape} and {w.shape}", op=op)
    return dt


def _infer_conv(types: list[TensorType], attrs: Attrs) -> TensorType:
    dt = _check_conv_operands("convolution", types)
    x, w = types
    stride, pads, dil, groups, _, out = conv_geometry("convolution", x.shape, w.shape[2:], attrs)
    c, o = x.shape[1], w.shape[0]
    if c % groups or o % groups or w.shape[1] * groups != c:
        raise GraphError(f"convolution: with groups={groups}, input channels {c} and output channels {o} "
                         f"must divide by groups and the weight must be (O, C/groups, *k); weight is "
                         f"{w.shape}", op="convolution")
    return TensorType((x.shape[0], o) + out, dt)


def _conv_ref(x: Array, w: Array, stride: object = 1, padding: object = 0, dilation: object = 1,
              groups: int = 1) -> Array:
    """Direct convolution in float64: a sum over kernel offsets of strided input slices."""
    nd = x.ndim - 2
    st, pads, dil, groups, _, out = conv_geometry("convolution", x.shape, w.shape[2:], dict(
        stride=stride, padding=padding, dilation=dilation, groups=groups))
    xp = np.pad(x, [(0, 0), (0, 0)] + [tuple(p) for p in pads])
    n, c = x.shape[:2]
    o = w.shape[0]
    cg, og = c // groups, o // groups
    y = np.zeros((n, o) + out)
    for kidx in np.ndindex(*w.shape[2:]):
        sl = tuple(slice(kidx[d] * dil[d], kidx[d] * dil[d] + (out[d] - 1) * st[d] + 1, st[d])
                   for d in range(nd))
        patch = xp[(slice(None), slice(None)) + sl]                 # (N, C, *out)
        for gi in range(groups):
            wk = w[(slice(gi * og, (gi + 1) * og), slice(None)) + kidx]   # (og, cg)
            y[:, gi * og:(gi + 1) * og] += np.einsum("oc,nc...->no...", wk,
                                                    patch[:, gi * cg:(gi + 1) * cg])
    return y


def _infer_conv_transpose(types: list[TensorType], attrs: Attrs) -> TensorType:
    dt = _check_conv_operands("conv_transpose", types)
    x, w = types
    _, _, _, groups, _, out = conv_geometry("conv_transpose", x.shape, w.shape[2:], attrs, True)
    c = x.shape[1]
    if w.shape[0] != c or c % groups:
        raise GraphError(f"conv_transpose: the weight must be (C_in, C_out/groups, *k) with C_in={c} "
                         f"divisible by groups={groups}; weight is {w.shape}", op="conv_transpose")
    return TensorType((x.shape[0], w.shape[1] * groups) + out, dt)


def _conv_transpose_ref(x: Array, w: Array, stride: object = 1, padding: object = 0,
                        output_padding: object = 0, dilation: object = 1, groups: int = 1) -> Array:
    """Transposed convolution in float64: every input element scatters kernel-weighted values."""
    nd = x.ndim - 2
    st, pads, dil, groups, outpad, out = conv_geometry("conv_transpose", x.shape, w.shape[2:], dict(
        stride=stride, padding=padding, output_padding=output_padding, dilation=dilation,
        groups=groups), True)
    n, c = x.shape[:2]
    cg, og = c // groups, w.shape[1]
    full = tuple((x.shape[2 + d] - 1) * st[d] + dil[d] * (w.shape[2 + d] - 1) + 1 + outpad[d]
                 for d in range(nd))
    y = np.zeros((n, og * groups) + full)
    for kidx in np.ndindex(*w.shape[2:]):
        sl = tuple(slice(kidx[d] * dil[d], kidx[d] * dil[d] + (x.shape[2 + d] - 1) * st[d] + 1, st[d])
                   for d in range(nd))
        for gi in range(groups):
            wk = w[(slice(gi * cg, (gi + 1) * cg), slice(None)) + kidx]   # (cg, og)
            y[(slice(None), slice(gi * og, (gi + 1) * og)) + sl] += np.einsum(
                "co,nc...->no...", wk, x[:, gi * cg:(gi + 1) * cg])
    crop = tuple(slice(pads[d][0], pads[d][0] + out[d]) for d in range(nd))
    return y[(slice(None), slice(None)) + crop]


def im2col_geometry(x_shape: Sequence[int], attrs: Attrs) -> Im2colGeometry:
    """Checked (kernel, stride, dilation, lhs_dilation, pads, groups, out_spatial) of an im2col."""
    kernel = _ints("im2col", "kernel", attrs.get("kernel"), len(x_shape) - 2, 1)
    nd = len(kernel)
    stride = _ints("im2col", "stride", attrs.get("stride", 1), nd, 1)
    dil = _ints("im2col", "dilation", attrs.get("dilation", 1), nd, 1)
    lhs = _ints("im2col", "lhs_dilation", attrs.get("lhs_dilation", 1), nd, 1)
    pads = _pads("im2col", attrs.get("padding", 0), nd, allow_negative=True)
    groups = attrs.get("groups", 1)
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1 or x_shape[1] % groups:
        raise GraphError(f"im2col: groups {groups!r} must be a positive int dividing the {x_shape[1]} "
                         "channels", op="im2col")
    span = tuple((x_shape[2 + d] - 1) * lhs[d] + 1 for d in range(nd))
    out = tuple((span[d] + pads[d][0] + pads[d][1] - dil[d] * (kernel[d] - 1) - 1) // stride[d] + 1
                for d in range(nd))
    if any(o < 1 for o in out):
        raise GraphError(f"im2col: no output positions (input {x_shape[2:]}, kernel {kernel})", op="im2col")
    return kernel, stride, dil, lhs, pads, groups, out


def _infer_im2col(types: list[TensorType], attrs: Attrs) -> TensorType:
    (x,) = types
    if len(x.shape) < 3:
        raise GraphError(f"im2col: input must be (N, C, *spatial), got {x.shape}", op="im2col")
    kernel, _, _, _, _, groups, out = im2col_geometry(x.shape, attrs)
    return TensorType((groups, x.shape[1] // groups * math.prod(kernel), x.shape[0] * math.prod(out)),
                      x.dtype)


def _im2col_ref(x: Array, kernel: Sequence[int], stride: object = 1, padding: object = 0,
                dilation: object = 1, lhs_dilation: object = 1, groups: int = 1) -> Array:
    kern, st, dil, lhs, pads, groups, out = im2col_geometry(x.shape, dict(
        kernel=kernel, stride=stride, padding=padding, dilation=dilation, lhs_dilation=lhs_dilation,
        groups=groups))
    nd = len(kern)
    n, c = x.shape[:2]
    span = tuple((x.shape[2 + d] - 1) * lhs[d] + 1 for d in range(nd))
    xd = np.zeros((n, c) + span)
    xd[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in lhs)] = x
    # negative padding crops
    crop = tuple(slice(max(0, -p[0]), span[d] - max(0, -p[1])) for d, p in enumerate(pads))
    xp = np.pad(xd[(slice(None), slice(None)) + crop],
                [(0, 0), (0, 0)] + [(max(0, p[0]), max(0, p[1])) for p in pads])
    cols = np.empty((n, c) + tuple(kern) + out)
    for kidx in np.ndindex(*kern):
        sl = tuple(slice(kidx[d] * dil[d], kidx[d] * dil[d] + (out[d] - 1) * st[d] + 1, st[d])
                   for d in range(nd))
        cols[(slice(None), slice(None)) + kidx] = xp[(slice(None), slice(None)) + sl]
    cg = c // groups
    grouped = cols.reshape(n, groups, cg * math.prod(kern), math.prod(out))
    return grouped.transpose(1, 2, 0, 3).reshape(groups, cg * math.prod(kern), n * math.prod(out))


register(OpDef("im2col", "indexed", 1, _infer_im2col, _im2col_ref,
               attrs=("kernel", "stride", "padding", "dilation", "lhs_dilation", "groups")))


def conv_via_im2col(g: GraphBuilder, x: Value, w: Value, n: int, o: int, groups: int,
                    out: Sequence[int], **im2col_attrs: Any) -> Value:
    """``w`` is (O, C/groups, *k): one batched matmul per group over im2col patches."""
    kernel = w.shape[2:]
    cols = g.op("im2col", x, kernel=tuple(kernel), groups=groups, **im2col_attrs)  # (G, CgK, N*L)
    og = o // groups
    w3 = reshape(g, w, (groups, og, cols.shape[1]))
    y = g.op("matmul", w3, cols)                                                   # (G, og, N*L)
    L = math.prod(out)
    y = reshape(g, y, (groups, og, n, L))
    y = permute(g, y, (2, 0, 1, 3))                                                # (N, G, og, L)
    return reshape(g, y, (n, o) + tuple(out))


def _conv_decompose(g: GraphBuilder, inputs: Sequence[Value], attrs: Attrs) -> Value:
    x, w = inputs
    st, pads, dil, groups, _, out = conv_geometry("convolution", x.shape, w.shape[2:], attrs)
    return conv_via_im2col(g, x, w, x.shape[0], w.shape[0], groups, out,
                           stride=st, padding=pads, dilation=dil)


def _conv_transpose_decompose(g: GraphBuilder, inputs: Sequence[Value], attrs: Attrs) -> Value:
    """A stride-1 convolution of the zero-stuffed input (``lhs_dilation``) with the flipped,
    channel-swapped weight; padding becomes ``dilation*(k-1) - padding``."""
    x, w = inputs
    st, pads, dil, groups, outpad, out = conv_geometry("conv_transpose", x.shape, w.shape[2:], attrs, True)
    kernel = w.shape[2:]
    cin, og = w.shape[0], w.shape[1]
    cg = cin // groups
    # (C_in, og, *k) -> (G, cg, og, *k) -> (G, og, cg, *k) -> (G*og, cg, *k)
    wt = reshape(g, w, (groups, cg, og) + tuple(kernel))
    wt = permute(g, wt, (0, 2, 1) + tuple(range(3, 3 + len(kernel))))
    wt = reshape(g, wt, (groups * og, cg) + tuple(kernel))
    for d, k in enumerate(kernel):
        if k > 1:
            rev = g.constant(np.arange(k - 1, -1, -1, dtype=np.int64), "flip")
            wt = g.op("index_select", wt, rev, axis=2 + d)
    new_pads = tuple((dil[d] * (kernel[d] - 1) - pads[d][0], dil[d] * (kernel[d] - 1) - pads[d][1] + outpad[d])
                     for d in range(len(kernel)))
    return conv_via_im2col(g, x, wt, x.shape[0], groups * og, groups, out,
                           stride=1, padding=new_pads, dilation=dil, lhs_dilation=st)


_CONV_ATTRS = ("stride", "padding", "dilation", "groups")
register(OpDef("convolution", "composite", 2, _infer_conv, _conv_ref, _conv_decompose, attrs=_CONV_ATTRS))
register(OpDef("conv_transpose", "composite", 2, _infer_conv_transpose, _conv_transpose_ref,
               _conv_transpose_decompose, attrs=_CONV_ATTRS + ("output_padding",)))
