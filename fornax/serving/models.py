"""The decoder models ``fornax serve`` serves: ``transformers`` decoders built from small
configurations with seeded random weights (nothing is downloaded).

* ``llama`` -- ``LlamaForCausalLM``: RMSNorm, rotary position embeddings, grouped-query
  attention (2 query heads sharing 1 key/value head of 64), SwiGLU MLP.
* ``gpt2`` -- ``GPT2LMHeadModel``: learned position embeddings, LayerNorm, multi-head
  attention (2 heads of 64), GELU MLP, output head tied to the token embedding.

Head dimension 64 is one every family's paged-attention routine supports.  The models have
no end-of-sequence token, so a request always produces ``max_new_tokens`` tokens (the
``ignore_eos`` mode serving benchmarks use), and ``generate()`` on the CPU produces as many.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..layers.errors import ConfigError

if TYPE_CHECKING:                                  # transformers is imported where a model is built
    from transformers import PreTrainedModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")      # nothing is ever fetched

SEED = 0


@dataclass(frozen=True)
class DecoderShape:
    """What the paged cache and the capacity model need to know of a decoder."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    max_positions: int
    parameters: int                 # weights, counted once (tied ones once)
    dtype_bytes: int = 4

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        return self.parameters * self.dtype_bytes


def _llama() -> PreTrainedModel:
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def _gpt2() -> PreTrainedModel:
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=256, n_positions=256, n_embd=128, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None,
                     eos_token_id=None, pad_token_id=None, tie_word_embeddings=True)
    return GPT2LMHeadModel(cfg)


BUILDERS: dict[str, Callable[[], PreTrainedModel]] = {"llama": _llama, "gpt2": _gpt2}


def build(name: str) -> PreTrainedModel:
    """The float32 CPU model ``name`` in eval mode, its weights drawn from a fixed seed (two
    builds are bit-identical)."""
    if name not in BUILDERS:
        raise ConfigError(f"no serving model named {name!r}",
                          hint=f"choose one of: {', '.join(sorted(BUILDERS))}")
    torch.manual_seed(SEED)
    model = BUILDERS[name]()
    model.float().eval()
    gen = model.generation_config
    gen.eos_token_id = gen.pad_token_id = gen.bos_token_id = None
    return model


def shape_of(model: PreTrainedModel) -> DecoderShape:
    """The decoder shape of a ``transformers`` Llama or GPT-2 model."""
    cfg = model.config
    kind = cfg.model_type
    if kind == "llama":
        heads, kv, hidden = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
        layers, positions = cfg.num_hidden_layers, cfg.max_position_embeddings
    elif kind == "gpt2":
        heads, hidden, layers, positions = cfg.n_head, cfg.n_embd, cfg.n_layer, cfg.n_positions
        kv = heads
    else:
        raise ConfigError(f"the serving runtime runs Llama and GPT-2 decoders, not {kind!r}",
                          hint="build a LlamaForCausalLM or GPT2LMHeadModel")
    seen: set[int] = set()
    params = 0
    for p in model.parameters():          # tied weights are one tensor: counted once
        if id(p) not in seen:
            seen.add(id(p))
            params += p.numel()
    return DecoderShape(layers=layers, heads=heads, kv_heads=kv, head_dim=hidden // heads,
                        hidden=hidden, vocab=cfg.vocab_size, max_positions=positions,
                        parameters=params)
