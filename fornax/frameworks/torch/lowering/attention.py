"""Attention lowerings: ``_scaled_dot_product_flash_attention_for_cpu`` and its backward."""

from __future__ import annotations

import math

import numpy as np

from fornax.layers.graph import DType
from fornax.frameworks.builders import reshape as _reshape

from .axes import ndim, sum_dims
from .comparison import inf_mask
from .promotion import opmath
from .shape import unsqueeze
from .table import lowering


def _bmm(ctx, a, b, ca, cb):
    """Contract dim ``ca`` of a with ``cb`` of b, batching over every leading dim but the last two."""
    r = ndim(a)
    batch = tuple(range(r - 2))
    return ctx.op("dot_general", a, b, lhs_contracting=(ca,), rhs_contracting=(cb,), lhs_batch=batch,
                  rhs_batch=batch)


def _attn_scores(ctx, q, k, is_causal, attn_mask, scale):
    r = ndim(q)
    s = ctx.op("mul", _bmm(ctx, q, k, r - 1, r - 1), ctx.scalar(scale, q.dtype))      # (..., L, S)
    L, S = s.shape[-2:]
    if is_causal:
        s = ctx.op("where", ctx.const(np.tril(np.ones((L, S), dtype=bool)), "causal"), s,
                   ctx.scalar(-math.inf, q.dtype))
    if attn_mask is not None:
        if attn_mask.dtype is DType.BOOL:
            s = ctx.op("where", attn_mask, s, ctx.scalar(-math.inf, q.dtype))
        else:
            s = ctx.op("add", s, ctx.cast(attn_mask, q.dtype))
    return s


def _attn_setup(ctx, query, key, value, dropout_p, scale):
    if dropout_p:
        raise ctx.fail(f"attention dropout (p={dropout_p}) draws random numbers; not lowered")
    if tuple(query.shape[:-2]) != tuple(key.shape[:-2]) or tuple(key.shape[:-2]) != tuple(value.shape[:-2]):
        raise ctx.fail(f"attention with differing batch/head dims (grouped-query: {query.shape}, {key.shape}, "
                       f"{value.shape}) is not lowered")
    dt = opmath(query.dtype)
    q, k, v = (ctx.cast(t, dt) for t in (query, key, value))
    return q, k, v, (1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale))


@lowering("aten::_scaled_dot_product_flash_attention_for_cpu.default")
def sdpa_flash_cpu(ctx, query, key, value, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    """The output through the graph's ``attention`` op when there is no explicit mask; the
    log-sum-exp of the scaled scores beside it (dead code when nothing uses it)."""
    q, k, v, sc = _attn_setup(ctx, query, key, value, dropout_p, scale)
    s = _attn_scores(ctx, q, k, is_causal, attn_mask, sc)
    r = ndim(s)
    m = ctx.op("reduce_max", s, axis=r - 1, keepdims=True)
    m0 = ctx.op("where", inf_mask(ctx, m), ctx.scalar(0, q.dtype), m)
    lse = ctx.op("add", ctx.op("log", sum_dims(ctx, ctx.op("exp", ctx.op("sub", s, m0)), [r - 1])), m0)
    if attn_mask is None:
        out = ctx.op("attention", q, k, v, causal=bool(is_causal), scale=sc)
    else:
        out = _bmm(ctx, ctx.op("softmax", s, axis=r - 1), v, r - 1, r - 2)
    return out, _reshape(ctx, lse, s.shape[:-1])


@lowering("aten::_scaled_dot_product_flash_attention_for_cpu_backward.default")
def sdpa_flash_cpu_backward(ctx, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
                            attn_mask=None, scale=None):
    q, k, v, sc = _attn_setup(ctx, query, key, value, dropout_p, scale)
    if tuple(logsumexp.shape) != tuple(query.shape[:-1]):
        raise ctx.fail(f"logsumexp has shape {tuple(logsumexp.shape)}, the forward gives {tuple(query.shape[:-1])} "
                       "(the core ATen decomposition of the CPU flash attention forward passes a different "
                       "tensor to this backward; keep the forward op undecomposed)")
    dt = q.dtype
    do, o = ctx.cast(grad_out, dt), ctx.cast(out, dt)
    s = _attn_scores(ctx, q, k, is_causal, attn_mask, sc)
    r = ndim(s)
    p = ctx.op("exp", ctx.op("sub", s, unsqueeze(ctx, ctx.cast(logsumexp, dt), r - 1)))   # (..., L, S)
    dv = _bmm(ctx, p, do, r - 2, r - 2)                                                     # (..., S, Ev)
    dp = _bmm(ctx, do, v, r - 1, r - 1)                                                     # (..., L, S)
    delta = sum_dims(ctx, ctx.op("mul", do, o), [r - 1])
    ds = ctx.op("mul", ctx.op("mul", p, ctx.op("sub", dp, delta)), ctx.scalar(sc, dt))
    dq = _bmm(ctx, ds, k, r - 1, r - 2)                                                     # (..., L, E)
    dk = _bmm(ctx, ds, q, r - 2, r - 2)                                                     # (..., S, E)
    return dq, dk, dv
