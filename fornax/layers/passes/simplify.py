"""Algebraic simplification: rewrites that give the same value for every input.

What is rewritten, and why it is safe:

* ``x + 0``, ``0 + x``, ``x - 0`` -> ``x``: exact for every finite value,
  for ±inf and NaN; the one difference is the sign of a zero (``-0.0 + 0.0``
  is ``+0.0``), which compares equal;
* ``x * 1``, ``1 * x``, ``x / 1`` -> ``x``: exact for every value, NaN and
  ±inf included;
* ``x * 0`` -> ``0`` **only for integer and bool** ``x``: for floats
  ``inf * 0`` and ``NaN * 0`` are NaN, so the product is kept;
* ``neg(neg(x))`` -> ``x``;
* ``cast`` to the dtype the value already has, ``reshape`` to the shape it
  already has, ``broadcast_to`` its own shape, ``transpose`` by the identity
  permutation -> ``x``;
* ``reshape(reshape(x))`` -> one ``reshape``; ``transpose(transpose(x))``
  whose permutations cancel -> ``x`` (other compositions are
  :mod:`.layout`'s job).

A rewrite applies only when the replacement has exactly the node's type
(shape and dtype), so an identity that would drop a broadcast is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..graph import Graph, Node, Value
from . import rebuild


def _all(v: Value, x: float) -> bool:
    return v.const is not None and v.const.size > 0 and bool(np.all(v.const == x))


def _perm(node_or_attrs: Mapping[str, Any], rank: int) -> tuple[int, ...]:
    perm = node_or_attrs.get("perm")
    return tuple(perm) if perm is not None else tuple(reversed(range(rank)))


def simplify_node(out: Graph, node: Node, args: list[Value]) -> Value | None:
    t = node.outputs[0].type
    op = node.op

    def same(v: Value) -> Value | None:
        return v if v.type == t else None

    if op == "add":
        a, b = args
        if _all(b, 0):
            return same(a)
        if _all(a, 0):
            return same(b)
    elif op == "sub" and _all(args[1], 0):
        return same(args[0])
    elif op == "mul":
        a, b = args
        if _all(b, 1):
            return same(a)
        if _all(a, 1):
            return same(b)
        if not t.dtype.is_float and (_all(a, 0) or _all(b, 0)):
            return out.constant(np.zeros(t.shape, t.dtype.numpy), node.outputs[0].name)
    elif op == "div" and _all(args[1], 1):
        return same(args[0])
    elif op == "neg":
        p = args[0].producer
        if p is not None and p.op == "neg":
            return same(p.inputs[0])
    elif op == "cast":
        return same(args[0])
    elif op in ("reshape", "broadcast_to"):
        x = args[0]
        if x.shape == t.shape:
            return same(x)
        p = x.producer
        if op == "reshape" and p is not None and p.op == "reshape":
            src = p.inputs[0]
            return src if src.type == t else out.op("reshape", src, shape=t.shape)
    elif op == "transpose":
        x = args[0]
        perm = _perm(node.attrs, len(x.shape))
        if perm == tuple(range(len(perm))):
            return same(x)
        p = x.producer
        if p is not None and p.op == "transpose":
            inner = _perm(p.attrs, len(p.inputs[0].shape))
            if tuple(inner[i] for i in perm) == tuple(range(len(perm))):
                return same(p.inputs[0])
    return None


def simplify(graph: Graph) -> Graph:
    """Apply :func:`simplify_node` to every node (dead producers are left to DCE)."""
    return rebuild(graph, simplify_node)


run = simplify
