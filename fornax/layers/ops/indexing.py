"""Indexing ops: ``gather`` (take along an axis, PyTorch's ``torch.gather``), ``index_select``
and ``scatter`` (``mode="add"`` or ``"set"``).

An index outside ``[0, n)`` is clamped to it by ``gather``/``index_select``
(as JAX's ``mode="clip"``); ``scatter`` drops such updates (as JAX's
scatter).  For ``scatter(mode="set")`` with a repeated index, the last
update in row-major order wins.  Indices are int32 or int64.
"""

from __future__ import annotations

import numpy as np

from ..errors import GraphError
from ..ir import DType, TensorType
from .registry import Array, Attrs, OpDef, norm_axis, register

#: the dtypes an index operand may have
INDEX_DTYPES = (DType.INT32, DType.INT64)


def _index_dtype(op: str, t: TensorType) -> None:
    if t.dtype not in INDEX_DTYPES:
        raise GraphError(f"{op}: indices must be int32 or int64, got {t.dtype}", op=op)


def _infer_gather(types: list[TensorType], attrs: Attrs) -> TensorType:
    x, idx = types
    _index_dtype("gather", idx)
    axis = norm_axis("gather", attrs.get("axis", 0), len(x.shape))
    if len(idx.shape) != len(x.shape) or any(i > s for d, (i, s) in enumerate(zip(idx.shape, x.shape))
                                              if d != axis):
        raise GraphError(f"gather: index {idx.shape} must have the rank of the input {x.shape} and no "
                         f"larger size in any dim but axis {axis}", op="gather")
    return TensorType(idx.shape, x.dtype)


def _gather_ref(x: Array, idx: Array, axis: int = 0) -> Array:
    axis %= x.ndim
    sub = x[tuple(slice(None) if d == axis else slice(0, s) for d, s in enumerate(idx.shape))]
    return np.take_along_axis(sub, np.clip(idx, 0, x.shape[axis] - 1).astype(np.int64), axis=axis)


def _infer_index_select(types: list[TensorType], attrs: Attrs) -> TensorType:
    x, idx = types
    _index_dtype("index_select", idx)
    axis = norm_axis("index_select", attrs.get("axis", 0), len(x.shape))
    if len(idx.shape) != 1:
        raise GraphError(f"index_select: index must be 1-D, got shape {idx.shape}", op="index_select")
    return TensorType(x.shape[:axis] + idx.shape + x.shape[axis + 1:], x.dtype)


def _index_select_ref(x: Array, idx: Array, axis: int = 0) -> Array:
    return np.take(x, np.clip(idx, 0, x.shape[axis] - 1).astype(np.int64), axis=axis)


def _infer_scatter(types: list[TensorType], attrs: Attrs) -> TensorType:
    x, idx, upd = types
    _index_dtype("scatter", idx)
    if upd.dtype is not x.dtype:
        raise GraphError(f"scatter: updates are {upd.dtype} but the input is {x.dtype}; insert a cast",
                         op="scatter")
    axis = norm_axis("scatter", attrs.get("axis", 0), len(x.shape))
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


def _scatter_ref(x: Array, idx: Array, upd: Array, axis: int = 0, mode: str = "add") -> Array:
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


register(OpDef("gather", "indexed", 2, _infer_gather, _gather_ref, attrs=("axis",)))
register(OpDef("index_select", "indexed", 2, _infer_index_select, _index_select_ref, attrs=("axis",)))
register(OpDef("scatter", "indexed", 3, _infer_scatter, _scatter_ref, attrs=("axis", "mode")))
