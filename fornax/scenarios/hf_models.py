"""The models of the ``transformers`` zoo: eight architectures, each built from a small
configuration with random weights drawn from a fixed seed (nothing is downloaded).

Every entry of :data:`MODELS` is a :class:`ZooModel`: how to build the model (on the CPU,
in float32, seeded so two builds are bit-identical), a batch of inputs that includes the
labels (so ``model(**batch).loss`` is the training loss), and, for generative models, the
prompt of a greedy ``generate()``.

* ``gpt2`` — decoder-only with tied embeddings (``lm_head.weight`` is the token
  embedding): ``GPT2LMHeadModel``, 2 layers.
* ``llama`` — grouped-query attention (4 query heads sharing 2 key/value heads) with
  rotary position embeddings and SwiGLU: ``LlamaForCausalLM``.
* ``bert`` — encoder classifier over a padded batch (the attention mask is used):
  ``BertForSequenceClassification``, 3 classes.
* ``t5`` — encoder-decoder with relative position buckets: ``T5ForConditionalGeneration``.
* ``vit`` — vision transformer classifier on 8x8 images in 4x4 patches:
  ``ViTForImageClassification``.
* ``mixtral`` — sparse mixture of experts (4 experts, top-2 routing, router
  auxiliary loss): ``MixtralForCausalLM``.
* ``resnet`` — convolutional (stem conv + max-pool, basic residual blocks, batch norm):
  ``ResNetForImageClassification``.
* ``mamba`` — selective state-space model (causal depthwise conv + the sequential scan
  of the reference implementation): ``MambaForCausalLM``.

Dropout is 0 everywhere, so a model in training mode computes the same function on
every device (batch norm still uses batch statistics and updates its running ones).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:                                  # transformers is imported where a model is built
    from transformers import PreTrainedModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")      # nothing is ever fetched

VOCAB = 64
SEQ = 8
BATCH = 2
SEED = 0

# num_labels and decoder_start_token_id are PreTrainedConfig keywords that transformers' config
# classes accept at run time (``@strict(accept_kwargs=True)``) but leave out of the dataclass
# signature their annotations declare: the calls passing them ignore mypy's call-arg error


@dataclass(frozen=True)
class ZooModel:
    """One architecture of the zoo.

    ``build()`` returns the float32 CPU model with seeded random weights;
    ``batch()`` the CPU inputs (with ``labels``); ``prompt()`` the ``generate`` keyword
    arguments (``None`` for a model that does not generate); ``tied`` the pairs of
    parameter names that must stay one tensor."""

    name: str
    architecture: str
    build: Callable[[], PreTrainedModel]
    batch: Callable[[], dict[str, torch.Tensor]]
    prompt: Callable[[], dict[str, torch.Tensor]] | None = None
    max_new_tokens: int = 4
    tied: tuple[tuple[str, str], ...] = field(default=())

    @property
    def generative(self) -> bool:
        return self.prompt is not None


def _seeded(make: Callable[[], PreTrainedModel]) -> Callable[[], PreTrainedModel]:
    def build() -> PreTrainedModel:
        torch.manual_seed(SEED)
        model = make()
        model.float()
        generation = getattr(model, "generation_config", None)     # None: the model does not generate
        if generation is not None:
            generation.pad_token_id = model.config.pad_token_id
        return model
    build.__doc__ = make.__doc__
    return build


def _tokens(seed: int, shape=(BATCH, SEQ), low: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, VOCAB, shape, generator=g)


def _causal_batch() -> dict[str, torch.Tensor]:
    ids = _tokens(1)
    return {"input_ids": ids, "labels": ids.clone()}


def _causal_prompt() -> dict[str, torch.Tensor]:
    ids = _tokens(2, (BATCH, 4))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _gpt2() -> PreTrainedModel:
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1,
                     eos_token_id=1, pad_token_id=1, tie_word_embeddings=True)
    model = GPT2LMHeadModel(cfg)
    model.loss_type = "ForCausalLM"        # its class name does not say so (silences a notice)
    return model


def _llama() -> PreTrainedModel:
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=32, bos_token_id=1, eos_token_id=1,
                      pad_token_id=1, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def _bert() -> PreTrainedModel:
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1,  # type: ignore[call-arg]  # (config keywords)
                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=32,
                     type_vocab_size=2, num_labels=3, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, classifier_dropout=0.0, pad_token_id=0)
    return BertForSequenceClassification(cfg)


def _bert_batch() -> dict[str, torch.Tensor]:
    ids = _tokens(3)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0                                   # the second sequence is padded
    ids = ids.masked_fill(mask == 0, 0)
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 2])}


def _t5() -> PreTrainedModel:
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1,  # type: ignore[call-arg]  # (config keywords)
                   num_decoder_layers=1, num_heads=2, relative_attention_num_buckets=8,
                   relative_attention_max_distance=16, dropout_rate=0.0,
                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return T5ForConditionalGeneration(cfg)


def _t5_batch() -> dict[str, torch.Tensor]:
    ids = _tokens(4)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "labels": _tokens(5, (BATCH, 6))}


def _vit() -> PreTrainedModel:
    from transformers import ViTConfig, ViTForImageClassification
    cfg = ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=16,  # type: ignore[call-arg]  # (config keywords)
                    num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                    num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return ViTForImageClassification(cfg)


def _image_batch(size: int) -> Callable[[], dict[str, torch.Tensor]]:
    def batch() -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(6)
        return {"pixel_values": torch.randn(BATCH, 3, size, size, generator=g),
                "labels": torch.tensor([1, 2])}
    return batch


def _mixtral() -> PreTrainedModel:
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                        num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=32,
                        output_router_logits=True, router_aux_loss_coef=0.01,
                        bos_token_id=1, eos_token_id=1, pad_token_id=1,
                        tie_word_embeddings=False)
    return MixtralForCausalLM(cfg)


def _resnet() -> PreTrainedModel:
    from transformers import ResNetConfig, ResNetForImageClassification
    cfg = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],  # type: ignore[call-arg]  # (config keywords)
                       layer_type="basic", hidden_act="relu", num_labels=3)
    return ResNetForImageClassification(cfg)


def _mamba() -> PreTrainedModel:
    from transformers import MambaConfig, MambaForCausalLM
    cfg = MambaConfig(vocab_size=VOCAB, hidden_size=16, state_size=4, num_hidden_layers=1,
                      expand=2, conv_kernel=4, time_step_rank=2, use_mambapy=False,
                      bos_token_id=1, eos_token_id=1, pad_token_id=1)
    return MambaForCausalLM(cfg)


MODELS: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("gpt2", "decoder-only, tied embeddings (GPT-2)", _seeded(_gpt2), _causal_batch,
             _causal_prompt, tied=(("lm_head.weight", "transformer.wte.weight"),)),
    ZooModel("llama", "GQA + RoPE decoder (Llama, 4 query / 2 key-value heads)",
             _seeded(_llama), _causal_batch, _causal_prompt),
    ZooModel("bert", "encoder classifier (BERT, padded batch)", _seeded(_bert), _bert_batch),
    ZooModel("t5", "encoder-decoder (T5)", _seeded(_t5), _t5_batch,
             lambda: {k: v for k, v in _t5_batch().items() if k != "labels"}),
    ZooModel("vit", "vision transformer classifier (ViT)", _seeded(_vit), _image_batch(8)),
    ZooModel("mixtral", "mixture of experts (Mixtral, 4 experts, top-2)", _seeded(_mixtral),
             _causal_batch, _causal_prompt),
    ZooModel("resnet", "convolutional (ResNet, batch norm)", _seeded(_resnet),
             _image_batch(16)),
    ZooModel("mamba", "selective state-space model (Mamba)", _seeded(_mamba), _causal_batch,
             _causal_prompt),
)}
