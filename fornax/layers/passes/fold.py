"""Constant folding: a node whose operands are all constants is evaluated once,
at compile time, with the op's float64 reference and cast to the node's dtype.

Only results of at most :data:`FOLD_LIMIT` elements (and operands of at most
that many) are folded, so a broadcast of a scalar to a huge tensor is not
materialised in the binary's constants; collectives are never folded (their
value depends on the other ranks).
"""

from __future__ import annotations

import numpy as np

from ..graph import OPS, Graph, Node, Value, _to_f64
from . import rebuild

#: the largest tensor (elements) constant folding materialises
FOLD_LIMIT = 1 << 16


def foldable(node: Node, args: list[Value], limit: int = FOLD_LIMIT) -> bool:
    return (bool(args) and all(a.const is not None for a in args)
            and OPS[node.op].kind != "collective"
            and node.outputs[0].type.numel <= limit
            and all(a.type.numel <= limit for a in args))


def fold(graph: Graph, limit: int = FOLD_LIMIT) -> Graph:
    """Evaluate every all-constant node of at most ``limit`` elements."""
    def rewrite(out: Graph, node: Node, args: list[Value]) -> Value | None:
        if not foldable(node, args, limit):
            return None
        consts = [a.const for a in args]
        if any(c is None for c in consts):     # foldable() checked: every operand is a constant
            return None
        with np.errstate(all="ignore"):
            res = OPS[node.op].reference(*(_to_f64(c) for c in consts if c is not None),
                                         **node.attrs)
        res_t = node.outputs[0].type
        arr = np.ascontiguousarray(np.asarray(res).astype(res_t.dtype.numpy).reshape(res_t.shape))
        return out.constant(arr, node.outputs[0].name)
    return rebuild(graph, rewrite)


run = fold
