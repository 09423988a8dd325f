"""The model runner: one scheduled step of a ``transformers`` decoder on the fornax device,
over a paged KV cache in device memory.

The model's own modules run on ``fornax`` tensors (embeddings, norms, projections, the MLP,
the output head: eager ops through all five seams).  Attention is where serving differs
from training, and there the runner calls the stack's library seam directly, as vLLM calls
its attention backend:

* ``paged_cache_write`` puts the step's new keys and values into their cache slots
  (vLLM's ``reshape_and_cache``);
* ``paged_attention`` computes the attention of every query row -- a prefill chunk's rows
  or a decode's one row -- over its sequence's blocks, read through the block table.

A step's tokens are packed into one batch: sequence after sequence, each with the tokens it
computes this step.  Only the rows that produce a token (a decode, or a prompt's last
chunk) go through the output head, and the next token is the argmax of its logits (greedy
decoding), read back to the host once per step.

The cache is one K and one V tensor per layer, ``[blocks, block_size, kv_heads, head_dim]``;
preemption by swapping copies whole blocks to and from a host-side mirror of the same shape.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from ..frameworks.torch import session as _session
from ..frameworks.torch.stream_selection import runtime_stream
from ..frameworks.torch.tensors import address
from ..layers.errors import ConfigError
from .models import DecoderShape, shape_of
from .scheduler import Step

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class PagedModel:
    """A decoder's weights on the fornax device and its paged KV cache."""

    def __init__(self, model: PreTrainedModel, num_blocks: int, block_size: int,
                 num_host_blocks: int = 0):
        self.shape: DecoderShape = shape_of(model)
        self.kind = model.config.model_type
        self.num_blocks, self.block_size = int(num_blocks), int(block_size)
        #: block-table width: every position the model can address
        self.max_blocks = -(-self.shape.max_positions // self.block_size)
        self.session = _session.current()
        self.library = self.session.stack.library
        self.cpu_model = model
        self.model = copy.deepcopy(model)
        with torch.no_grad():
            torch.nn.Module.to(self.model, torch.device("fornax"))
        s = self.shape
        dims = (self.num_blocks, self.block_size, s.kv_heads, s.head_dim)
        host = (int(num_host_blocks), self.block_size, s.kv_heads, s.head_dim)
        self.key_cache = [torch.zeros(dims, device="fornax") for _ in range(s.layers)]
        self.value_cache = [torch.zeros(dims, device="fornax") for _ in range(s.layers)]
        self.host_key = [torch.zeros(host) for _ in range(s.layers)]
        self.host_value = [torch.zeros(host) for _ in range(s.layers)]

    @property
    def cache_bytes(self) -> int:
        """Device bytes the K/V cache takes."""
        return self.num_blocks * self.block_size * self.shape.kv_bytes_per_token

    # -- one step ------------------------------------------------------------------------------
    def _padded(self, tokens: int) -> int:
        """The token count a step of ``tokens`` tokens runs with (here: no padding)."""
        return tokens

    def execute(self, step: Step) -> dict[str, int]:
        """Run ``step`` (swaps first); the greedy next token of every sequence it samples."""
        self._swap(step)
        if not step.items:
            return {}
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        lens: list[int] = []
        tables: list[list[int]] = []
        rows: list[int] = []
        sampled: list[str] = []
        max_q = 0
        for seq, n in step.items:
            first = seq.num_computed
            if first + n > self.shape.max_positions:
                raise ConfigError(f"request {seq.id}: {first + n} tokens exceed the model's "
                                  f"{self.shape.max_positions} positions",
                                  hint="shorten the prompt or max_new_tokens")
            ids.extend(seq.tokens[first:first + n])
            for p in range(first, first + n):
                positions.append(p)
                slots.append(seq.block_table[p // self.block_size] * self.block_size + p % self.block_size)
            starts.append(starts[-1] + n)
            lens.append(first + n)
            tables.append(list(seq.block_table) + [0] * (self.max_blocks - len(seq.block_table)))
            max_q = max(max_q, n)
            if step.samples(seq, n):
                rows.append(starts[-1] - 1)
                sampled.append(seq.id)
        # padding rows (a plan compiled per padded size serves every step of that size): token
        # 0 at position 0, a negative slot (nothing written), no sequence owns them
        pad = self._padded(len(ids)) - len(ids)
        ids, positions, slots = ids + [0] * pad, positions + [0] * pad, slots + [-1] * pad
        with torch.no_grad():
            meta = {
                "ids": torch.tensor(ids, dtype=torch.int64).to("fornax"),
                "slots": torch.tensor(slots, dtype=torch.int64).to("fornax"),
                "query_start": torch.tensor(starts, dtype=torch.int32).to("fornax"),
                "seq_lens": torch.tensor(lens, dtype=torch.int32).to("fornax"),
                "block_tables": torch.tensor(tables, dtype=torch.int32).to("fornax"),
                "positions": torch.tensor(positions, dtype=torch.int64),
                "num_seqs": len(lens), "max_query_len": max_q,
            }
            hidden = self._forward(meta)
            if not rows:
                return {}
            tokens = self._sample(hidden, rows)
        return dict(zip(sampled, tokens))

    def _sample(self, hidden: torch.Tensor, rows: list[int]) -> list[int]:
        """The greedy next token of each row ``rows`` of the residual stream ``hidden``: the
        final norm, the output head, the argmax (read back to the host once)."""
        m: Any = self.model
        norm = m.model.norm if self.kind == "llama" else m.transformer.ln_f
        picked = hidden.index_select(0, torch.tensor(rows, dtype=torch.int64).to("fornax"))
        return [int(t) for t in m.lm_head(norm(picked)).argmax(dim=-1).cpu().tolist()]

    def _forward(self, meta: dict[str, Any]) -> torch.Tensor:
        """The residual stream of every token of the step after the last layer, ``[tokens, hidden]``."""
        m: Any = self.model              # a transformers model: its submodules by attribute
        if self.kind == "llama":
            h = m.model.embed_tokens(meta["ids"])
            cos, sin = self.cpu_model.model.rotary_emb(torch.zeros(1), meta["positions"][None])
            cos, sin = cos[0].to("fornax"), sin[0].to("fornax")
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
            for i, layer in enumerate(m.model.layers):
                x = layer.input_layernorm(h)
                att = layer.self_attn
                q = att.q_proj(x).view(-1, self.shape.heads, self.shape.head_dim)
                k = att.k_proj(x).view(-1, self.shape.kv_heads, self.shape.head_dim)
                v = att.v_proj(x).view(-1, self.shape.kv_heads, self.shape.head_dim)
                q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
                o = self._attention(i, q, k, v, meta)
                h = h + att.o_proj(o.view(-1, self.shape.heads * self.shape.head_dim))
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            return h
        t: Any = m.transformer
        h = t.wte(meta["ids"]) + t.wpe(meta["positions"].to("fornax"))
        width = self.shape.hidden
        for i, block in enumerate(t.h):
            qkv = block.attn.c_attn(block.ln_1(h))
            q, k, v = (x.reshape(-1, self.shape.heads, self.shape.head_dim) for x in qkv.split(width, dim=-1))
            o = self._attention(i, q, k, v, meta)
            h = h + block.attn.c_proj(o.view(-1, width))
            h = h + block.mlp(block.ln_2(h))
        return h

    def _attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   meta: dict[str, Any]) -> torch.Tensor:
        """Write the step's K/V into layer ``layer``'s cache, then attend over the cache."""
        s, session = self.shape, self.session
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        kc, vc = self.key_cache[layer], self.value_cache[layer]
        stream = runtime_stream(session)
        tokens = q.shape[0]
        self.library.paged_cache_write(
            address(k, session), address(v, session), address(kc, session), address(vc, session),
            address(meta["slots"], session),
            {"num_tokens": tokens, "num_blocks": self.num_blocks, "block_size": self.block_size,
             "kv_heads": s.kv_heads, "head_dim": s.head_dim, "dtype": "float32"}, stream)
        o = torch.empty_like(q)
        self.library.paged_attention(
            address(q, session), address(kc, session), address(vc, session),
            address(meta["block_tables"], session), address(meta["seq_lens"], session),
            address(meta["query_start"], session), address(o, session),
            {"num_seqs": meta["num_seqs"], "num_tokens": tokens, "max_query_len": meta["max_query_len"],
             "max_blocks": self.max_blocks, "heads": s.heads, "kv_heads": s.kv_heads,
             "head_dim": s.head_dim, "block_size": self.block_size, "dtype": "float32"}, stream)
        # the tensors the kernels read stay alive until the kernels ran: the caching allocator
        # reuses their memory only in stream order, after them
        return o

    # -- swapping ------------------------------------------------------------------------------
    def _swap(self, step: Step) -> None:
        """Copy the blocks a step swaps out to host memory, then the ones it swaps in back to
        the device (whole blocks, every layer)."""
        with torch.no_grad():
            for dev, host in step.swap_out:
                for layer in range(self.shape.layers):
                    self.host_key[layer][host].copy_(self.key_cache[layer][dev].cpu())
                    self.host_value[layer][host].copy_(self.value_cache[layer][dev].cpu())
            for host, dev in step.swap_in:
                for layer in range(self.shape.layers):
                    self.key_cache[layer][dev].copy_(self.host_key[layer][host])
                    self.value_cache[layer][dev].copy_(self.host_value[layer][host])
