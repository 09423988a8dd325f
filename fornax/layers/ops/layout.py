"""Layout ops: ``reshape``, ``transpose``, ``broadcast_to``, ``slice``, ``concat`` and ``pad``.

They move or copy elements without arithmetic.  :func:`slice_bounds` and
:func:`pad_widths` normalise a slice's and a pad's attributes; code
generators use them too.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import GraphError
from ..ir import TensorType
from .registry import Array, Attrs, OpDef, int_tuple, norm_axis, register, same_dtype


def _infer_reshape(types: list[TensorType], attrs: Attrs) -> TensorType:
    (t,) = types
    target = attrs.get("shape")
    if not isinstance(target, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                        for d in target):
        raise GraphError(f"reshape: shape must be a tuple of ints, got {target!r}", op="reshape")
    shape: tuple[int, ...] = tuple(target)
    if shape.count(-1) > 1 or any(d == 0 or d < -1 for d in shape):
        raise GraphError(f"reshape: bad target shape {shape} (positive sizes, at most one -1)",
                         op="reshape")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if t.numel % known:
            raise GraphError(f"reshape: cannot infer -1 in {shape} from {t.numel} elements", op="reshape")
        shape = tuple(t.numel // known if d == -1 else d for d in shape)
    if math.prod(shape) != t.numel:
        raise GraphError(f"reshape: cannot reshape {t.shape} ({t.numel} elements) to {shape} "
                         f"({math.prod(shape)} elements)", op="reshape")
    return TensorType(shape, t.dtype)


register(OpDef("reshape", "layout", 1, _infer_reshape,
               lambda x, shape: np.reshape(x, tuple(shape)), attrs=("shape",)))


def _infer_transpose(types: list[TensorType], attrs: Attrs) -> TensorType:
    (t,) = types
    rank = len(t.shape)
    perm = attrs.get("perm")
    if perm is None:
        perm = tuple(reversed(range(rank)))
    if not isinstance(perm, (tuple, list)) or sorted(perm) != list(range(rank)):
        raise GraphError(f"transpose: perm {perm!r} is not a permutation of 0..{rank - 1} "
                         f"for shape {t.shape}", op="transpose")
    return TensorType(tuple(t.shape[p] for p in perm), t.dtype)


def _transpose_ref(x: Array, perm: Sequence[int] | None = None) -> Array:
    return np.transpose(x, None if perm is None else tuple(perm))


register(OpDef("transpose", "layout", 1, _infer_transpose, _transpose_ref, attrs=("perm",)))


def _infer_broadcast_to(types: list[TensorType], attrs: Attrs) -> TensorType:
    (t,) = types
    shape = attrs.get("shape")
    if not isinstance(shape, (tuple, list)) or not all(isinstance(d, int) and d > 0 for d in shape):
        raise GraphError(f"broadcast_to: shape must be a tuple of positive ints, got {shape!r}",
                         op="broadcast_to")
    out: tuple[int, ...] | None
    try:
        out = np.broadcast_shapes(t.shape, tuple(shape))
    except ValueError:
        out = None
    if out != tuple(shape):
        raise GraphError(f"broadcast_to: {t.shape} does not broadcast to {tuple(shape)}",
                         op="broadcast_to")
    return TensorType(tuple(shape), t.dtype)


register(OpDef("broadcast_to", "layout", 1, _infer_broadcast_to,
               lambda x, shape: np.broadcast_to(x, tuple(shape)).copy(), attrs=("shape",)))


def slice_bounds(shape: tuple[int, ...], attrs: Attrs) -> list[tuple[int, int, int]]:
    """Normalised (start, stop, step) per dim of a slice; negative start/stop count from the end."""
    rank = len(shape)
    start = int_tuple("slice", "start", attrs.get("start", (0,) * rank), rank)
    stop = int_tuple("slice", "stop", attrs.get("stop", shape), rank)
    step = int_tuple("slice", "step", attrs.get("step", (1,) * rank), rank)
    out = []
    for d, (a, b, s, n) in enumerate(zip(start, stop, step, shape)):
        if s <= 0:
            raise GraphError(f"slice: step {s} in dim {d} must be positive", op="slice")
        a2, b2 = a + n if a < 0 else a, b + n if b < 0 else b
        if not 0 <= a2 < b2 <= n:
            raise GraphError(f"slice: [{a}:{b}] in dim {d} is out of range or empty for size {n}",
                             op="slice", hint=f"need -{n} <= start < stop <= {n} after counting "
                                              "negatives from the end")
        out.append((a2, b2, s))
    return out


def _infer_slice(types: list[TensorType], attrs: Attrs) -> TensorType:
    (t,) = types
    bounds = slice_bounds(t.shape, attrs)
    return TensorType(tuple(-(-(b - a) // s) for a, b, s in bounds), t.dtype)


def _slice_ref(x: Array, start: Sequence[int] | None = None, stop: Sequence[int] | None = None,
               step: Sequence[int] | None = None) -> Array:
    bounds = slice_bounds(x.shape, {"start": start or (0,) * x.ndim, "stop": stop or x.shape,
                                    "step": step or (1,) * x.ndim})
    return x[tuple(slice(a, b, s) for a, b, s in bounds)].copy()


register(OpDef("slice", "layout", 1, _infer_slice, _slice_ref, attrs=("start", "stop", "step")))


def _infer_concat(types: list[TensorType], attrs: Attrs) -> TensorType:
    if not types:
        raise GraphError("concat: needs at least one operand", op="concat")
    first = types[0]
    axis = norm_axis("concat", attrs.get("axis", 0), len(first.shape))
    dt = same_dtype("concat", types)
    for i, t in enumerate(types[1:], 1):
        if len(t.shape) != len(first.shape) or any(a != b for d, (a, b) in enumerate(
                zip(t.shape, first.shape)) if d != axis):
            raise GraphError(f"concat: operand {i} has shape {t.shape}, operand 0 {first.shape}; "
                             f"they must agree in every dim but axis {axis}", op="concat")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return TensorType(tuple(shape), dt)


register(OpDef("concat", "layout", -1, _infer_concat,
               lambda *xs, axis=0: np.concatenate(xs, axis=axis), attrs=("axis",), promote="all"))


def pad_widths(shape: tuple[int, ...], attrs: Attrs) -> list[tuple[int, int]]:
    """The checked (before, after) padding of each dim of a ``pad`` of a tensor of ``shape``."""
    pads = attrs.get("pads")
    if not isinstance(pads, (tuple, list)) or len(pads) != len(shape) or not all(
            isinstance(p, (tuple, list)) and len(p) == 2 and all(
                isinstance(q, int) and not isinstance(q, bool) for q in p) for p in pads):
        raise GraphError(f"pad: pads must be one (before, after) pair of ints per dim "
                         f"({len(shape)} pairs), got {pads!r}", op="pad")
    for d, (lo, hi) in enumerate(pads):
        if lo < 0 or hi < 0:
            raise GraphError(f"pad: negative padding ({lo}, {hi}) in dim {d}; use slice to crop",
                             op="pad")
    return [(p[0], p[1]) for p in pads]


def _infer_pad(types: list[TensorType], attrs: Attrs) -> TensorType:
    (t,) = types
    value = attrs.get("value", 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GraphError(f"pad: value must be a number, got {value!r}", op="pad")
    if not t.dtype.is_float and value != int(value):
        raise GraphError(f"pad: value {value} is not representable in {t.dtype}", op="pad")
    return TensorType(tuple(n + lo + hi for n, (lo, hi) in zip(t.shape, pad_widths(t.shape, attrs))),
                      t.dtype)


register(OpDef("pad", "layout", 1, _infer_pad,
               lambda x, pads, value=0.0: np.pad(x, [tuple(p) for p in pads], constant_values=value),
               attrs=("pads", "value")))
