"""Common subexpression elimination.

Two nodes with the same op, the same operands and the same attributes
compute the same value (every op is a pure function of its operands; the
counter-based RNG takes its counter as an attribute, so equal attributes
mean equal bits), so the second is replaced by the first.  Equal small
constants (same dtype, shape and bytes, at most ``FOLD_LIMIT`` elements)
are merged first, so expressions over them meet too.
"""

from __future__ import annotations

from typing import Any

from ..graph import Graph, Value
from . import copy_node
from .fold import FOLD_LIMIT


def _attr_key(attrs: dict[str, Any]) -> str:
    return repr(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))


def cse(graph: Graph) -> Graph:
    out = Graph(graph.name)
    env: dict[int, Value] = {}
    for v in graph.inputs:
        env[id(v)] = out.input(v.name, v.shape, v.dtype)
    consts: dict[tuple[str, bytes], Value] = {}       # (type, bytes) -> the one kept
    for v in graph.constants:
        small: tuple[str, bytes] | None = None
        if v.type.numel <= FOLD_LIMIT and v.const is not None:     # a constant holds its data
            small = (str(v.type), v.const.tobytes())
            if small in consts:
                env[id(v)] = consts[small]
                continue
        env[id(v)] = out.constant(v.const, v.name)
        if small is not None:
            consts[small] = env[id(v)]
    seen: dict[tuple[str, tuple[int, ...], str], Value] = {}   # (op, operand ids, attributes)
    for node in graph.nodes:
        args = [env[id(v)] for v in node.inputs]
        key = (node.op, tuple(id(a) for a in args), _attr_key(node.attrs))
        if key not in seen:
            seen[key] = copy_node(out, node, args)
        env[id(node.outputs[0])] = seen[key]
    out.output(*(env[id(v)] for v in graph.outputs))
    return out


run = cse
