"""Concatenation of many tensors (``aten::cat`` / ``aten::stack``) as a tree of narrow concats.

A graph ``concat`` of N operands compiles to a kernel in which every output lane
loads through each of the N operands (masked where that operand does not reach): work and
live tile memory grow as N x output.  ``torch.stack`` of 1,024 rows of 512 elements then
touches half a billion elements and holds gigabytes of tiles.  Concatenating at most
:data:`FAN_IN` operands at a time, then the groups, keeps each kernel narrow: about
``FAN_IN x output`` per level and two levels for a thousand operands.  The values and
their order are the same; only the kernels differ.

:func:`nonempty` is the eager rule for a ``cat`` whose zero-size inputs sit beside non-empty ones.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

#: operands per concat kernel
FAN_IN = 16


def concat(ctx, vals: list, axis: int):
    """``concat`` of ``vals`` along ``axis`` in groups of at most :data:`FAN_IN`."""
    vals = list(vals)
    while len(vals) > FAN_IN:
        vals = [group[0] if len(group) == 1 else ctx.op("concat", *group, axis=axis)
                for group in (vals[i:i + FAN_IN] for i in range(0, len(vals), FAN_IN))]
    return vals[0] if len(vals) == 1 else ctx.op("concat", *vals, axis=axis)


def nonempty(session, info, op, args, kwargs, meta):
    """``aten::cat`` of zero-size inputs beside non-empty ones (a key/value cache's first
    update): the zero-size ones add no elements, so the others are concatenated on the
    device.  Every input still takes part in PyTorch's shape checks and in the result's type
    promotion (``meta`` runs the call on meta tensors first).  None when the call is not
    such a cat."""
    tensors = args[0] if args else kwargs.get("tensors")
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    keep = [t for t in tensors if t.numel() != 0]
    if not keep or len(keep) == len(tensors):
        return None
    metas = meta(info, op, args, kwargs)
    if not isinstance(metas, tuple) or metas[0][0] is None:
        return None
    dtype = metas[0][0].dtype
    out = aten.cat.default(keep, args[1] if len(args) > 1 else kwargs.get("dim", 0))
    if out.dtype != dtype:
        out = aten._to_copy.default(out, dtype=dtype)
    session.stats.record(info.name, "decomposed",
                         "zero-size inputs add no elements: the others are concatenated on the device")
    return out
