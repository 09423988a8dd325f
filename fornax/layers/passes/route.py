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

import math
from typing import Any

from .. import codegen
from ..graph import OPS, Graph, Node

#: ops lowered by something other than the elementwise / reduction / layout generators
_GEMM = ("matmul",)
_COLLECTIVE = ("all_reduce",)


def library_ops(policy: frozenset[str], routines: frozenset[str]) -> frozenset[str]:
    """The ops routed to the library: in the family's policy and offered by the library."""
    return frozenset(op for op in policy if op in routines)


def library_call(node: Node, dnn: dict[str, Any] | None) -> tuple[str, dict[str, Any]] | None:
    """(routine, params) when the library's DNN routines compute whole ``node``, else None.

    ``convolution``: 2-D NCHW with symmetric padding -> ``conv2d_fwd`` (weight OIHW, output
    NCHW); ``attention``: q/k/v ``[..., S, D]`` with equal q and v head dims in the library's
    ``head_dims`` -> ``attention_fwd`` (leading dims flattened into the batch).  ``dnn`` is the
    family's ``[library.dnn]`` table (its dtypes and head dims); any other case decomposes."""
    if dnn is None or node.op not in ("convolution", "attention"):
        return None
    dtype = node.outputs[0].dtype.value
    if dtype not in dnn.get("dtypes", ()) or "routines" not in dnn:
        return None
    if node.op == "convolution":
        from ..nn_ops import _conv_geometry
        x, w = node.inputs
        if len(x.shape) != 4 or "conv2d_fwd" not in dnn["routines"]:
            return None
        stride, pads, dil, groups, _, _ = _conv_geometry("convolution", x.shape, w.shape[2:], node.attrs)
        if any(lo != hi for lo, hi in pads):
            return None
        n, c, h, wd = x.shape
        return "conv2d_fwd", {"n": n, "c": c, "h": h, "w": wd, "k": w.shape[0], "r": w.shape[2],
                              "s": w.shape[3], "stride": tuple(stride),
                              "padding": tuple(lo for lo, _ in pads), "dilation": tuple(dil),
                              "groups": groups, "dtype": dtype}
    q, k, v = node.inputs
    d = q.shape[-1]
    if ("attention_fwd" not in dnn["routines"] or v.shape[-1] != d
            or d not in dnn.get("attention", {}).get("head_dims", ())):
        return None
    scale = node.attrs.get("scale")
    return "attention_fwd", {"batch": math.prod(q.shape[:-2]), "heads": 1, "seq_q": q.shape[-2],
                             "seq_k": k.shape[-2], "head_dim": d,
                             "causal": bool(node.attrs.get("causal", False)),
                             "scale": 1.0 / math.sqrt(d) if scale is None else float(scale),
                             "dtype": dtype}


def lowerable(op: str) -> bool:
    """Whether the shared code generators lower primitive ``op`` themselves."""
    return (op in codegen.ELEMENTWISE or op in ("where", "cast") or op in codegen.LAYOUT
            or op in codegen.REDUCTIONS or op in _GEMM or op in _COLLECTIVE
            or OPS[op].kind == "indexed")


def unsupported(graph: Graph, routed: frozenset[str] = frozenset()) -> dict[str, str]:
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
