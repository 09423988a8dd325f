"""Views: the kernels of a fused plan that would only move bytes a consumer can read in place.

Two layout kernels after fusion (:mod:`.fuse`) need no launch at all:

* a ``reshape`` on its own: a buffer is contiguous, so the reshaped value is the same
  bytes (a view).  Its output takes its operand's buffer; nothing is copied.  A graph
  output (which the caller receives in its own buffer, with its own shape) takes it only
  from a temporary, which then becomes that output;
* a ``transpose`` of the last two dims feeding only a GEMM the library computes: the
  library reads an operand stored transposed (``trans_a``/``trans_b``, as every BLAS
  does), so the GEMM takes the transpose's operand and the flag instead.

What remains of a transposed operand is the GEMM reading it with other strides; the
numerics are the same products in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..graph import OPS, Graph, Node, Value
from .fuse import Group


@dataclass
class Views:
    """What :func:`views` found, by group index."""

    #: reshape groups: the (output, operand) whose buffer the output takes
    aliases: dict[int, tuple[Value, Value]] = field(default_factory=dict)
    #: transpose groups a library GEMM reads through (no kernel)
    folded: set[int] = field(default_factory=set)
    #: library GEMM groups: per operand role ("a", "b"), the value stored transposed
    transposed: dict[int, dict[str, Value]] = field(default_factory=dict)


def _swaps_last_two(node: Node) -> bool:
    rank = len(node.inputs[0].shape)
    perm = node.attrs.get("perm") or tuple(reversed(range(rank)))
    return rank >= 2 and tuple(perm) == (*range(rank - 2), rank - 1, rank - 2)


def views(graph: Graph, groups: list[Group], enabled: bool = True) -> Views:
    """The groups of ``groups`` that are views (``enabled=False``: none, every op a kernel)."""
    found = Views()
    if not enabled:
        return found
    users = graph.users()
    outputs = {id(v) for v in graph.outputs}
    placed = {id(v) for v in (*graph.inputs, *graph.constants, *graph.outputs)}
    single = {id(g.nodes[0]): i for i, g in enumerate(groups)
              if g.kind == "pointwise" and len(g.nodes) == 1}
    lone = set(single.values())       # groups of one layout or elementwise node
    shaped: set[int] = set()          # temporaries an output alias gives its shape
    for i, g in enumerate(groups):
        node = g.nodes[0]
        if i in lone and node.op == "reshape":
            view, src = node.outputs[0], node.inputs[0]
            if id(view) not in outputs:
                found.aliases[i] = (view, src)
            elif id(src) not in placed and id(src) not in shaped:
                # a graph output reshaped from a temporary: the temporary is the output
                shaped.add(id(src))
                found.aliases[i] = (view, src)
        if g.kind != "library" or OPS[node.op].kind != "matmul" or len(node.inputs) != 2:
            continue
        a, b = node.inputs
        for role, v in (("a", a), ("b", b)):
            p = v.producer
            j = single.get(id(p)) if p is not None else None
            if j is None or p is None or p.op != "transpose" or not _swaps_last_two(p) or \
                    id(v) in outputs or len(users.get(id(v), ())) != 1:
                continue
            found.folded.add(j)
            found.transposed.setdefault(i, {})[role] = p.inputs[0]
    return found
