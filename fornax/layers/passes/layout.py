"""Permutation / layout folding.

Every layout op (``transpose``, ``reshape``, ``broadcast_to``) costs a
kernel that reads its operand through a rearranged index and writes a new
buffer.  This pass removes what it can:

* ``transpose(transpose(x, p), q)`` -> one ``transpose(x, p∘q)`` (or ``x``);
* a ``transpose`` that only moves dimensions of size 1 keeps the flat order
  of the elements, so it is a ``reshape``; a ``reshape`` of a ``reshape`` is
  one ``reshape``;
* a ``broadcast_to`` whose only consumers are elementwise ops that give the
  same result shape without it is dropped: the consumer's kernel broadcasts
  the operand in its index math (dims aligned right, NumPy rules), so no
  broadcast tensor is ever written.

The generated GEMM reads row-major operands only, so a ``transpose``
feeding a ``matmul`` stays a separate (layout) kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph import OPS, Graph, Node, Value
from . import rebuild


def _perm(attrs: dict[str, Any], rank: int) -> tuple[int, ...]:
    perm = attrs.get("perm")
    return tuple(perm) if perm is not None else tuple(reversed(range(rank)))


def _keeps_order(shape: tuple[int, ...], perm: tuple[int, ...]) -> bool:
    """A permutation that leaves the non-unit dimensions in order keeps the flat order."""
    moved = [p for p in perm if shape[p] != 1]
    return moved == sorted(moved)


def layout(graph: Graph) -> Graph:
    users = graph.users()

    def droppable_broadcast(v: Value) -> bool:
        us = users.get(id(v), [])
        if not us or any(v is o for o in graph.outputs):
            return False
        for u in us:
            if OPS[u.op].kind != "elementwise":
                return False
            others = [w.shape for w in u.inputs if w is not v]
            if v.producer is None:          # v is a broadcast's output: it has its producer
                return False
            src = v.producer.inputs[0].shape
            if tuple(np.broadcast_shapes(src, *others)) != u.outputs[0].shape:
                return False
        return True

    def rewrite(out: Graph, node: Node, args: list[Value]) -> Value | None:
        if not args:                  # the ops rewritten here all have an operand
            return None
        x = args[0]
        if node.op == "transpose":
            perm = _perm(node.attrs, len(x.shape))
            p = x.producer
            if p is not None and p.op == "transpose":
                inner = _perm(p.attrs, len(p.inputs[0].shape))
                composed = tuple(inner[i] for i in perm)
                if composed == tuple(range(len(composed))):
                    return p.inputs[0]
                return out.op("transpose", p.inputs[0], perm=composed)
            if _keeps_order(x.shape, perm):
                src = p.inputs[0] if p is not None and p.op == "reshape" else x
                return out.op("reshape", src, shape=node.outputs[0].shape)
        elif node.op == "reshape":
            p = x.producer
            if p is not None and p.op == "reshape":
                return out.op("reshape", p.inputs[0], shape=node.outputs[0].shape)
        elif node.op == "broadcast_to" and droppable_broadcast(node.outputs[0]):
            return x          # its elementwise consumers broadcast it in their own index math
        return None
    return rebuild(graph, rewrite)


run = layout
