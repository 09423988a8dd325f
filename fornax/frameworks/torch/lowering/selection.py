"""Selection lowerings: ``topk`` by repeated arg-extremes (k <= 64) and ``sort`` by a bitonic
network."""

from __future__ import annotations

from fornax.layers.graph import DType
from fornax.frameworks.builders import bitonic_sort, full as _full, top_k

from .axes import ndim, wrap_dim
from .table import lowering


def _select(ctx, self, k, dim, largest):
    if ndim(self) == 0:
        return self, _full(ctx, (), 0, DType.INT64)
    return top_k(ctx, self, k, wrap_dim(dim, ndim(self)), largest)


@lowering("aten::topk.default")
def topk(ctx, self, k, dim=-1, largest=True, sorted=True):
    """Values as torch's; among equal values the lower index comes first (torch's CPU topk
    leaves equal values in whatever order its partial sort gives).  Up to 64 elements by
    selection rounds, more by a sort."""
    return _select(ctx, self, k, dim, largest)


@lowering("aten::sort.default", "aten::sort.stable")
def sort(ctx, self, dim=-1, descending=False, stable=None):
    if ndim(self) == 0:
        return _select(ctx, self, 1, dim, descending)
    return bitonic_sort(ctx, self, wrap_dim(dim, ndim(self)), descending)
