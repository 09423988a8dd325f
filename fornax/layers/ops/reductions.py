"""Reductions along one axis: ``reduce_sum``/``reduce_max``/``reduce_min``, ``argmax``/``argmin``,
and the composites ``reduce_mean`` and ``var``.

Every reduction takes ``axis`` (default -1) and ``keepdims`` (default True).
``argmax``/``argmin`` give the int64 index of the first extreme element;
``var`` has Bessel's correction (torch.var's ``correction``, default 1).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..errors import GraphError
from ..ir import DType, TensorType, Value
from .registry import Array, Attrs, GraphBuilder, OpDef, float_only, norm_axis, register

#: a numpy reduction: (array, axis=, keepdims=) -> array
_Reducer = Callable[..., Array]


def reduced_type(name: str, types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    """The type of reducing ``types[0]`` along ``attrs['axis']`` (keepdims by default)."""
    t = types[0]
    if t.dtype is DType.BOOL:
        raise GraphError(f"{name}: cannot reduce a bool tensor", op=name)
    axis = norm_axis(name, attrs.get("axis", -1), len(t.shape))
    keep = attrs.get("keepdims", True)
    shape = list(t.shape)
    if keep:
        shape[axis] = 1
    else:
        del shape[axis]
    return TensorType(tuple(shape), t.dtype)


def _reduce(name: str, ref: _Reducer) -> None:
    def infer(types: list[TensorType], attrs: Attrs) -> TensorType:
        return reduced_type(name, types, attrs)

    def reference(x: Array, axis: int = -1, keepdims: bool = True) -> Array:
        return ref(x, axis=axis, keepdims=keepdims)
    register(OpDef(name, "reduce", 1, infer, reference, attrs=("axis", "keepdims")))


_reduce("reduce_sum", np.sum)
_reduce("reduce_max", np.max)
_reduce("reduce_min", np.min)


def _arg_reduce(name: str, ref: _Reducer) -> None:
    """argmax / argmin along one axis: the int64 index of the first extreme element."""
    def infer(types: list[TensorType], attrs: Attrs) -> TensorType:
        return TensorType(reduced_type(name, types, attrs).shape, DType.INT64)

    def reference(x: Array, axis: int = -1, keepdims: bool = True) -> Array:
        return ref(x, axis=axis, keepdims=keepdims).astype(np.int64)
    register(OpDef(name, "reduce", 1, infer, reference, attrs=("axis", "keepdims")))


_arg_reduce("argmax", np.argmax)
_arg_reduce("argmin", np.argmin)


def _mean_decompose(g: GraphBuilder, inputs: Sequence[Value], attrs: Attrs) -> Value:
    (x,) = inputs
    axis = attrs.get("axis", -1)
    s = g.op("reduce_sum", x, axis=axis, keepdims=attrs.get("keepdims", True))
    n = x.shape[axis % len(x.shape)]
    return g.op("mul", s, g.constant(np.array(1.0 / n, dtype=x.dtype.numpy), "inv_n"))


def _infer_mean(types: list[TensorType], attrs: Attrs) -> TensorType:
    float_only("reduce_mean", types[0].dtype)
    return reduced_type("reduce_mean", types, attrs)


def _mean_ref(x: Array, axis: int = -1, keepdims: bool = True) -> Array:
    out: Array = np.mean(x, axis=axis, keepdims=keepdims)
    return out


register(OpDef("reduce_mean", "composite", 1, _infer_mean, _mean_ref, _mean_decompose,
               attrs=("axis", "keepdims")))


def _infer_var(types: list[TensorType], attrs: Attrs) -> TensorType:
    (t,) = types
    float_only("var", t.dtype)
    out = reduced_type("var", types, attrs)
    corr = attrs.get("correction", 1)
    if isinstance(corr, bool) or not isinstance(corr, int) or corr < 0:
        raise GraphError(f"var: correction must be a non-negative int, got {corr!r}", op="var")
    n = t.shape[attrs.get("axis", -1) % len(t.shape)]
    if n - corr <= 0:
        raise GraphError(f"var: correction {corr} leaves no degrees of freedom along an axis of "
                         f"size {n}", op="var", hint="use correction=0 (population variance)")
    return out


def _var_decompose(g: GraphBuilder, inputs: Sequence[Value], attrs: Attrs) -> Value:
    (x,) = inputs
    axis = attrs.get("axis", -1)
    n = x.shape[axis % len(x.shape)]
    mean = g.op("reduce_mean", x, axis=axis, keepdims=True)
    d = g.op("sub", x, mean)
    s = g.op("reduce_sum", g.op("mul", d, d), axis=axis, keepdims=attrs.get("keepdims", True))
    return g.op("mul", s, g.constant(np.array(1.0 / (n - attrs.get("correction", 1)),
                                              dtype=x.dtype.numpy), "inv_dof"))


def _var_ref(x: Array, axis: int = -1, keepdims: bool = True, correction: int = 1) -> Array:
    out: Array = np.var(x, axis=axis, keepdims=keepdims, ddof=correction)
    return out


# variance along one axis with Bessel's correction (torch.var's ``correction``, default 1)
register(OpDef("var", "composite", 1, _infer_var, _var_ref, _var_decompose,
               attrs=("axis", "keepdims", "correction")))
