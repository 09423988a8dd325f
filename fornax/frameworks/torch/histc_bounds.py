"""The ``min``/``max`` bounds of an integer ``torch.histc``, as the input's integer type holds them.

Accelerators cast the bounds to the input's integer type before counting; the eager kernel
(:mod:`.histogram`) and the graph lowering (:mod:`.lowering.histc`) both use :func:`bound`, so
the two routes bin alike.
"""

from __future__ import annotations

import torch


def bound(value: float, dtype: torch.dtype) -> int:
    """A ``histc`` bound as the input's integer type holds it (``int()`` truncates toward
    zero, as the C++ cast does)."""
    v = int(value)
    info = torch.iinfo(dtype)
    span = info.max - info.min + 1
    return (v - info.min) % span + info.min        # wrap into the type, as the narrowing cast does
