"""Normalisations (composites): ``softmax`` and ``log_softmax`` along one axis, ``layer_norm``
and ``rms_norm`` over the last axis.

Each has a decomposition into primitives (reductions and elementwise ops),
which a compiler may instead route to the library.  ``layer_norm(x, w, b)``
and ``rms_norm(x, w)`` take ``eps`` (default 1e-5); ``w`` and ``b`` have
the shape of ``x``'s last dim.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import GraphError
from ..ir import TensorType, Value
from .registry import (Array, Attrs, GraphBuilder, OpDef, float_only, norm_axis, register,
                       same_dtype, scalar)


# ---- softmax and log_softmax ---------------------------------------------------------------
def _softmax_ref(x: Array, axis: int = -1) -> Array:
    z = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(z)
    out: Array = e / np.sum(e, axis=axis, keepdims=True)
    return out


def softmax_decompose(g: GraphBuilder, inputs: Sequence[Value], attrs: Attrs) -> Value:
    """``exp(x - max(x)) / sum(exp(x - max(x)))`` along ``attrs['axis']`` (default -1)."""
    (x,) = inputs
    axis = attrs.get("axis", -1)
    m = g.op("reduce_max", x, axis=axis, keepdims=True)
    e = g.op("exp", g.op("sub", x, m))
    return g.op("div", e, g.op("reduce_sum", e, axis=axis, keepdims=True))


def _infer_softmax(types: list[TensorType], attrs: Attrs) -> TensorType:
    float_only("softmax", types[0].dtype)
    norm_axis("softmax", attrs.get("axis", -1), len(types[0].shape))
    return types[0]


register(OpDef("softmax", "composite", 1, _infer_softmax, _softmax_ref, softmax_decompose,
               attrs=("axis",)))


def _log_softmax_ref(x: Array, axis: int = -1) -> Array:
    z = x - np.max(x, axis=axis, keepdims=True)
    out: Array = z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))
    return out


def _log_softmax_decompose(g: GraphBuilder, inputs: Sequence[Value], attrs: Attrs) -> Value:
    (x,) = inputs
    axis = attrs.get("axis", -1)
    z = g.op("sub", x, g.op("reduce_max", x, axis=axis, keepdims=True))
    return g.op("sub", z, g.op("log", g.op("reduce_sum", g.op("exp", z), axis=axis, keepdims=True)))


def _infer_log_softmax(types: list[TensorType], attrs: Attrs) -> TensorType:
    float_only("log_softmax", types[0].dtype)
    norm_axis("log_softmax", attrs.get("axis", -1), len(types[0].shape))
    return types[0]


register(OpDef("log_softmax", "composite", 1, _infer_log_softmax, _log_softmax_ref,
               _log_softmax_decompose, attrs=("axis",)))


# ---- layer_norm and rms_norm ---------------------------------------------------------------
def _eps(op: str, attrs: Attrs) -> float:
    eps = attrs.get("eps", 1e-5)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise GraphError(f"{op}: eps must be a non-negative number, got {eps!r}", op=op)
    return float(eps)


def _infer_norm(op: str, types: list[TensorType], attrs: Attrs) -> TensorType:
    x = types[0]
    dt = same_dtype(op, types)
    float_only(op, dt)
    _eps(op, attrs)
    for t in types[1:]:
        if t.shape != (x.shape[-1],):
            raise GraphError(f"{op}: weight/bias must have shape ({x.shape[-1]},) (the last dim of "
                             f"{x.shape}), got {t.shape}", op=op)
    return x


def _layer_norm_ref(x: Array, w: Array, b: Array, eps: float = 1e-5) -> Array:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    out: Array = (x - mu) / np.sqrt(var + eps) * w + b
    return out


def _rms_norm_ref(x: Array, w: Array, eps: float = 1e-5) -> Array:
    out: Array = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w
    return out


def _mean_last(g: GraphBuilder, x: Value) -> Value:
    s = g.op("reduce_sum", x, axis=-1, keepdims=True)
    return g.op("mul", s, scalar(g, 1.0 / x.shape[-1], x.dtype, "inv_n"))


def _layer_norm_decompose(g: GraphBuilder, inputs: Sequence[Value], attrs: Attrs) -> Value:
    x, w, b = inputs
    d = g.op("sub", x, _mean_last(g, x))
    var = _mean_last(g, g.op("mul", d, d))
    r = g.op("rsqrt", g.op("add", var, scalar(g, _eps("layer_norm", attrs), x.dtype, "eps")))
    return g.op("add", g.op("mul", g.op("mul", d, r), w), b)


def _rms_norm_decompose(g: GraphBuilder, inputs: Sequence[Value], attrs: Attrs) -> Value:
    x, w = inputs
    ms = _mean_last(g, g.op("mul", x, x))
    r = g.op("rsqrt", g.op("add", ms, scalar(g, _eps("rms_norm", attrs), x.dtype, "eps")))
    return g.op("mul", g.op("mul", x, r), w)


register(OpDef("layer_norm", "composite", 3, lambda t, a: _infer_norm("layer_norm", t, a), _layer_norm_ref,
               _layer_norm_decompose, attrs=("eps",)))
register(OpDef("rms_norm", "composite", 2, lambda t, a: _infer_norm("rms_norm", t, a), _rms_norm_ref,
               _rms_norm_decompose, attrs=("eps",)))
