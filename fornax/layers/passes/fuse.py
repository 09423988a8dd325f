"""Fusion: greedy producer-consumer grouping of nodes into kernels.

Groups, in topological order:

* ``library`` — one matmul, or one whole convolution / attention, routed to the library;
* ``gemm`` — a generated matmul plus the elementwise ops that consume it on
  its output shape (a fused epilogue);
* ``pointwise`` — a chain of elementwise ops over one shape (a layout op
  opens one: it loads its operand through the rearranged index; a chain of
  layout ops nothing else reads is one such kernel, read through at once);
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
from ..emitter import CHAINABLE
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
    """Greedy producer-consumer fusion in topological order (``enabled=False``: one node per group).

    A node joins the kernel of the group computing its operand: the latest group, or an
    earlier one that can move to now because no group after it reads what it computes
    (the graph is functional, so moving a pure kernel later changes no value)."""
    groups: list[Group] = []
    cur: Group | None = None
    users = graph.users()
    graph_outputs = {id(v) for v in graph.outputs}
    owner: dict[int, Group] = {}          # value -> the pointwise or reduction group computing it

    def start(g: Group) -> Group:
        groups.append(g)
        return g

    def resume(g: Group, node: Node) -> bool:
        """Move ``g`` to the end of the kernel order so that ``node`` can join it."""
        if g is groups[-1]:
            return True
        if any(OPS[n.op].kind == "indexed" for n in g.nodes):      # RNG streams keep their order
            return False
        i = next(k for k, h in enumerate(groups) if h is g)
        made = {id(n.outputs[0]) for n in g.nodes}
        if any(id(v) in made for h in groups[i + 1:] for n in h.nodes for v in n.inputs):
            return False
        del groups[i]
        groups.append(g)
        return True

    def producer_group(node: Node) -> Group | None:
        """The open group computing one of ``node``'s operands, if it may take ``node``."""
        for v in node.inputs:
            g = owner.get(id(v))
            if g is not None and g is not cur and _fits(g, node) and resume(g, node):
                return g
        return None

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
            owner[id(out)] = cur
            if not keep:
                cur.closed = True
            continue
        if kind == "collective":
            start(Group("collective", [node], out.shape, closed=True))
            cur = None
            continue
        if kind == "layout":
            # a layout op reads its operand through a rearranged index: it opens a new
            # pointwise kernel (over its output), and elementwise consumers may fuse after it;
            # fed by a chain of layout ops that nothing else reads, it extends that chain's
            # kernel, which then reads through every op of it at once (one load, no copies)
            x = node.inputs[0]
            g = owner.get(id(x)) if enabled else None
            if (g is not None and node.op in CHAINABLE and not g.closed and g.kind == "pointwise"
                    and all(n.op in CHAINABLE for n in g.nodes) and g.nodes[-1].outputs[0] is x
                    and len(users.get(id(x), ())) == 1 and id(x) not in graph_outputs
                    and resume(g, node)):
                g.nodes.append(node)
                g.space = out.shape
                cur = g
            else:
                cur = start(Group("pointwise", [node], out.shape))
            owner[id(out)] = cur
            continue
        if kind == "indexed":
            # gather / scatter / index_select / im2col / RNG compute their own load offsets: like a
            # layout op, each opens a pointwise kernel over its output
            cur = start(Group("pointwise", [node], out.shape))
            owner[id(out)] = cur
            continue
        if kind != "elementwise":
            raise CompileError(f"no lowering for {kind} op {node.op!r} (decompose it first)",
                               seam="compiler", op=node.op)
        if enabled and cur is not None and not _fits(cur, node):
            g = producer_group(node)          # the kernel of an earlier operand, moved to now
            if g is not None:
                cur = g
        if cur is not None and _fits(cur, node):
            cur.nodes.append(node)
        else:
            cur = start(Group("pointwise", [node], out.shape))
        owner[id(out)] = cur
    return groups


def _fits(g: Group, node: Node) -> bool:
    """Whether elementwise ``node`` can join ``g``: it reads ``g``'s values over ``g``'s space
    (or, after a reduction, over the reduced space)."""
    out = node.outputs[0]
    reduced = tuple(1 if d == g.axis else s for d, s in enumerate(g.space)) if g.axis is not None else None
    return (not g.closed and g.kind not in ("library", "collective")
            and (out.shape == g.space or (g.kind == "reduction" and out.shape == reduced))
            and _consumes_group(g, node))


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
