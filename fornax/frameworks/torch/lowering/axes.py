"""Dimension arguments and per-axis reductions: :func:`ndim`, :func:`wrap_dim` (torch's
negative and 0-d dims), :func:`reduction_dims` (None or [] mean every dim),
:func:`reduce_dims` / :func:`sum_dims` (one graph reduction per dim) and :func:`count_dims`."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fornax.layers.errors import GraphError
from fornax.layers.graph import Value
from fornax.frameworks.builders import reshape as _reshape

from .context import LowerCtx


def ndim(v: Value) -> int:
    return len(v.shape)


def wrap_dim(d: int, rank: int) -> int:
    r = max(rank, 1)
    if not -r <= d < r:
        raise GraphError(f"dim {d} is out of range for rank {rank}")
    return d % r


def reduction_dims(dim: int | Sequence[int] | None, rank: int) -> list[int]:
    """Normalised reduction dims; None or [] mean every dim."""
    if dim is None:
        return list(range(rank))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return list(range(rank))
    return sorted({wrap_dim(d, rank) for d in dim}) if rank else []


def reduce_dims(ctx: LowerCtx, name: str, x: Value, dims: Sequence[int], keepdim: bool) -> Value:
    """Reduce over several dims, one graph reduction per dim."""
    if ndim(x) == 0:
        return x
    for d in dims:
        if x.shape[d] != 1 or name in ("argmax", "argmin"):
            x = ctx.op(name, x, axis=d, keepdims=True)
    if not keepdim:
        x = _reshape(ctx, x, [s for i, s in enumerate(x.shape) if i not in dims])
    return x


def sum_dims(ctx: LowerCtx, x: Value, dims: Sequence[int], keepdim: bool = True) -> Value:
    return reduce_dims(ctx, "reduce_sum", x, dims, keepdim)


def count_dims(x: Value, dims: Sequence[int]) -> int:
    return math.prod(x.shape[d] for d in dims)
