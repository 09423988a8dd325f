"""The graph lowering of ``aten::histc`` for integer tensors (``torch.compile`` path).

PyTorch's CPU ``histc`` takes floating-point tensors only; accelerators also count integer
tensors, and a mixture-of-experts layer of ``transformers`` calls
``torch.histc(expert_ids.int(), ...)`` on every device but the CPU. The eager device computes
that with :mod:`..histogram`; a compiled graph reaches this lowering, which builds the same
integer arithmetic out of graph ops, so the node runs on the device instead of being sent
to a CPU that cannot run it:

* ``min``/``max`` as the input's integer type holds them; when equal, the data's own
  minimum and maximum (computed in the graph); an empty range widened by one each side;
* ``x`` with ``min <= x <= max`` counts in bin ``(x - min) * bins // (max - min)`` (int64),
  ``x == max`` in the last bin; other elements count nowhere (a spare bin, dropped);
* the counts have the input's dtype.

Floating-point inputs are not lowered here (their bin arithmetic is the CPU kernel's
float rounding): they keep running with PyTorch.
"""

from __future__ import annotations

import math

from fornax.frameworks.builders import full, reshape
from fornax.layers.graph import DType

from ..histc_bounds import bound
from .dtypes import DTYPE_TO_TORCH
from .table import lowering


@lowering("aten::histc.default")
def histc(ctx, self, bins=100, min=0, max=0):
    if self.dtype.is_float or self.dtype is DType.BOOL:
        raise ctx.fail(f"histc of {self.dtype.value} runs with PyTorch (only integer inputs are lowered)")
    if bins <= 0 or not all(math.isfinite(float(v)) for v in (min, max)):
        raise ctx.fail("invalid bins or range: PyTorch raises its own error")
    torch_dtype = DTYPE_TO_TORCH[self.dtype]
    lo, hi = bound(min, torch_dtype), bound(max, torch_dtype)
    if lo > hi:
        raise ctx.fail("max < min: PyTorch raises its own error")
    i64 = DType.INT64
    n = math.prod(self.shape)
    x = ctx.cast(reshape(ctx, self, (n,)), i64)
    if lo == hi:                                    # the data's own range
        lo_v = reshape(ctx, ctx.op("reduce_min", x, axis=0, keepdims=True), ())
        hi_v = reshape(ctx, ctx.op("reduce_max", x, axis=0, keepdims=True), ())
        same = ctx.op("eq", lo_v, hi_v)
        lo_v = ctx.op("where", same, ctx.op("sub", lo_v, ctx.scalar(1, i64)), lo_v)
        hi_v = ctx.op("where", same, ctx.op("add", hi_v, ctx.scalar(1, i64)), hi_v)
    else:
        lo_v, hi_v = ctx.scalar(lo, i64), ctx.scalar(hi, i64)
    inside = ctx.op("logical_and", ctx.op("ge", x, lo_v), ctx.op("le", x, hi_v))
    pos = ctx.op("floor_divide", ctx.op("mul", ctx.op("sub", x, lo_v), ctx.scalar(bins, i64)),
                 ctx.op("sub", hi_v, lo_v))
    pos = ctx.op("minimum", pos, ctx.scalar(bins - 1, i64))
    pos = ctx.op("where", inside, pos, ctx.scalar(bins, i64))          # uncounted: the spare bin
    counts = ctx.op("scatter", full(ctx, (bins + 1,), 0, i64), pos, full(ctx, (n,), 1, i64),
                    axis=0, mode="add")
    counts = ctx.op("slice", counts, start=(0,), stop=(bins,))
    return ctx.cast(counts, ctx.out())
