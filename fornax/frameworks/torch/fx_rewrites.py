"""Rewrites of an FX node just before it is lowered (the ``torch.compile`` and export paths).

The fornax graph IR has no zero-element tensors and no uninitialised memory, but
AOTAutograd's graphs (and transformers' mask code) use both:

* the allocation ops (``empty``, ``empty_like``, ``empty_permuted``, ``empty_strided``,
  ``new_empty``, ``new_empty_strided``) lower as ``zeros`` of the node's shape: their values
  are unspecified, so zeros are as good as any, and the graph need not be split around them
  to allocate on the CPU;
* ``cat`` drops its zero-element pieces (they contribute nothing; transformers builds causal
  masks by concatenating an empty past with the present), so it no longer runs with PyTorch
  on the CPU for want of a graph value for the empty piece.

Everything else is lowered as it stands. And a node that cannot be lowered but is a
library's own operator (``torch.library.custom_op``, e.g. ``transformers::grouped_mm_fallback``,
whose data-dependent loop no static graph holds) with a device-generic implementation runs
that implementation eagerly on the device its operands are on (:func:`eager_on_device`),
ATen op by ATen op, instead of with PyTorch on the CPU.
"""

from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten

#: ops whose result has unspecified values: lowered as zeros of the node's shape and dtype
UNINITIALISED = frozenset({aten.empty.memory_format, aten.empty_permuted.default,
                           aten.empty_strided.default, aten.new_empty.default,
                           aten.new_empty_strided.default, aten.empty_like.default})


def _is_empty(arg) -> bool:
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.numel() == 0


def rewrite(node: torch.fx.Node) -> tuple:
    """``(target, args, kwargs)`` to lower for ``node`` (its own unless rewritten above)."""
    val = node.meta.get("val")
    if node.target in UNINITIALISED and isinstance(val, torch.Tensor):
        return aten.zeros.default, (list(val.shape),), {"dtype": val.dtype}
    tensors = node.args[0] if node.args else None
    if node.target is aten.cat.default and isinstance(tensors, (list, tuple)):
        pieces = [a for a in tensors if not _is_empty(a)]
        if pieces and len(pieces) < len(tensors):
            return node.target, (pieces, *node.args[1:]), dict(node.kwargs)
    return node.target, node.args, dict(node.kwargs)


#: operator namespaces of PyTorch itself: their ops have CPU kernels, no portable Python body
_TORCH_NAMESPACES = frozenset({"aten", "prims", "prim", "quantized", "_c10d_functional",
                               "c10d_functional", "_dtensor", "higher_order", "inductor"})


def eager_on_device(node: torch.fx.Node) -> str | None:
    """Why ``node`` (not lowerable) may run eagerly where its operands are, or ``None``: it is
    a library's custom operator whose implementation is device-generic (a
    ``CompositeExplicitAutograd`` kernel: Python composing ATen ops) or registered for the
    ``fornax`` device itself."""
    op = node.target
    if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload) \
            or op.namespace in _TORCH_NAMESPACES:
        return None
    name = op.name()
    for key in ("PrivateUse1", "CompositeExplicitAutograd"):
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            return (f"{name}: a library's custom operator (no graph lowering); its {key} "
                    f"implementation runs eagerly where its operands are, ATen op by op")
    return None
