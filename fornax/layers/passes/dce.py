"""Dead code elimination: nodes and constants that no graph output depends on
are removed.  Graph inputs stay (they are the graph's calling convention)."""

from __future__ import annotations

from ..graph import Graph, Value
from . import copy_node


def live_values(graph: Graph) -> set[int]:
    """ids of the values some graph output depends on."""
    live = {id(v) for v in graph.outputs}
    for node in reversed(graph.nodes):
        if id(node.outputs[0]) in live:
            live.update(id(v) for v in node.inputs)
    return live


def dce(graph: Graph) -> Graph:
    live = live_values(graph)
    out = Graph(graph.name)
    env: dict[int, Value] = {}
    for v in graph.inputs:
        env[id(v)] = out.input(v.name, v.shape, v.dtype)
    for v in graph.constants:
        if id(v) in live:
            env[id(v)] = out.constant(v.const, v.name)
    for node in graph.nodes:
        if id(node.outputs[0]) in live:
            env[id(node.outputs[0])] = copy_node(out, node, [env[id(v)] for v in node.inputs])
    out.output(*(env[id(v)] for v in graph.outputs))
    return out


run = dce
