"""Scaled dot-product ``attention`` (a composite), with an optional causal mask.

``attention(q, k, v)`` takes q ``(..., Sq, D)``, k ``(..., Sk, D)`` and v
``(..., Sk, Dv)`` with equal leading dims and gives ``(..., Sq, Dv)``;
``scale`` defaults to ``1/sqrt(D)``; ``causal`` lets query ``i`` see keys
``j <= i`` (the top-left aligned mask of PyTorch's ``is_causal``).  It
decomposes into matmuls, a softmax and, when causal, a ``where``; a
compiler may instead route it to the library.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import GraphError
from ..ir import TensorType, Value
from .normalization import softmax_decompose
from .registry import (Array, Attrs, GraphBuilder, OpDef, float_only, register, reshape, same_dtype,
                       scalar)


def _infer_attention(types: list[TensorType], attrs: Attrs) -> TensorType:
    q, k, v = types
    dt = same_dtype("attention", types)
    float_only("attention", dt)
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


def _causal_mask(sq: int, sk: int) -> Array:
    """Query i sees keys j <= i (the top-left aligned mask of PyTorch's ``is_causal``)."""
    return np.arange(sk)[None, :] <= np.arange(sq)[:, None]


def _attention_ref(q: Array, k: Array, v: Array, causal: bool = False, scale: float | None = None) -> Array:
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if causal:
        s = np.where(_causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    out: Array = np.matmul(p / p.sum(axis=-1, keepdims=True), v)
    return out


def _attention_decompose(g: GraphBuilder, inputs: Sequence[Value], attrs: Attrs) -> Value:
    q, k, v = inputs
    lead = q.shape[:-2]
    nb = math.prod(lead)
    sq, d, sk, dv = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    q3, k3, v3 = (reshape(g, t, (nb,) + t.shape[-2:]) for t in (q, k, v))
    kt = g.op("transpose", k3, perm=(0, 2, 1))
    scale = attrs.get("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    s = g.op("mul", g.op("matmul", q3, kt), scalar(g, scale, q.dtype, "scale"))
    if attrs.get("causal", False):
        mask = g.constant(_causal_mask(sq, sk), "causal")
        s = g.op("where", mask, s, scalar(g, -np.inf, q.dtype, "neg_inf"))
    p = softmax_decompose(g, [s], {"axis": -1})
    return reshape(g, g.op("matmul", p, v3), lead + (sq, dv))


register(OpDef("attention", "composite", 3, _infer_attention, _attention_ref, _attention_decompose,
               attrs=("causal", "scale")))
