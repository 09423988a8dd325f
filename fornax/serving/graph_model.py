"""fornax's own graph decoder: the served Llama written in fornax's graph IR, each piece
compiled whole by the stack's compiler and run on device-resident buffers.

Where :class:`~fornax.serving.runner.PagedModel` runs the ``transformers`` modules op by op
on ``torch.device("fornax")`` (PyTorch's boundary: one ATen op at a time), this model hands
the compiler whole graphs (the boundary a graph compiler sees: fusion and kernel choice are
its own), with the same weights:

* ``embed``: ``onehot(tokens) @ E`` (the IR has no gather; a one-hot row selects exactly);
* per layer, ``pre``: RMSNorm, the Q/K/V projections and the rotary embedding
  (``q * cos + rotate_half(q) * sin``, ``rotate_half`` as a product with a fixed signed
  permutation, which is exact), giving Q, K and V for the library's paged routines;
* per layer, ``post``: the output projection and residual, RMSNorm, the SwiGLU MLP and
  residual;
* ``head``: the sampled rows (a one-hot selection), the final RMSNorm, the output head and
  the argmax.

Attention itself stays with the library seam (``paged_cache_write`` and
``paged_attention``), as a serving graph compiler calls its attention backend.  Graphs are
built per padded token count (the next power of two, at least 8: padding rows write
nothing and no sequence owns them) and compiled once each; the plans' runs are captured
and replayed (:mod:`fornax.layers.launch_capture`) like any resident plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..frameworks.torch.stream_selection import runtime_stream
from ..frameworks.torch.tensors import address
from ..layers.errors import ConfigError
from ..layers.framework import ResidentPlan
from ..layers.graph import DType, Graph, Value
from .runner import PagedModel

if TYPE_CHECKING:
    from transformers import PreTrainedModel

F32 = DType.FLOAT32


def _pow2(n: int, least: int = 8) -> int:
    return max(least, 1 << max(0, n - 1).bit_length())


class GraphPagedModel(PagedModel):
    """The Llama decoder as graphs compiled by the stack (see the module docstring)."""

    def __init__(self, model: PreTrainedModel, num_blocks: int, block_size: int,
                 num_host_blocks: int = 0):
        super().__init__(model, num_blocks, block_size, num_host_blocks)
        if self.kind != "llama":
            raise ConfigError(f"the graph decoder is written for Llama, not {self.kind!r}",
                              hint="serve --model llama with the graph decoder, or gpt2 through torch")
        m: Any = self.model
        cfg = model.config
        self.eps = float(cfg.rms_norm_eps)
        with torch.no_grad():
            def t(w: torch.Tensor) -> torch.Tensor:      # [out, in] -> [in, out], contiguous
                return w.t().contiguous()
            self.embed = m.model.embed_tokens.weight.contiguous()
            self.layers = [{
                "w_in": layer.input_layernorm.weight, "wq": t(layer.self_attn.q_proj.weight),
                "wk": t(layer.self_attn.k_proj.weight), "wv": t(layer.self_attn.v_proj.weight),
                "wo": t(layer.self_attn.o_proj.weight), "w_post": layer.post_attention_layernorm.weight,
                "wg": t(layer.mlp.gate_proj.weight), "wu": t(layer.mlp.up_proj.weight),
                "wd": t(layer.mlp.down_proj.weight)} for layer in m.model.layers]
            self.w_norm, self.lm = m.model.norm.weight, t(m.lm_head.weight)
        self.plans: dict[tuple[str, int, int], ResidentPlan] = {}
        d = self.shape.head_dim
        rot = np.zeros((d, d), dtype=np.float32)         # x @ rot == rotate_half(x)
        half = d // 2
        for j in range(half):
            rot[j + half, j] = -1.0
            rot[j, j + half] = 1.0
        self.rot = rot

    def _padded(self, tokens: int) -> int:
        return _pow2(tokens)

    # -- graphs --------------------------------------------------------------------------------
    def _rmsnorm(self, g: Graph, x: Value, w: Value) -> Value:
        """LlamaRMSNorm: ``w * (x * rsqrt(mean(x^2) + eps))`` in float32."""
        ms = g.op("reduce_mean", g.op("mul", x, x), axis=-1, keepdims=True)
        r = g.op("rsqrt", g.op("add", ms, g.constant(np.array(self.eps, dtype=np.float32), "eps")))
        return g.op("mul", w, g.op("mul", x, r))

    def _build(self, kind: str, tokens: int, rows: int) -> Graph:
        s, H = self.shape, self.shape.hidden
        nq, nkv, d = s.heads, s.kv_heads, s.head_dim
        g = Graph(f"llama-{kind}-{tokens}")
        if kind == "embed":
            g.output(g.op("matmul", g.input("onehot", (tokens, s.vocab), F32), g.input("E", (s.vocab, H), F32)))
        elif kind == "pre":
            h, w_in = g.input("h", (tokens, H), F32), g.input("w_in", (H,), F32)
            wq, wk, wv = (g.input(n, (H, k * d), F32) for n, k in (("wq", nq), ("wk", nkv), ("wv", nkv)))
            cos, sin = g.input("cos", (tokens, d), F32), g.input("sin", (tokens, d), F32)
            rot = g.constant(self.rot, "rotate_half")
            x = self._rmsnorm(g, h, w_in)

            def rope(y: Value, heads: int) -> Value:
                flat = g.op("reshape", y, shape=(tokens * heads, d))

                def per_head(c: Value) -> Value:
                    c3 = g.op("broadcast_to", g.op("reshape", c, shape=(tokens, 1, d)), shape=(tokens, heads, d))
                    return g.op("reshape", c3, shape=(tokens * heads, d))
                out = g.op("add", g.op("mul", flat, per_head(cos)),
                           g.op("mul", g.op("matmul", flat, rot), per_head(sin)))
                return g.op("reshape", out, shape=(tokens, heads, d))
            q = rope(g.op("matmul", x, wq), nq)
            k = rope(g.op("matmul", x, wk), nkv)
            v = g.op("reshape", g.op("matmul", x, wv), shape=(tokens, nkv, d))
            g.output(q, k, v)
        elif kind == "post":
            h, o = g.input("h", (tokens, H), F32), g.input("o", (tokens, nq * d), F32)
            wo, w_post = g.input("wo", (nq * d, H), F32), g.input("w_post", (H,), F32)
            ffn = self.layers[0]["wg"].shape[1]
            wg, wu = g.input("wg", (H, ffn), F32), g.input("wu", (H, ffn), F32)
            wd = g.input("wd", (ffn, H), F32)
            h1 = g.op("add", h, g.op("matmul", o, wo))
            x = self._rmsnorm(g, h1, w_post)
            mlp = g.op("matmul", g.op("mul", g.op("silu", g.op("matmul", x, wg)), g.op("matmul", x, wu)), wd)
            g.output(g.op("add", h1, mlp))
        else:                                                          # head
            sel, h = g.input("select", (rows, tokens), F32), g.input("h", (tokens, H), F32)
            w, lm = g.input("w_norm", (H,), F32), g.input("lm_head", (H, s.vocab), F32)
            logits = g.op("matmul", self._rmsnorm(g, g.op("matmul", sel, h), w), lm)
            g.output(g.op("argmax", logits, axis=-1, keepdims=False))
        return g

    def _plan(self, kind: str, tokens: int, rows: int = 0) -> ResidentPlan:
        key = (kind, tokens, rows)
        plan = self.plans.get(key)
        if plan is None:
            graph = self._build(kind, tokens, rows)
            fw = self.session.stack.framework
            route = fw.device_route(graph)
            if route is not None:
                raise ConfigError(f"the graph decoder's {kind} graph cannot run on the device: "
                                  f"{route.op} ({route.reason})", hint="serve through the torch model")
            plan = self.plans[key] = fw.prepare(graph, runtime_stream(self.session))
        return plan

    def _run(self, plan: ResidentPlan, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        sess = self.session
        plan([address(t.contiguous(), sess) for t in inputs], [address(t, sess) for t in outputs],
             runtime_stream(sess))

    # -- the model -----------------------------------------------------------------------------
    def _forward(self, meta: dict[str, Any]) -> torch.Tensor:
        s = self.shape
        ids = meta["ids"].cpu()
        tokens = int(ids.shape[0])
        onehot = torch.zeros((tokens, s.vocab), dtype=torch.float32)
        onehot[torch.arange(tokens), ids] = 1.0
        h = torch.empty((tokens, s.hidden), device="fornax")
        self._run(self._plan("embed", tokens), [onehot.to("fornax"), self.embed], [h])
        cos, sin = self.cpu_model.model.rotary_emb(torch.zeros(1), meta["positions"][None])
        cos, sin = cos[0].contiguous().to("fornax"), sin[0].contiguous().to("fornax")
        pre, post = self._plan("pre", tokens), self._plan("post", tokens)
        for i, w in enumerate(self.layers):
            q = torch.empty((tokens, s.heads, s.head_dim), device="fornax")
            k = torch.empty((tokens, s.kv_heads, s.head_dim), device="fornax")
            v = torch.empty((tokens, s.kv_heads, s.head_dim), device="fornax")
            self._run(pre, [h, w["w_in"], w["wq"], w["wk"], w["wv"], cos, sin], [q, k, v])
            o = self._attention(i, q, k, v, meta)
            out = torch.empty_like(h)
            self._run(post, [h, o.view(tokens, -1), w["wo"], w["w_post"], w["wg"], w["wu"], w["wd"]], [out])
            h = out
        return h

    def _sample(self, hidden: torch.Tensor, rows: list[int]) -> list[int]:
        tokens = int(hidden.shape[0])
        padded = _pow2(len(rows), 1)
        sel = torch.zeros((padded, tokens), dtype=torch.float32)
        sel[torch.arange(len(rows)), torch.tensor(rows)] = 1.0
        out = torch.empty((padded,), dtype=torch.int64, device="fornax")
        self._run(self._plan("head", tokens, padded), [sel.to("fornax"), hidden, self.w_norm, self.lm], [out])
        return [int(t) for t in out.cpu().tolist()[:len(rows)]]
