"""Decomposition: composite ops (softmax, reduce_mean, ...) into the primitives
their :class:`~fornax.layers.graph.OpDef` ``decompose`` builds.

``keep`` names composites to leave whole (a framework that decomposes only
some ops before compiling).  An ``all_reduce`` over one rank is the value
itself and is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from ..graph import OPS, Graph, Node, Value
from . import rebuild

#: which composites to leave whole: op names, or a predicate on the node
Keep: TypeAlias = "frozenset[str] | Callable[[Node], bool]"


def decompose(graph: Graph, keep: Keep = frozenset()) -> Graph:
    """Replace composite ops (except those in ``keep``: op names, or a predicate on the node)
    by their decompositions."""
    def kept(node: Node) -> bool:
        return keep(node) if callable(keep) else node.op in keep

    def rewrite(out: Graph, node: Node, args: list[Value]) -> Value | None:
        if node.op == "all_reduce" and node.attrs.get("ranks") == 1:
            return args[0]                       # a sum over one rank is the value itself
        opdef = OPS[node.op]
        if opdef.decompose is not None and not kept(node):
            value: Value = opdef.decompose(out, args, node.attrs)
            return value
        return None
    # a decomposition may use other composites (layer norm -> reduce_mean): repeat until none is left
    for _ in range(8):
        graph = rebuild(graph, rewrite)
        if not any(OPS[n.op].decompose is not None and not kept(n) for n in graph.nodes):
            break
    return graph


run = decompose
