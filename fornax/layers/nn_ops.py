"""Graph IR ops for neural networks: contractions, convolution, indexing, RNG, norms, attention.

Registered into :data:`fornax.layers.graph.OPS` when ``graph`` is imported.

* ``dot_general`` (composite): JAX's general contraction.  The result's dims
  are the batch dims, then the lhs free dims, then the rhs free dims.  It
  decomposes into transposes, reshapes and one (batched) ``matmul``.
* ``convolution`` / ``conv_transpose`` (composites): N-d, NC(spatial) layout,
  with stride, padding, dilation and groups (PyTorch's conventions; the
  weight of ``conv_transpose`` is ``(C_in, C_out / groups, *kernel)``, and
  ``conv_transpose`` is the input gradient of ``convolution``).  Both
  decompose into ``im2col`` (a patch-gathering kernel; padding and the
  zeros a transposed convolution inserts between input elements are masked
  loads) and one batched ``matmul`` per group.
* ``gather`` (take along an axis, PyTorch's ``torch.gather``),
  ``index_select`` and ``scatter`` (``mode="add"`` or ``"set"``).  An index
  outside ``[0, n)`` is clamped to it by ``gather``/``index_select`` (as
  JAX's ``mode="clip"``); ``scatter`` drops such updates (as JAX's scatter).
  For ``scatter(mode="set")`` with a repeated index, the last update in
  row-major order wins.
* counter-based RNG: ``random_bits``, ``random_uniform``, ``random_normal``
  over Threefry-2x32 (20 rounds, as Random123 and JAX define it).  A key is
  an int64 tensor of shape ``(2,)`` holding two 32-bit words; element ``i``
  (row-major) of the result uses counter ``offset + i``, split into its
  high and low 32-bit words.  ``random_bits`` is the xor of the two output
  words (JAX's partitionable ``random.bits``), as int64 in ``[0, 2**32)``;
  ``random_uniform`` uses its top 24 bits; ``random_normal`` is Box-Muller
  over both words.
* ``layer_norm``, ``rms_norm`` (over the last axis) and ``attention``
  (scaled dot-product, optional causal mask): composites with
  decompositions into primitives, which a compiler may instead route to
  the library.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import GraphError
from .graph import OPS, DType, OpDef, TensorType, _float_only, _norm_axis, _register, _same_dtype

MASK32 = 0xFFFFFFFF
THREEFRY_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
THREEFRY_PARITY = 0x1BD11BDA
INDEX_DTYPES = (DType.INT32, DType.INT64)
RANDOM_DTYPES = (DType.FLOAT32, DType.FLOAT64)


def _ints(op: str, name: str, value, n: int, minimum: int) -> tuple[int, ...]:
    """An int or a sequence of ``n`` ints, each >= minimum, as a tuple."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,) * n
    if not isinstance(value, (tuple, list)) or len(value) != n or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in value):
        raise GraphError(f"{op}: {name} must be an int or {n} ints >= {minimum}, got {value!r}", op=op)
    return tuple(value)


def _pads(op: str, value, n: int, allow_negative: bool = False) -> tuple[tuple[int, int], ...]:
    """Padding as one (low, high) pair per spatial dim (from an int, n ints or n pairs)."""
    lo = None if allow_negative else 0
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,) * n
    if isinstance(value, (tuple, list)) and len(value) == n:
        pairs = [tuple(p) if isinstance(p, (tuple, list)) else (p, p) for p in value]
        if all(len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and (lo is None or x >= lo)
                                   for x in p) for p in pairs):
            return tuple(pairs)
    raise GraphError(f"{op}: padding must be an int, {n} ints or {n} (low, high) pairs"
                     f"{'' if allow_negative else ' of non-negative ints'}, got {value!r}", op=op)


# ---- dot_general ---------------------------------------------------------------------------
def _dims(op: str, name: str, dims, rank: int) -> tuple[int, ...]:
    if not isinstance(dims, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                      for d in dims):
        raise GraphError(f"{op}: {name} must be a tuple of ints, got {dims!r}", op=op)
    out = tuple(d % rank if -rank <= d < rank else None for d in dims)
    if None in out:
        raise GraphError(f"{op}: {name} {tuple(dims)} has a dim out of range for rank {rank}", op=op)
    return out


def _dot_dims(types, attrs):
    a, b = types
    lc = _dims("dot_general", "lhs_contracting", attrs.get("lhs_contracting", ()), len(a.shape))
    rc = _dims("dot_general", "rhs_contracting", attrs.get("rhs_contracting", ()), len(b.shape))
    lb = _dims("dot_general", "lhs_batch", attrs.get("lhs_batch", ()), len(a.shape))
    rb = _dims("dot_general", "rhs_batch", attrs.get("rhs_batch", ()), len(b.shape))
    for side, dims in (("lhs", lc + lb), ("rhs", rc + rb)):
        if len(set(dims)) != len(dims):
            raise GraphError(f"dot_general: {side} batch and contracting dims {dims} repeat a dim",
                             op="dot_general")
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise GraphError(f"dot_general: lhs and rhs name different numbers of contracting "
                         f"({len(lc)} vs {len(rc)}) or batch ({len(lb)} vs {len(rb)}) dims", op="dot_general")
    for kind, ld, rd in (("contracting", lc, rc), ("batch", lb, rb)):
        for i, j in zip(ld, rd):
            if a.shape[i] != b.shape[j]:
                raise GraphError(f"dot_general: {kind} dims differ: lhs dim {i} has size {a.shape[i]}, "
                                 f"rhs dim {j} has size {b.shape[j]} ({a.shape} vs {b.shape})",
                                 op="dot_general")
    lf = tuple(d for d in range(len(a.shape)) if d not in lc + lb)
    rf = tuple(d for d in range(len(b.shape)) if d not in rc + rb)
    return lc, rc, lb, rb, lf, rf


def _infer_dot_general(types, attrs):
    a, b = types
    dt = _same_dtype("dot_general", types)
    _float_only("dot_general", dt)
    lc, rc, lb, rb, lf, rf = _dot_dims(types, attrs)
    return TensorType(tuple(a.shape[d] for d in lb) + tuple(a.shape[d] for d in lf)
                      + tuple(b.shape[d] for d in rf), dt)


def _dot_general_ref(a, b, lhs_contracting=(), rhs_contracting=(), lhs_batch=(), rhs_batch=()):
    ta, tb = TensorType(a.shape, DType.FLOAT64), TensorType(b.shape, DType.FLOAT64)
    lc, rc, lb, rb, lf, rf = _dot_dims([ta, tb], dict(lhs_contracting=lhs_contracting,
                                                      rhs_contracting=rhs_contracting,
                                                      lhs_batch=lhs_batch, rhs_batch=rhs_batch))
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    la = [None] * a.ndim
    lb_ = [None] * b.ndim
    for i, j in list(zip(lb, rb)) + list(zip(lc, rc)):
        la[i] = lb_[j] = next(letters)
    for d in lf:
        la[d] = next(letters)
    for d in rf:
        lb_[d] = next(letters)
    out = "".join(la[d] for d in lb) + "".join(la[d] for d in lf) + "".join(lb_[d] for d in rf)
    return np.einsum(f"{''.join(la)},{''.join(lb_)}->{out}", a, b)


def _permute(g, v, perm):
    return v if tuple(perm) == tuple(range(len(v.shape))) else g.op("transpose", v, perm=tuple(perm))


def _reshape(g, v, shape):
    return v if tuple(shape) == tuple(v.shape) else g.op("reshape", v, shape=tuple(shape))


def _dot_general_decompose(g, inputs, attrs):
    a, b = inputs
    lc, rc, lb, rb, lf, rf = _dot_dims([a.type, b.type], attrs)
    size = math.prod
    nb = size(a.shape[d] for d in lb)
    m, k, n = size(a.shape[d] for d in lf), size(a.shape[d] for d in lc), size(b.shape[d] for d in rf)
    a3 = _reshape(g, _permute(g, a, lb + lf + lc), (nb, m, k) if lb else (m, k))
    b3 = _reshape(g, _permute(g, b, rb + rc + rf), (nb, k, n) if rb else (k, n))
    c = g.op("matmul", a3, b3)
    shape = tuple(a.shape[d] for d in lb) + tuple(a.shape[d] for d in lf) + tuple(b.shape[d] for d in rf)
    return _reshape(g, c, shape)


_register(OpDef("dot_general", "composite", 2, _infer_dot_general, _dot_general_ref,
                _dot_general_decompose,
                attrs=("lhs_contracting", "rhs_contracting", "lhs_batch", "rhs_batch")))


# ---- im2col and convolution -----------------------------------------------------------------
def _conv_geometry(op, x_shape, kernel, attrs, transposed=False):
    """Checked (stride, pads, dilation, lhs_dilation, groups, out_spatial) of a convolution."""
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


def _check_conv_operands(op, types, transposed):
    x, w = types
    dt = _same_dtype(op, types)
    _float_only(op, dt)
    if len(x.shape) < 3 or len(w.shape) != len(x.shape):
        raise GraphError(f"{op}: input must be (N, C, *spatial) with at least one spatial dim and the "
                         f"weight of the same rank; got {x.shape} and {w.shape}", op=op)
    return dt


def _infer_conv(types, attrs):
    dt = _check_conv_operands("convolution", types, False)
    x, w = types
    stride, pads, dil, groups, _, out = _conv_geometry("convolution", x.shape, w.shape[2:], attrs)
    c, o = x.shape[1], w.shape[0]
    if c % groups or o % groups or w.shape[1] * groups != c:
        raise GraphError(f"convolution: with groups={groups}, input channels {c} and output channels {o} "
                         f"must divide by groups and the weight must be (O, C/groups, *k); weight is "
                         f"{w.shape}", op="convolution")
    return TensorType((x.shape[0], o) + out, dt)


def _conv_ref(x, w, stride=1, padding=0, dilation=1, groups=1):
    """Direct convolution in float64: a sum over kernel offsets of strided input slices."""
    nd = x.ndim - 2
    st, pads, dil, groups, _, out = _conv_geometry("convolution", x.shape, w.shape[2:], dict(
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


def _infer_conv_transpose(types, attrs):
    dt = _check_conv_operands("conv_transpose", types, True)
    x, w = types
    _, _, _, groups, _, out = _conv_geometry("conv_transpose", x.shape, w.shape[2:], attrs, True)
    c = x.shape[1]
    if w.shape[0] != c or c % groups:
        raise GraphError(f"conv_transpose: the weight must be (C_in, C_out/groups, *k) with C_in={c} "
                         f"divisible by groups={groups}; weight is {w.shape}", op="conv_transpose")
    return TensorType((x.shape[0], w.shape[1] * groups) + out, dt)


def _conv_transpose_ref(x, w, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    """Transposed convolution in float64: every input element scatters kernel-weighted values."""
    nd = x.ndim - 2
    st, pads, dil, groups, outpad, out = _conv_geometry("conv_transpose", x.shape, w.shape[2:], dict(
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


def _im2col_geometry(x_shape, attrs):
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


def _infer_im2col(types, attrs):
    (x,) = types
    if len(x.shape) < 3:
        raise GraphError(f"im2col: input must be (N, C, *spatial), got {x.shape}", op="im2col")
    kernel, _, _, _, _, groups, out = _im2col_geometry(x.shape, attrs)
    return TensorType((groups, x.shape[1] // groups * math.prod(kernel), x.shape[0] * math.prod(out)),
                      x.dtype)


def _im2col_ref(x, kernel, stride=1, padding=0, dilation=1, lhs_dilation=1, groups=1):
    kernel, st, dil, lhs, pads, groups, out = _im2col_geometry(x.shape, dict(
        kernel=kernel, stride=stride, padding=padding, dilation=dilation, lhs_dilation=lhs_dilation,
        groups=groups))
    nd = len(kernel)
    n, c = x.shape[:2]
    span = tuple((x.shape[2 + d] - 1) * lhs[d] + 1 for d in range(nd))
    xd = np.zeros((n, c) + span)
    xd[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in lhs)] = x
    # negative padding crops
    crop = tuple(slice(max(0, -p[0]), span[d] - max(0, -p[1])) for d, p in enumerate(pads))
    xp = np.pad(xd[(slice(None), slice(None)) + crop],
                [(0, 0), (0, 0)] + [(max(0, p[0]), max(0, p[1])) for p in pads])
    cols = np.empty((n, c) + tuple(kernel) + out)
    for kidx in np.ndindex(*kernel):
        sl = tuple(slice(kidx[d] * dil[d], kidx[d] * dil[d] + (out[d] - 1) * st[d] + 1, st[d])
                   for d in range(nd))
        cols[(slice(None), slice(None)) + kidx] = xp[(slice(None), slice(None)) + sl]
    cg = c // groups
    cols = cols.reshape(n, groups, cg * math.prod(kernel), math.prod(out))
    return cols.transpose(1, 2, 0, 3).reshape(groups, cg * math.prod(kernel), n * math.prod(out))


_register(OpDef("im2col", "indexed", 1, _infer_im2col, _im2col_ref,
                attrs=("kernel", "stride", "padding", "dilation", "lhs_dilation", "groups")))


def _conv_via_im2col(g, x, w, n, o, groups, out, **im2col_attrs):
    """``w`` is (O, C/groups, *k): one batched matmul per group over im2col patches."""
    kernel = w.shape[2:]
    cols = g.op("im2col", x, kernel=tuple(kernel), groups=groups, **im2col_attrs)  # (G, CgK, N*L)
    og = o // groups
    w3 = _reshape(g, w, (groups, og, cols.shape[1]))
    y = g.op("matmul", w3, cols)                                                   # (G, og, N*L)
    L = math.prod(out)
    y = _reshape(g, y, (groups, og, n, L))
    y = _permute(g, y, (2, 0, 1, 3))                                               # (N, G, og, L)
    return _reshape(g, y, (n, o) + tuple(out))


def _conv_decompose(g, inputs, attrs):
    x, w = inputs
    st, pads, dil, groups, _, out = _conv_geometry("convolution", x.shape, w.shape[2:], attrs)
    return _conv_via_im2col(g, x, w, x.shape[0], w.shape[0], groups, out,
                            stride=st, padding=pads, dilation=dil)


def _conv_transpose_decompose(g, inputs, attrs):
    """A stride-1 convolution of the zero-stuffed input (``lhs_dilation``) with the flipped,
    channel-swapped weight; padding becomes ``dilation*(k-1) - padding``."""
    x, w = inputs
    st, pads, dil, groups, outpad, out = _conv_geometry("conv_transpose", x.shape, w.shape[2:], attrs, True)
    kernel = w.shape[2:]
    cin, og = w.shape[0], w.shape[1]
    cg = cin // groups
    # (C_in, og, *k) -> (G, cg, og, *k) -> (G, og, cg, *k) -> (G*og, cg, *k)
    wt = _reshape(g, w, (groups, cg, og) + tuple(kernel))
    wt = _permute(g, wt, (0, 2, 1) + tuple(range(3, 3 + len(kernel))))
    wt = _reshape(g, wt, (groups * og, cg) + tuple(kernel))
    for d, k in enumerate(kernel):
        if k > 1:
            rev = g.constant(np.arange(k - 1, -1, -1, dtype=np.int64), "flip")
            wt = g.op("index_select", wt, rev, axis=2 + d)
    new_pads = tuple((dil[d] * (kernel[d] - 1) - pads[d][0], dil[d] * (kernel[d] - 1) - pads[d][1] + outpad[d])
                     for d in range(len(kernel)))
    return _conv_via_im2col(g, x, wt, x.shape[0], groups * og, groups, out,
                            stride=1, padding=new_pads, dilation=dil, lhs_dilation=st)


_CONV_ATTRS = ("stride", "padding", "dilation", "groups")
_register(OpDef("convolution", "composite", 2, _infer_conv, _conv_ref, _conv_decompose, attrs=_CONV_ATTRS))
_register(OpDef("conv_transpose", "composite", 2, _infer_conv_transpose, _conv_transpose_ref,
                _conv_transpose_decompose, attrs=_CONV_ATTRS + ("output_padding",)))


# ---- gather / index_select / scatter -------------------------------------------------------------
def _index_dtype(op, t):
    if t.dtype not in INDEX_DTYPES:
        raise GraphError(f"{op}: indices must be int32 or int64, got {t.dtype}", op=op)


def _infer_gather(types, attrs):
    x, idx = types
    _index_dtype("gather", idx)
    axis = _norm_axis("gather", attrs.get("axis", 0), len(x.shape))
    if len(idx.shape) != len(x.shape) or any(i > s for d, (i, s) in enumerate(zip(idx.shape, x.shape))
                                              if d != axis):
        raise GraphError(f"gather: index {idx.shape} must have the rank of the input {x.shape} and no "
                         f"larger size in any dim but axis {axis}", op="gather")
    return TensorType(idx.shape, x.dtype)


def _gather_ref(x, idx, axis=0):
    axis %= x.ndim
    sub = x[tuple(slice(None) if d == axis else slice(0, s) for d, s in enumerate(idx.shape))]
    return np.take_along_axis(sub, np.clip(idx, 0, x.shape[axis] - 1).astype(np.int64), axis=axis)


def _infer_index_select(types, attrs):
    x, idx = types
    _index_dtype("index_select", idx)
    axis = _norm_axis("index_select", attrs.get("axis", 0), len(x.shape))
    if len(idx.shape) != 1:
        raise GraphError(f"index_select: index must be 1-D, got shape {idx.shape}", op="index_select")
    return TensorType(x.shape[:axis] + idx.shape + x.shape[axis + 1:], x.dtype)


def _index_select_ref(x, idx, axis=0):
    return np.take(x, np.clip(idx, 0, x.shape[axis] - 1).astype(np.int64), axis=axis)


def _infer_scatter(types, attrs):
    x, idx, upd = types
    _index_dtype("scatter", idx)
    if upd.dtype is not x.dtype:
        raise GraphError(f"scatter: updates are {upd.dtype} but the input is {x.dtype}; insert a cast",
                         op="scatter")
    axis = _norm_axis("scatter", attrs.get("axis", 0), len(x.shape))
    mode = attrs.get("mode", "add")
    if mode not in ("add", "set"):
        raise GraphError(f"scatter: mode must be 'add' or 'set', got {mode!r}", op="scatter")
    if mode == "add" and x.dtype is DType.BOOL:
        raise GraphError("scatter: cannot add into a bool tensor", op="scatter")
    if idx.shape != upd.shape or len(idx.shape) != len(x.shape) or any(
            i > s for d, (i, s) in enumerate(zip(idx.shape, x.shape)) if d != axis):
        raise GraphError(f"scatter: index {idx.shape} and updates {upd.shape} must have one shape, the "
                         f"rank of the input {x.shape} and no larger size in any dim but axis {axis}",
                         op="scatter")
    return x


def _scatter_ref(x, idx, upd, axis=0, mode="add"):
    axis %= x.ndim
    out = x.copy()
    n = x.shape[axis]
    for pos in np.ndindex(*idx.shape):          # row-major: for "set" the last update wins
        i = int(idx[pos])
        if not 0 <= i < n:
            continue                            # out-of-range updates are dropped
        dst = pos[:axis] + (i,) + pos[axis + 1:]
        out[dst] = out[dst] + upd[pos] if mode == "add" else upd[pos]
    return out


_register(OpDef("gather", "indexed", 2, _infer_gather, _gather_ref, attrs=("axis",)))
_register(OpDef("index_select", "indexed", 2, _infer_index_select, _index_select_ref, attrs=("axis",)))
_register(OpDef("scatter", "indexed", 3, _infer_scatter, _scatter_ref, attrs=("axis", "mode")))


# ---- counter-based RNG ---------------------------------------------------------------------------
def threefry2x32(key: tuple[int, int], c0: np.ndarray, c1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Threefry-2x32 with 20 rounds (Salmon et al., SC'11), on uint32 words held in int64."""
    k0, k1 = int(key[0]) & MASK32, int(key[1]) & MASK32
    ks = (k0, k1, THREEFRY_PARITY ^ k0 ^ k1)
    x0 = (np.asarray(c0, np.int64) + ks[0]) & MASK32
    x1 = (np.asarray(c1, np.int64) + ks[1]) & MASK32
    for block in range(5):
        for r in THREEFRY_ROTATIONS[(block % 2) * 4:(block % 2) * 4 + 4]:
            x0 = (x0 + x1) & MASK32
            x1 = ((x1 << r) | (x1 >> (32 - r))) & MASK32
            x1 = x1 ^ x0
        x0 = (x0 + ks[(block + 1) % 3]) & MASK32
        x1 = (x1 + ks[(block + 2) % 3] + block + 1) & MASK32
    return x0, x1


def _words(key, shape, offset):
    counter = np.arange(math.prod(shape), dtype=np.int64) + offset
    key = np.asarray(key).astype(np.int64).reshape(-1)
    x0, x1 = threefry2x32((int(key[0]), int(key[1])), counter >> 32, counter & MASK32)
    return x0.reshape(shape), x1.reshape(shape)


def _check_random(op, types, attrs, floats):
    (key,) = types
    if key.dtype is not DType.INT64 or key.shape != (2,):
        raise GraphError(f"{op}: key must be int64[2] (two 32-bit words), got {key}", op=op)
    shape = attrs.get("shape")
    if not isinstance(shape, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                      and d > 0 for d in shape):
        raise GraphError(f"{op}: shape must be a tuple of positive ints, got {shape!r}", op=op)
    offset = attrs.get("offset", 0)
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0 or \
            offset + math.prod(shape) > 2 ** 63:
        raise GraphError(f"{op}: offset must be a non-negative int counter start, got {offset!r}", op=op)
    if floats:
        dt = DType.of(attrs.get("dtype", "float32"))
        if dt not in RANDOM_DTYPES:
            raise GraphError(f"{op}: dtype must be float32 or float64, got {dt}; cast the result",
                             op=op)
        return TensorType(tuple(shape), dt)
    return TensorType(tuple(shape), DType.INT64)


def _infer_random_uniform(types, attrs):
    t = _check_random("random_uniform", types, attrs, True)
    lo, hi = attrs.get("minval", 0.0), attrs.get("maxval", 1.0)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (lo, hi)) \
            or not lo < hi:
        raise GraphError(f"random_uniform: needs finite minval < maxval, got {lo!r}, {hi!r}",
                         op="random_uniform")
    return t


def _random_bits_ref(key, shape, offset=0):
    x0, x1 = _words(key, tuple(shape), offset)
    return x0 ^ x1


def _random_uniform_ref(key, shape, dtype="float32", minval=0.0, maxval=1.0, offset=0):
    bits = _random_bits_ref(key, shape, offset)
    u = (bits >> 8).astype(np.float64) * 2.0 ** -24
    return minval + u * (maxval - minval)


def _random_normal_ref(key, shape, dtype="float32", offset=0):
    x0, x1 = _words(key, tuple(shape), offset)
    u1 = ((x0 >> 8) + 1).astype(np.float64) * 2.0 ** -24          # (0, 1]
    u2 = (x1 >> 8).astype(np.float64) * 2.0 ** -24                  # [0, 1)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


_register(OpDef("random_bits", "indexed", 1, lambda t, a: _check_random("random_bits", t, a, False),
                _random_bits_ref, attrs=("shape", "offset")))
_register(OpDef("random_uniform", "indexed", 1, _infer_random_uniform, _random_uniform_ref,
                attrs=("shape", "dtype", "minval", "maxval", "offset")))
_register(OpDef("random_normal", "indexed", 1,
                lambda t, a: _check_random("random_normal", t, a, True),
                _random_normal_ref, attrs=("shape", "dtype", "offset")))


# ---- norms and attention ---------------------------------------------------------------------------
def _eps(op, attrs):
    eps = attrs.get("eps", 1e-5)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise GraphError(f"{op}: eps must be a non-negative number, got {eps!r}", op=op)
    return float(eps)


def _infer_norm(op, types, attrs):
    x = types[0]
    dt = _same_dtype(op, types)
    _float_only(op, dt)
    _eps(op, attrs)
    for t in types[1:]:
        if t.shape != (x.shape[-1],):
            raise GraphError(f"{op}: weight/bias must have shape ({x.shape[-1]},) (the last dim of "
                             f"{x.shape}), got {t.shape}", op=op)
    return x


def _layer_norm_ref(x, w, b, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _rms_norm_ref(x, w, eps=1e-5):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def _scalar(g, value, dtype, name):
    return g.constant(np.array(value, dtype=dtype.numpy), name)


def _mean_last(g, x):
    s = g.op("reduce_sum", x, axis=-1, keepdims=True)
    return g.op("mul", s, _scalar(g, 1.0 / x.shape[-1], x.dtype, "inv_n"))


def _layer_norm_decompose(g, inputs, attrs):
    x, w, b = inputs
    d = g.op("sub", x, _mean_last(g, x))
    var = _mean_last(g, g.op("mul", d, d))
    r = g.op("rsqrt", g.op("add", var, _scalar(g, _eps("layer_norm", attrs), x.dtype, "eps")))
    return g.op("add", g.op("mul", g.op("mul", d, r), w), b)


def _rms_norm_decompose(g, inputs, attrs):
    x, w = inputs
    ms = _mean_last(g, g.op("mul", x, x))
    r = g.op("rsqrt", g.op("add", ms, _scalar(g, _eps("rms_norm", attrs), x.dtype, "eps")))
    return g.op("mul", g.op("mul", x, r), w)


_register(OpDef("layer_norm", "composite", 3, lambda t, a: _infer_norm("layer_norm", t, a), _layer_norm_ref,
                _layer_norm_decompose, attrs=("eps",)))
_register(OpDef("rms_norm", "composite", 2, lambda t, a: _infer_norm("rms_norm", t, a), _rms_norm_ref,
                _rms_norm_decompose, attrs=("eps",)))


def _infer_attention(types, attrs):
    q, k, v = types
    dt = _same_dtype("attention", types)
    _float_only("attention", dt)
    r = len(q.shape)
    if r < 2 or len(k.shape) != r or len(v.shape) != r or q.shape[:-2] != k.shape[:-2] or \
            q.shape[:-2] != v.shape[:-2] or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise GraphError(f"attention: needs q (..., Sq, D), k (..., Sk, D), v (..., Sk, Dv) with equal "
                         f"leading dims; got {q.shape}, {k.shape}, {v.shape}", op="attention")
    scale = attrs.get("scale")
    if scale is not None and (not isinstance(scale, (int, float)) or isinstance(scale, bool)):
        raise GraphError(f"attention: scale must be a number or None, got {scale!r}", op="attention")
    if not isinstance(attrs.get("causal", False), bool):
        raise GraphError("attention: causal must be True or False", op="attention")
    return TensorType(q.shape[:-1] + (v.shape[-1],), dt)


def _causal_mask(sq, sk):
    """Query i sees keys j <= i (the top-left aligned mask of PyTorch's ``is_causal``)."""
    return np.arange(sk)[None, :] <= np.arange(sq)[:, None]


def _attention_ref(q, k, v, causal=False, scale=None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if causal:
        s = np.where(_causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return np.matmul(p / p.sum(axis=-1, keepdims=True), v)


def _attention_decompose(g, inputs, attrs):
    q, k, v = inputs
    lead = q.shape[:-2]
    nb = math.prod(lead)
    sq, d, sk, dv = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    q3, k3, v3 = (_reshape(g, t, (nb,) + t.shape[-2:]) for t in (q, k, v))
    kt = g.op("transpose", k3, perm=(0, 2, 1))
    scale = attrs.get("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    s = g.op("mul", g.op("matmul", q3, kt), _scalar(g, scale, q.dtype, "scale"))
    if attrs.get("causal", False):
        mask = g.constant(_causal_mask(sq, sk), "causal")
        s = g.op("where", mask, s, _scalar(g, -np.inf, q.dtype, "neg_inf"))
    p = OPS["softmax"].decompose(g, [s], {"axis": -1})
    return _reshape(g, g.op("matmul", p, v3), lead + (sq, dv))


_register(OpDef("attention", "composite", 3, _infer_attention, _attention_ref, _attention_decompose,
                attrs=("causal", "scale")))
