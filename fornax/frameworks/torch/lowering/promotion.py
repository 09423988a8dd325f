"""Type promotion by torch's rules, and the dtypes lowerings compute in: :func:`promote`
(compute and result dtype of an elementwise op over Values and Python scalars),
:func:`opmath` / :func:`compute_dtype` (float16 and bfloat16 compute in float32, as
torch's CPU kernels do), :func:`float_in` (an operand in its output's compute dtype)."""

from __future__ import annotations

import functools

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from fornax.layers.graph import DType, Value

from .context import LowerCtx
from .dtypes import DTYPE_TO_TORCH, graph_dtype


#: the dtypes torch computes in float32 (its "opmath" type)
LOW_PRECISION = (DType.FLOAT16, DType.BFLOAT16)

_KINDS = {"default": ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT,
          "bool": ELEMENTWISE_TYPE_PROMOTION_KIND.ALWAYS_BOOL,
          "float": ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT,
          "no_opmath": ELEMENTWISE_TYPE_PROMOTION_KIND.NO_OPMATH}


@functools.lru_cache(maxsize=None)
def _meta_of(shape: tuple[int, ...], dtype: DType) -> torch.Tensor:
    return torch.empty(shape, dtype=DTYPE_TO_TORCH[dtype], device="meta")


def promote(*args: Value | float | None, kind: str = "default") -> tuple[DType, DType]:
    """(compute dtype, result dtype) of an elementwise op over Values and Python scalars,
    by torch's rules (the compute dtype of float16/bfloat16 is float32)."""
    # a number as its builtin type (torch's rules look at ``type(x)``; a Lifted is a float)
    metas = [_meta_of(tuple(a.shape), a.dtype) if isinstance(a, Value) else
             float(a) if isinstance(a, float) else a for a in args if a is not None]
    comp, res = elementwise_dtypes(*metas, type_promotion_kind=_KINDS[kind])
    return graph_dtype(comp), graph_dtype(res)


def opmath(dt: DType) -> DType:
    return DType.FLOAT32 if dt in LOW_PRECISION else dt


def compute_dtype(ctx: LowerCtx, i: int = 0) -> DType:
    """The dtype to compute output ``i`` in: its dtype, float32 for float16/bfloat16."""
    return opmath(ctx.out(i))


def float_in(ctx: LowerCtx, x: Value, i: int = 0) -> Value:
    """``x`` cast to the compute dtype of output ``i`` (int inputs of float ops become float)."""
    return ctx.cast(x, compute_dtype(ctx, i))
