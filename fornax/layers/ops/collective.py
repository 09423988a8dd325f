"""Collective ops in a graph: ``all_reduce``, the sum of a value over the ranks of a
(tensor-parallel) group.

A graph with an ``all_reduce`` is one rank's part of a parallel program;
``ranks`` is the group's size.  Its float64 reference exists for one rank
only (the identity): the other ranks' values are not in the graph.
"""

from __future__ import annotations

from ..errors import GraphError
from ..ir import TensorType
from .registry import Array, Attrs, OpDef, float_only, register


def _infer_all_reduce(types: list[TensorType], attrs: Attrs) -> TensorType:
    ranks = attrs.get("ranks")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise GraphError(f"all_reduce: ranks must be a positive int, got {ranks!r}", op="all_reduce")
    float_only("all_reduce", types[0].dtype)
    return types[0]


def _all_reduce_ref(x: Array, ranks: int) -> Array:
    if ranks != 1:
        raise GraphError(f"all_reduce over {ranks} ranks sums values held by the other ranks; "
                         "a one-rank graph has no float64 reference for it", op="all_reduce",
                         hint="build the graph with ranks=1 to compare against numpy")
    return x


# the sum of a value over the ranks of a (tensor-parallel) group; this graph is one rank's part
register(OpDef("all_reduce", "collective", 1, _infer_all_reduce, _all_reduce_ref, attrs=("ranks",)))
