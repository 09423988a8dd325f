"""The capacity model: how many concurrent sequences of a given length fit in a chip's HBM
next to the model's weights.

A serving engine sizes its KV cache the way vLLM does: of the device memory it may use
(``memory_fraction`` of HBM), the weights and a reserve for the activations of the largest
step are set aside, and the rest is cut into KV blocks of ``block_size`` tokens.  A sequence
of ``seq_len`` tokens holds ``ceil(seq_len / block_size)`` blocks (its last one partly
filled), so the number of such sequences that can be resident at once is the number of
blocks divided by that.  With tensor parallelism over ``tp`` devices, each device holds
``1/tp`` of the weights and of every layer's key/value heads.

The chip's HBM capacity comes from its spec, so a different HBM configuration (an
h100-like 80 GB part against an h200-like 141 GB one with the same compute) changes the
answer while nothing else does.  :data:`REFERENCE_SHAPES` are two public decoder
architectures (an 8B- and a 70B-class grouped-query Llama) in bfloat16, to read the model
at the scale the chips are built for.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..layers.errors import ConfigError
from ..sim.spec import ChipSpec
from .models import DecoderShape

#: decoder shapes at the scale the chips serve (bfloat16 weights and cache)
REFERENCE_SHAPES: dict[str, DecoderShape] = {
    "llama-8b-like": DecoderShape(layers=32, heads=32, kv_heads=8, head_dim=128, hidden=4096,
                                  vocab=128256, max_positions=131072, parameters=8_030_261_248,
                                  dtype_bytes=2),
    "llama-70b-like": DecoderShape(layers=80, heads=64, kv_heads=8, head_dim=128, hidden=8192,
                                   vocab=128256, max_positions=131072, parameters=70_553_706_496,
                                   dtype_bytes=2),
}


@dataclass(frozen=True)
class Capacity:
    """One answer of the capacity model (bytes per device)."""

    spec: str
    hbm_bytes: int
    usable_bytes: int             # memory_fraction of HBM
    weight_bytes: int             # this device's share of the weights
    activation_bytes: int         # reserved for the largest step's activations
    kv_bytes: int                 # what is left for the KV cache (0 when nothing is)
    block_bytes: int              # one block: block_size tokens of K and V, every layer
    blocks: int
    seq_len: int
    blocks_per_sequence: int
    max_sequences: int            # sequences of seq_len resident at once
    tp: int
    model: str = ""               # the shape's name, where it has one

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def activation_reserve(shape: DecoderShape, max_batched_tokens: int, tp: int = 1) -> int:
    """Bytes for the activations of a step of ``max_batched_tokens`` tokens: the residual
    stream, the query/key/value projections and the MLP's intermediate (four times the
    hidden width, the common ratio) of one layer at a time, and the logits of every row."""
    per_token = (shape.hidden * 2 + (shape.heads + 2 * shape.kv_heads) * shape.head_dim // tp
                 + 4 * shape.hidden // tp)
    return max_batched_tokens * (per_token * shape.dtype_bytes + shape.vocab * 4)


def capacity(shape: DecoderShape, spec: ChipSpec, seq_len: int, block_size: int = 16,
             memory_fraction: float = 0.9, max_batched_tokens: int = 8192, tp: int = 1,
             model: str = "") -> Capacity:
    """How many sequences of ``seq_len`` tokens fit on one device of ``spec`` serving a
    decoder of ``shape`` split over ``tp`` devices."""
    if seq_len <= 0 or block_size <= 0 or tp <= 0 or max_batched_tokens <= 0:
        raise ConfigError("the capacity model needs a positive sequence length, block size, "
                          f"tensor-parallel degree and step size (got seq_len={seq_len}, "
                          f"block_size={block_size}, tp={tp}, max_batched_tokens={max_batched_tokens})")
    if not 0.0 < memory_fraction <= 1.0:
        raise ConfigError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
    if shape.kv_heads % tp:
        raise ConfigError(f"{shape.kv_heads} key/value heads do not split over tp={tp} devices",
                          hint="choose a tensor-parallel degree that divides the key/value heads")
    usable = int(spec.hbm_bytes * memory_fraction)
    weights = math.ceil(shape.weight_bytes / tp)
    reserve = activation_reserve(shape, max_batched_tokens, tp)
    kv = max(0, usable - weights - reserve)
    block = block_size * shape.kv_bytes_per_token // tp
    blocks = kv // block
    per_seq = -(-seq_len // block_size)
    return Capacity(spec=spec.name, hbm_bytes=spec.hbm_bytes, usable_bytes=usable, weight_bytes=weights,
                    activation_bytes=reserve, kv_bytes=kv, block_bytes=block, blocks=blocks,
                    seq_len=seq_len, blocks_per_sequence=per_seq, max_sequences=blocks // per_seq, tp=tp,
                    model=model)
