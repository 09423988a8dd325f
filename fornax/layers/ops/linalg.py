"""Contractions: ``matmul`` (rank 2 or 3, batched) and the composite ``dot_general``.

``dot_general`` is JAX's general contraction.  The result's dims are the
batch dims, then the lhs free dims, then the rhs free dims.  It decomposes
into transposes, reshapes and one (batched) ``matmul``.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import GraphError
from ..ir import DType, TensorType, Value
from .registry import (Array, Attrs, GraphBuilder, OpDef, float_only, permute, register, reshape,
                       same_dtype)


def _infer_matmul(types: list[TensorType], attrs: Attrs) -> TensorType:
    a, b = types
    dt = same_dtype("matmul", types)
    float_only("matmul", dt)
    if len(a.shape) not in (2, 3) or len(b.shape) not in (2, 3):
        raise GraphError(f"matmul: operands must be rank 2 or 3, got {a.shape} and {b.shape}", op="matmul")
    if a.shape[-1] != b.shape[-2]:
        raise GraphError(f"matmul: contracting dims differ: {a.shape} @ {b.shape} "
                         f"({a.shape[-1]} != {b.shape[-2]})", op="matmul")
    if len(b.shape) == 3 and (len(a.shape) != 3 or a.shape[0] != b.shape[0]):
        raise GraphError(f"matmul: batch dims differ: {a.shape} @ {b.shape}", op="matmul")
    return TensorType(a.shape[:-1] + (b.shape[-1],), dt)


register(OpDef("matmul", "matmul", 2, _infer_matmul, np.matmul))


# ---- dot_general ---------------------------------------------------------------------------
#: (lhs contracting, rhs contracting, lhs batch, rhs batch, lhs free, rhs free) dims
_DotDims = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...],
                 tuple[int, ...], tuple[int, ...]]


def _dims(op: str, name: str, dims: object, rank: int) -> tuple[int, ...]:
    if not isinstance(dims, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                      for d in dims):
        raise GraphError(f"{op}: {name} must be a tuple of ints, got {dims!r}", op=op)
    out = tuple(d % rank if -rank <= d < rank else None for d in dims)
    if None in out:
        raise GraphError(f"{op}: {name} {tuple(dims)} has a dim out of range for rank {rank}", op=op)
    return tuple(d for d in out if d is not None)


def _dot_dims(types: Sequence[TensorType], attrs: Attrs) -> _DotDims:
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


def _infer_dot_general(types: list[TensorType], attrs: Attrs) -> TensorType:
    a, b = types
    dt = same_dtype("dot_general", types)
    float_only("dot_general", dt)
    lc, rc, lb, rb, lf, rf = _dot_dims(types, attrs)
    return TensorType(tuple(a.shape[d] for d in lb) + tuple(a.shape[d] for d in lf)
                      + tuple(b.shape[d] for d in rf), dt)


def _dot_general_ref(a: Array, b: Array, lhs_contracting: Sequence[int] = (),
                     rhs_contracting: Sequence[int] = (), lhs_batch: Sequence[int] = (),
                     rhs_batch: Sequence[int] = ()) -> Array:
    ta, tb = TensorType(a.shape, DType.FLOAT64), TensorType(b.shape, DType.FLOAT64)
    lc, rc, lb, rb, lf, rf = _dot_dims([ta, tb], dict(lhs_contracting=lhs_contracting,
                                                      rhs_contracting=rhs_contracting,
                                                      lhs_batch=lhs_batch, rhs_batch=rhs_batch))
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    la = [""] * a.ndim
    lb_ = [""] * b.ndim
    for i, j in list(zip(lb, rb)) + list(zip(lc, rc)):
        la[i] = lb_[j] = next(letters)
    for d in lf:
        la[d] = next(letters)
    for d in rf:
        lb_[d] = next(letters)
    out = "".join(la[d] for d in lb) + "".join(la[d] for d in lf) + "".join(lb_[d] for d in rf)
    result: Array = np.einsum(f"{''.join(la)},{''.join(lb_)}->{out}", a, b)
    return result


def _dot_general_decompose(g: GraphBuilder, inputs: Sequence[Value], attrs: Attrs) -> Value:
    a, b = inputs
    lc, rc, lb, rb, lf, rf = _dot_dims([a.type, b.type], attrs)
    size = math.prod
    nb = size(a.shape[d] for d in lb)
    m, k, n = size(a.shape[d] for d in lf), size(a.shape[d] for d in lc), size(b.shape[d] for d in rf)
    a3 = reshape(g, permute(g, a, lb + lf + lc), (nb, m, k) if lb else (m, k))
    b3 = reshape(g, permute(g, b, rb + rc + rf), (nb, k, n) if rb else (k, n))
    c = g.op("matmul", a3, b3)
    shape = tuple(a.shape[d] for d in lb) + tuple(a.shape[d] for d in lf) + tuple(b.shape[d] for d in rf)
    return reshape(g, c, shape)


register(OpDef("dot_general", "composite", 2, _infer_dot_general, _dot_general_ref,
               _dot_general_decompose,
               attrs=("lhs_contracting", "rhs_contracting", "lhs_batch", "rhs_batch")))
