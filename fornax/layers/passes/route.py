"""Routing: which ops go to the library seam (a per-family policy), and which
ops this compiler can lower at all.

The policy is data: ``[compiler] route_to_library`` in the family's
``vendor.toml`` lists the ops it would rather call than generate; an op is
routed when the stack's library also offers it (``Library.ops()``).

:func:`unsupported` answers, before any compiling, which ops of a graph the
shared code generators have no lowering for, each with a reason; the
framework routes those to the CPU (a counted fallback) instead of handing
them to the compiler.
"""

from __future__ import annotations

from .. import codegen
from ..graph import OPS, Graph

#: ops lowered by something other than the elementwise / reduction / layout generators
_GEMM = ("matmul",)
_COLLECTIVE = ("all_reduce",)


def library_ops(policy: frozenset, routines: frozenset) -> frozenset:
    """The ops routed to the library: in the family's policy and offered by the library."""
    return frozenset(op for op in policy if op in routines)


def lowerable(op: str) -> bool:
    """Whether the shared code generators lower primitive ``op`` themselves."""
    return (op in codegen.ELEMENTWISE or op in ("where", "cast") or op in codegen.LAYOUT
            or op in codegen.REDUCTIONS or op in _GEMM or op in _COLLECTIVE
            or OPS[op].kind == "indexed")


def unsupported(graph: Graph, routed: frozenset = frozenset()) -> dict[str, str]:
    """op -> reason, for every op of ``graph`` this compiler cannot lower.

    A composite is lowerable when its decomposition (built on the node's own
    operand types) is; an op in ``routed`` goes to the library."""
    out: dict[str, str] = {}
    for node in graph.nodes:
        op = node.op
        if op in out or op in routed or lowerable(op):
            continue
        opdef = OPS[op]
        if opdef.decompose is not None:
            probe = Graph("probe")
            args = [probe.input(f"x{i}", v.shape, v.dtype) for i, v in enumerate(node.inputs)]
            opdef.decompose(probe, args, node.attrs)
            probe.output(*(n.outputs[0] for n in probe.nodes[-1:]))
            bad = sorted(unsupported(probe, routed))
            if bad:
                out[op] = f"{op} decomposes into {', '.join(bad)}, which the compiler cannot lower"
            continue
        out[op] = f"no code generator for {opdef.kind} op {op}"
    return out
