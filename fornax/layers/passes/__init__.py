"""The compiler's passes, each a small module that can be run and tested on its own.

Graph-to-graph passes (each takes a :class:`~fornax.layers.graph.Graph` and
returns a new, verified-equivalent one; the input graph is never changed):

* :mod:`.decompose` — composite ops into primitives;
* :mod:`.fold` — constant folding (float64 reference, cast to the node's dtype);
* :mod:`.simplify` — algebraic identities that are exact for every input;
* :mod:`.layout` — permutation / layout folding;
* :mod:`.cse` — common subexpression elimination;
* :mod:`.dce` — dead code elimination.

Planning passes: :mod:`.route` (library routing policy and what the
compiler can lower at all), :mod:`.fuse` (kernels), :mod:`.memplan`
(liveness-based buffer reuse).
"""

from __future__ import annotations

from typing import Callable

from ..graph import Graph, Node, Value

#: (new graph, node of the old graph, its operands in the new graph) -> replacement or None (copy)
Rewrite = Callable[[Graph, Node, list[Value]], "Value | None"]


def rebuild(graph: Graph, rewrite: Rewrite | None = None) -> Graph:
    """Copy ``graph`` node by node; ``rewrite`` may replace a node by any value of the copy."""
    out = Graph(graph.name)
    env: dict[int, Value] = {}
    for v in graph.inputs:
        env[id(v)] = out.input(v.name, v.shape, v.dtype)
    for v in graph.constants:
        env[id(v)] = out.constant(v.const, v.name)
    for node in graph.nodes:
        args = [env[id(v)] for v in node.inputs]
        res = rewrite(out, node, args) if rewrite is not None else None
        if res is None:
            res = copy_node(out, node, args)
        env[id(node.outputs[0])] = res
    out.output(*(env[id(v)] for v in graph.outputs))
    return out


def copy_node(out: Graph, node: Node, args: list[Value]) -> Value:
    """``node`` applied to ``args`` in ``out``, keeping the value's name where it is free."""
    res = out.op(node.op, *args, **node.attrs)
    out.rename(res, node.outputs[0].name, strict=False)      # buffers keep the graph's names
    return res


def is_const(v: Value) -> bool:
    return v.const is not None


__all__ = ["Rewrite", "rebuild", "copy_node", "is_const"]
