"""Fusion: greedy producer-consumer grouping of nodes into kernels.

Groups, in topological order:

* ``library`` — one matmul, or one whole convolution / attention, routed to the library;
* ``gemm`` — a generated matmul plus the elementwise ops that consume it on
  its output shape (a fused epilogue);
* ``pointwise`` — a chain of elementwise ops over one shape (a layout op
  opens one: it loads its operand through the rearranged index);
* ``reduction`` — elementwise ops and reductions along one axis, plus
  elementwise ops on the reduced result;
* ``collective`` — an ``all_reduce`` over several ranks.

A fused group is one kernel: its intermediate values stay in registers and
never reach memory, so it launches once and moves fewer bytes.  With
``enabled=False`` (``--no-fuse``) every node is its own kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CompileError
from ..graph import OPS, Graph, Node, Value


@dataclass
class Group:
    kind: str                      # pointwise | reduction | gemm | library | collective
    nodes: list[Node]
    space: tuple[int, ...]
    axis: int | None = None
    closed: bool = False

    def produces(self, v: Value) -> bool:
        return any(v is n.outputs[0] for n in self.nodes)


def _consumes_group(group: Group, node: Node) -> bool:
    return any(group.produces(v) for v in node.inputs)


def fuse(graph: Graph, library_ops: frozenset[str], enabled: bool = True) -> list[Group]:
    """Greedy producer-consumer fusion in topological order (``enabled=False``: one node per group)."""
    groups: list[Group] = []
    cur: Group | None = None

    def start(g: Group) -> Group:
        groups.append(g)
        return g

    for node in graph.nodes:
        if not enabled:
            cur = None
        out = node.outputs[0]
        kind = OPS[node.op].kind
        if kind == "composite" and node.op in library_ops:    # a whole op kept for a DNN routine
            start(Group("library", [node], out.shape, closed=True))
            cur = None
            continue
        if kind == "matmul":
            if node.op in library_ops:
                start(Group("library", [node], out.shape, closed=True))
                cur = None
            else:
                cur = start(Group("gemm", [node], out.shape))
            continue
        if kind == "reduce":
            x = node.inputs[0]
            axis = node.attrs.get("axis", -1) % len(x.shape)
            keep = node.attrs.get("keepdims", True)
            joinable = (cur is not None and not cur.closed and cur.kind in ("pointwise", "reduction")
                        and cur.space == x.shape and cur.axis in (None, axis)
                        and _consumes_group(cur, node))
            if joinable and cur is not None:
                cur.nodes.append(node)
                cur.kind, cur.axis = "reduction", axis
            else:
                cur = start(Group("reduction", [node], x.shape, axis))
            if not keep:
                cur.closed = True
            continue
        if kind == "collective":
            start(Group("collective", [node], out.shape, closed=True))
            cur = None
            continue
        if kind == "layout":
            # a layout op reads its operand through a rearranged index: it opens a new
            # pointwise kernel (over its output), and elementwise consumers may fuse after it
            cur = start(Group("pointwise", [node], out.shape))
            continue
        if kind == "indexed":
            # gather / scatter / index_select / im2col / RNG compute their own load offsets: like a
            # layout op, each opens a pointwise kernel over its output
            cur = start(Group("pointwise", [node], out.shape))
            continue
        if kind != "elementwise":
            raise CompileError(f"no lowering for {kind} op {node.op!r} (decompose it first)",
                               seam="compiler", op=node.op)
        reduced = None
        if cur is not None and cur.axis is not None:
            reduced = tuple(1 if d == cur.axis else s for d, s in enumerate(cur.space))
        fits = (cur is not None and not cur.closed and cur.kind != "library"
                and (out.shape == cur.space or (cur.kind == "reduction" and out.shape == reduced))
                and _consumes_group(cur, node))
        if fits and cur is not None:
            cur.nodes.append(node)
        else:
            cur = start(Group("pointwise", [node], out.shape))
    return groups


def group_io(graph: Graph, groups: list[Group]) -> list[tuple[list[Value], list[Value]]]:
    """External inputs and live-out outputs of every group."""
    users = graph.users()
    owner = {}
    for gi, g in enumerate(groups):
        for n in g.nodes:
            owner[id(n.outputs[0])] = gi
    graph_outs = {id(v) for v in graph.outputs}
    result = []
    for gi, g in enumerate(groups):
        ins: list[Value] = []
        for n in g.nodes:
            for v in n.inputs:
                if owner.get(id(v)) != gi and all(v is not w for w in ins):
                    ins.append(v)
        outs = []
        for n in g.nodes:
            v = n.outputs[0]
            if id(v) in graph_outs or any(owner.get(id(u.outputs[0])) != gi for u in users.get(id(v), [])):
                outs.append(v)
        result.append((ins, outs))
    return result


def describe(groups: list[Group]) -> str:
    """The kernels as text (what ``--dump-ir`` writes after fusion)."""
    lines = []
    for gi, g in enumerate(groups):
        lines.append(f"kernel {gi} {g.kind} over {list(g.space)}"
                     + (f" axis {g.axis}" if g.axis is not None else "") + ":")
        lines.extend(f"  {n!r}" for n in g.nodes)
    return "\n".join(lines)
