"""Lowering rules of jax's conversions: ``convert_element_type``, ``reduce_precision`` and the
identities (``copy``, ``optimization_barrier``, ``stop_gradient``).

float → integer conversion truncates toward zero and saturates at the target's range; NaN
becomes 0 (XLA CPU).  integer → integer wraps; x → bool is x != 0.  ``reduce_precision`` to
bfloat16's or float16's format rounds through a cast; narrowing the exponent flushes
results below the smallest normal to (signed) zero, as XLA does.  Refused:
``reduce_precision`` to formats other than bfloat16/float16/float32.
"""

from __future__ import annotations

import numpy as np

from ....layers.graph import DType
from ..lowering import device_dtype, lowering
from .common import clip, compute_dtype, in_dtype, int_range, out_dtype, scalar_like, where


def _float_to_int(ctx, x, jdt):
    """Truncation toward zero, saturating at the range of ``jdt``, NaN to 0 (XLA CPU).  The
    bounds lo and hi + 1 are powers of two (exact in any float); x is clamped to lo and the
    float below hi + 1, truncated through int64, and hi taken from hi + 1 up."""
    _, lo, hi, _ = int_range(jdt)
    x = ctx.cast(x, compute_dtype(x.dtype))
    x = where(ctx, ctx.op("isnan", x), scalar_like(ctx, x, 0), x)
    top = float(hi + 1)
    below = float(np.nextafter(x.dtype.numpy.type(top), 0))     # the largest float under top
    r = ctx.cast(clip(ctx, x, float(lo), below), DType.INT64)
    r = where(ctx, ctx.op("ge", x, scalar_like(ctx, x, top)), ctx.scalar(hi, DType.INT64), r)
    return ctx.cast(r, device_dtype(jdt))


@lowering("convert_element_type")
def convert_element_type(ctx, eqn, x):
    src, dst = in_dtype(eqn), out_dtype(eqn)
    sd, dd = device_dtype(src), device_dtype(dst)
    if dd is DType.BOOL:
        return x if sd is DType.BOOL else ctx.op("ne", x, scalar_like(ctx, x, 0))
    if dd.is_float or sd is DType.BOOL:
        return ctx.cast(x, dd)
    if sd.is_float:
        return _float_to_int(ctx, x, dst)
    return ctx.wrap(ctx.cast(x, dd), dst)


#: (exponent_bits, mantissa_bits) of the formats reduce_precision rounds to by a cast
_FORMATS = {(8, 7): DType.BFLOAT16, (5, 10): DType.FLOAT16, (8, 23): DType.FLOAT32, (11, 52): DType.FLOAT64}
_BITS = {dt: fmt for fmt, dt in _FORMATS.items()}


@lowering("reduce_precision")
def reduce_precision(ctx, eqn, x):
    """Round to a narrower format's mantissa (to nearest even, overflowing to inf) and, where the
    exponent narrows, flush results below its smallest normal to signed zero; the mantissa
    of such small values is rounded at the scale of their own exponent (not the format's
    subnormal grid), as XLA does."""
    e, m = int(eqn.params["exponent_bits"]), int(eqn.params["mantissa_bits"])
    out = device_dtype(out_dtype(eqn))
    src = compute_dtype(out)
    se, sm = _BITS[out]
    if e >= se and m >= sm:
        return x
    fmt = _FORMATS.get((e, m))
    if fmt is None:
        raise ctx.fail(f"reduce_precision to {e} exponent and {m} mantissa bits: fornax rounds only "
                       f"to the formats it has ({', '.join(f'{d.value} {k}' for k, d in _FORMATS.items())})")
    v = ctx.cast(x, src)
    y = ctx.cast(ctx.cast(v, fmt), src)
    if e < se:
        tiny = 2.0 ** (2 - (1 << (e - 1)))                     # the smallest normal of the format
        scale = 2.0 ** (m + 1)
        ys = ctx.op("div", ctx.cast(ctx.cast(ctx.op("mul", v, scalar_like(ctx, v, scale)), fmt), src), scalar_like(ctx, v, scale))
        kept = where(ctx, ctx.op("ge", ctx.op("abs", ys), scalar_like(ctx, v, tiny)), ys, ctx.op("mul", v, scalar_like(ctx, v, 0)))
        y = where(ctx, ctx.op("lt", ctx.op("abs", v), scalar_like(ctx, v, tiny)), kept, y)
    return ctx.cast(y, out)


@lowering("copy", "optimization_barrier", "stop_gradient")
def identity(ctx, eqn, *xs):
    """Values pass through (``stop_gradient`` only matters to differentiation, which has run)."""
    return list(xs)
