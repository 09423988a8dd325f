"""``torch.histc`` of integer tensors, as accelerators compute it.

PyTorch's CPU ``histc`` takes floating-point tensors only, while its CUDA kernel also
counts integer tensors, and libraries rely on that: a mixture-of-experts layer (the
``grouped_mm`` experts of ``transformers``) calls ``torch.histc(expert_ids.int(), ...)``
whenever the device is not the CPU.  Sending that call to the CPU fallback fails
(``"histogram_cpu" not implemented for 'Int'``), and converting the input to float would
hand the CPU a dtype the caller never used.  So integer inputs are counted here with
CUDA's integer arithmetic, composed of ordinary ATen ops that run on the device:

* ``min``/``max`` are cast to the input's integer type (truncated toward zero); when
  they are equal (the default 0, 0) the data's own minimum and maximum are used, and an
  empty range is widened by one on each side;
* an element ``x`` with ``min <= x <= max`` falls in bin ``(x - min) * bins // (max - min)``
  (computed in int64), ``x == max`` in the last bin; other elements are not counted;
* the counts have the input's dtype.

Floating-point inputs take the device's usual route; argument errors are PyTorch's own,
raised before anything runs on the device.
"""

from __future__ import annotations

import math

import torch

from . import eager
from .histc_bounds import bound

aten = torch.ops.aten


def histc(self: torch.Tensor, bins: int = 100, min=0, max=0) -> torch.Tensor:
    if self.dtype.is_floating_point or self.dtype.is_complex or self.dtype == torch.bool:
        return eager.dispatch(aten.histc.default, self, bins, min, max)
    if bins <= 0:
        raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for dimension 0")
    if not all(math.isfinite(float(v)) for v in (min, max)):
        raise RuntimeError(f"torch.histc: range of [{float(min)}, {float(max)}] is not finite")
    lo, hi = bound(min, self.dtype), bound(max, self.dtype)
    if lo > hi:
        raise RuntimeError("torch.histc: max must be larger than min")
    flat = self.reshape(-1).to(torch.int64)
    if lo == hi and flat.numel() > 0:
        lo, hi = int(flat.min()), int(flat.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    counts = torch.zeros(bins + 1, dtype=torch.int64, device=self.device)
    if flat.numel():
        inside = (flat >= lo) & (flat <= hi)
        pos = torch.div((flat - lo) * bins, hi - lo, rounding_mode="floor").clamp(max=bins - 1)
        pos = torch.where(inside, pos, torch.full_like(pos, bins))     # uncounted: the spare bin
        counts = counts.scatter_add(0, pos, torch.ones_like(pos))
    return counts[:bins].to(self.dtype)


def histc_out(self: torch.Tensor, bins: int = 100, min=0, max=0, *, out: torch.Tensor) -> torch.Tensor:
    result = histc(self, bins, min, max)
    if out.dtype != result.dtype:
        raise RuntimeError(f"torch.histogram: input tensor and hist tensor should have the same "
                           f"dtype, but got input {_c_name(self.dtype)} and hist {_c_name(out.dtype)}")
    if tuple(out.shape) != tuple(result.shape):
        out.resize_(result.shape)
    out.copy_(result)
    return out


def _c_name(dtype: torch.dtype) -> str:
    """The C type name PyTorch's messages use (``int``, ``long``, ``float``, ...)."""
    return {torch.int32: "int", torch.int64: "long", torch.int16: "short", torch.int8: "signed char",
            torch.uint8: "unsigned char", torch.float32: "float", torch.float64: "double",
            torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16"}.get(dtype, str(dtype))


KERNELS = {"histc": histc, "histc.out": histc_out}
