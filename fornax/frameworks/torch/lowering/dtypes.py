"""torch dtypes and graph dtypes: the two mapping tables and :func:`graph_dtype`, which names
a dtype the graph IR does not have (complex, uint8, int8, int16, float8...) in its refusal."""

from __future__ import annotations

import torch

from fornax.layers.graph import DType

from .errors import NotLowerable


TORCH_TO_DTYPE: dict[torch.dtype, DType] = {
    torch.float64: DType.FLOAT64, torch.float32: DType.FLOAT32, torch.float16: DType.FLOAT16,
    torch.bfloat16: DType.BFLOAT16, torch.int64: DType.INT64, torch.int32: DType.INT32,
    torch.bool: DType.BOOL,
}


DTYPE_TO_TORCH: dict[DType, torch.dtype] = {v: k for k, v in TORCH_TO_DTYPE.items()}


def graph_dtype(dtype: torch.dtype, where: str = "") -> DType:
    """The graph dtype of a torch dtype, or :class:`NotLowerable` naming it."""
    try:
        return TORCH_TO_DTYPE[dtype]
    except KeyError:
        name = str(dtype).removeprefix("torch.")
        raise NotLowerable(f"{where + ': ' if where else ''}{name} has no fornax dtype (fornax graphs use "
                           f"{', '.join(d.value for d in DType)})") from None


def as_graph_dtype(dtype: DType | torch.dtype) -> DType:
    """``dtype`` as a graph dtype (a graph dtype as it is)."""
    return dtype if isinstance(dtype, DType) else graph_dtype(dtype)
