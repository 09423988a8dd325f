"""Concatenation of many tensors (``aten::cat`` / ``aten::stack``) as a tree of narrow concats.

A graph ``concat`` of N operands compiles to a kernel in which every output lane
loads through each of the N operands (masked where that operand does not reach): work and
live tile memory grow as N x output.  ``torch.stack`` of 1,024 rows of 512 elements then
touches half a billion elements and holds gigabytes of tiles.  Concatenating at most
:data:`FAN_IN` operands at a time, then the groups, keeps each kernel narrow: about
``FAN_IN x output`` per level and two levels for a thousand operands.  The values and
their order are the same; only the kernels differ.
"""

from __future__ import annotations

#: operands per concat kernel
FAN_IN = 16


def concat(ctx, vals: list, axis: int):
    """``concat`` of ``vals`` along ``axis`` in groups of at most :data:`FAN_IN`."""
    vals = list(vals)
    while len(vals) > FAN_IN:
        vals = [group[0] if len(group) == 1 else ctx.op("concat", *group, axis=axis)
                for group in (vals[i:i + FAN_IN] for i in range(0, len(vals), FAN_IN))]
    return vals[0] if len(vals) == 1 else ctx.op("concat", *vals, axis=axis)
