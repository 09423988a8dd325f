"""Workloads built directly in fornax's graph IR (until the front ends land).

Each workload builds a graph and its input feeds from one seed, so every
stack runs the same numbers and the float64 reference is computed from the
same graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..layers.errors import ConfigError
from ..layers.graph import DType, Graph

#: max relative error (normwise: max|y - ref| / max|ref|) accepted per output dtype
TOLERANCE = {
    DType.FLOAT64: 1e-12,
    DType.FLOAT32: 1e-4,
    DType.FLOAT16: 5e-3,
    DType.BFLOAT16: 3e-2,
}


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    build: Callable[[int], tuple[Graph, dict[str, np.ndarray]]] | None
    #: a scenario that drives the stack itself: (stack, seed) -> (RunResult, scenario dict)
    runner: Callable | None = None
    meta_only: bool = False            # needs a shape-only (meta) stack


def _init(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, dtype) -> np.ndarray:
    """Kaiming-uniform-like init, as nn.Linear does."""
    bound = 1.0 / np.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=shape).astype(dtype)


def mlp(seed: int, batch: int = 64, d_in: int = 256, hidden: int = 512, d_out: int = 128,
        dtype: DType = DType.FLOAT32) -> tuple[Graph, dict]:
    """y = relu(x @ W1 + b1) @ W2 + b2."""
    rng = np.random.default_rng(seed)
    np_dt = dtype.numpy
    g = Graph("mlp")
    x = g.input("x", (batch, d_in), dtype)
    w1 = g.constant(_init(rng, (d_in, hidden), d_in, np_dt), "w1")
    b1 = g.constant(_init(rng, (hidden,), d_in, np_dt), "b1")
    w2 = g.constant(_init(rng, (hidden, d_out), hidden, np_dt), "w2")
    b2 = g.constant(_init(rng, (d_out,), hidden, np_dt), "b2")
    h = g.op("relu", g.op("add", g.op("matmul", x, w1), b1))
    g.output(g.op("add", g.op("matmul", h, w2), b2), names=["y"])
    return g, {"x": rng.standard_normal((batch, d_in)).astype(np_dt)}


def softmax(seed: int, rows: int = 256, cols: int = 1000, dtype: DType = DType.FLOAT32):
    """Row softmax over logits of a classifier-sized vocabulary."""
    rng = np.random.default_rng(seed)
    g = Graph("softmax")
    x = g.input("logits", (rows, cols), dtype)
    g.output(g.op("softmax", x, axis=-1), names=["probs"])
    return g, {"logits": (3 * rng.standard_normal((rows, cols))).astype(dtype.numpy)}


def mlp_softmax(seed: int) -> tuple[Graph, dict]:
    """The MLP followed by a softmax head: GEMMs, a fused epilogue and a fused row reduction."""
    g, feeds = mlp(seed)
    (logits,) = g.outputs
    g.outputs.clear()
    g.output(g.op("softmax", logits, axis=-1), names=["probs"])
    g.name = "mlp-softmax"
    return g, feeds


def _rms_norm(g: Graph, x, gain, eps):
    """RMSNorm from primitives: x * rsqrt(mean(x * x) + eps) * gain."""
    ms = g.op("reduce_mean", g.op("mul", x, x), axis=-1, keepdims=True)
    return g.op("mul", g.op("mul", x, g.op("rsqrt", g.op("add", ms, eps))), gain)


def transformer_block(seed: int, seq: int = 64, d_model: int = 256, heads: int = 4,
                      d_ff: int = 512, dtype: DType = DType.FLOAT32) -> tuple[Graph, dict]:
    """A pre-norm transformer block: x + attn(rms(x)), then h + swiglu(rms(h)).

    Attention runs on [heads, seq, head_dim] tensors (reshape + transpose of the
    projections, scores = q @ k^T / sqrt(head_dim), softmax, @ v); the MLP is
    SwiGLU: (silu(h @ W1) * (h @ W3)) @ W2, silu(a) = a * sigmoid(a)."""
    rng = np.random.default_rng(seed)
    np_dt = dtype.numpy
    hd = d_model // heads
    g = Graph("transformer-block")
    x = g.input("x", (seq, d_model), dtype)
    eps = g.constant(np.array(1e-5, np_dt), "eps")
    w = {name: g.constant(_init(rng, shape, shape[0], np_dt), name) for name, shape in (
        ("wq", (d_model, d_model)), ("wk", (d_model, d_model)), ("wv", (d_model, d_model)),
        ("wo", (d_model, d_model)), ("w1", (d_model, d_ff)), ("w3", (d_model, d_ff)),
        ("w2", (d_ff, d_model)))}
    g1 = g.constant((1 + 0.1 * rng.standard_normal(d_model)).astype(np_dt), "norm1")
    g2 = g.constant((1 + 0.1 * rng.standard_normal(d_model)).astype(np_dt), "norm2")
    scale = g.constant(np.array(1 / np.sqrt(hd), np_dt), "scale")

    def split_heads(v):                       # [seq, d] -> [heads, seq, hd]
        return g.op("transpose", g.op("reshape", v, shape=(seq, heads, hd)), perm=(1, 0, 2))

    h = _rms_norm(g, x, g1, eps)
    q = split_heads(g.op("matmul", h, w["wq"]))
    k = split_heads(g.op("matmul", h, w["wk"]))
    v = split_heads(g.op("matmul", h, w["wv"]))
    scores = g.op("mul", g.op("matmul", q, g.op("transpose", k, perm=(0, 2, 1))), scale)
    attn = g.op("matmul", g.op("softmax", scores, axis=-1), v)                 # [heads, seq, hd]
    merged = g.op("reshape", g.op("transpose", attn, perm=(1, 0, 2)), shape=(seq, d_model))
    h1 = g.op("add", x, g.op("matmul", merged, w["wo"]))
    n2 = _rms_norm(g, h1, g2, eps)
    a = g.op("matmul", n2, w["w1"])
    gate = g.op("mul", g.op("mul", a, g.op("sigmoid", a)), g.op("matmul", n2, w["w3"]))
    g.output(g.op("add", h1, g.op("matmul", gate, w["w2"])), names=["y"])
    return g, {"x": rng.standard_normal((seq, d_model)).astype(np_dt)}


WORKLOADS: dict[str, Workload] = {
    w.name: w for w in (
        Workload("mlp", "MLP 256-512-128: matmul + bias + relu + matmul + bias (float32)", mlp),
        Workload("mlp-bf16", "the same MLP in bfloat16 (fp32 accumulation)",
                 lambda seed: mlp(seed, dtype=DType.BFLOAT16)),
        Workload("softmax", "row softmax over 256 x 1000 logits (float32)", softmax),
        Workload("mlp-softmax", "the MLP with a softmax head (float32)", mlp_softmax),
        Workload("transformer-block", "pre-norm transformer block: RMSNorm, 4-head attention, "
                 "SwiGLU MLP, residuals; seq 64, d_model 256 (float32)", transformer_block),
        Workload("llama70b-step", "one training step (forward, loss, backward) of a Llama-2-70B-like "
                 "decoder, seq 4096, tensor-parallel over the stack's devices (shape-only)",
                 None, runner=lambda stack, seed: _llama_step(stack, seed), meta_only=True),
    )
}


def _llama_step(stack, seed: int):
    from .llm import simulate_step
    report, _, result = simulate_step(stack=stack, seed=seed)
    return result, report.to_dict()
DEFAULT_WORKLOAD = "mlp"


def get_workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ConfigError(f"unknown workload {name!r}; available: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]


def numerics(graph: Graph, outputs: list[np.ndarray], feeds: dict) -> list[dict]:
    """Each output against the float64 reference of the same graph."""
    refs = graph.reference(feeds)
    rows = []
    for v, got, ref in zip(graph.outputs, outputs, refs):
        diff = np.abs(got.astype(np.float64) - ref)
        max_abs = float(diff.max()) if diff.size else 0.0
        scale = float(np.abs(ref).max()) if ref.size else 0.0
        max_rel = max_abs / scale if scale > 0 else max_abs
        tol = TOLERANCE.get(v.dtype, 0.0)
        finite = bool(np.isfinite(got.astype(np.float64)).all())
        rows.append({"output": v.name, "dtype": v.dtype.value, "shape": list(v.shape),
                     "max_abs_err": max_abs, "max_rel_err": max_rel, "tol": tol,
                     "ok": finite and max_rel <= tol})
    return rows
