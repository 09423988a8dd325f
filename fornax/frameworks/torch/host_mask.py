"""Dropout on the device with its mask drawn from the host generator.

Seeded random ops run on the CPU so that ``torch.manual_seed`` reproduces PyTorch CPU's
numbers, which costs a round trip: the input comes to the host (a synchronisation), and
the results go back.  ``aten::native_dropout`` draws nothing from its input, though: CPU's
kernel fills a fresh tensor of the input's shape and dtype with ``bernoulli_(1 - p)`` and
returns ``input * (mask * scale)``.  So here the mask is drawn exactly that way from the
CPU generator (the same draws, the generator left in the same state), sent to the device
with one host-to-device copy and no wait, and the product is a device kernel, computed as
CPU computes it (``mask * scale`` rounded to the input's dtype, then the product).

A call this does not take (evaluation mode, ``p`` of 0 or 1, a non-contiguous input, whose
mask CPU lays out in its memory order, or a dtype other than the floats) runs on the CPU
as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...layers.graph import Graph
from . import tensors as T
from .lowering import TORCH_TO_DTYPE
from .session import Session

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

#: what the device route says of the calls it takes (the report's reason)
REASON = "its mask is drawn from the host generator as PyTorch CPU draws it, the product runs on the device"


def _graph(shape: tuple[int, ...], dtype: torch.dtype, scale: float) -> Graph:
    dt = TORCH_TO_DTYPE[dtype]
    wide = dt if dtype in (torch.float32, torch.float64) else TORCH_TO_DTYPE[torch.float32]
    g = Graph("native_dropout")
    x = g.input("x", shape, dt)
    mask = g.input("mask", shape, TORCH_TO_DTYPE[torch.bool])
    keep = g.op("mul", g.op("cast", mask, dtype=wide.value),
                g.constant(np.array(scale).astype(wide.numpy), "scale"))
    if wide is not dt:                       # mask.to(dtype) * scale is rounded to the dtype
        keep = g.op("cast", g.op("cast", keep, dtype=dt.value), dtype=wide.value)
    out = g.op("mul", x if wide is dt else g.op("cast", x, dtype=wide.value), keep)
    g.output(out if wide is dt else g.op("cast", out, dtype=dt.value))
    return g


def dropout(session: Session, args: tuple, kwargs: dict, cached_plan: Callable[..., Any],
            stream: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``native_dropout(input, p, train)`` on the device, or None when it does not take the
    call (see the module docstring)."""
    bound: dict[str, Any] = dict(zip(("input", "p", "train"), args))
    bound.update(kwargs)
    x, p, train = bound.get("input"), bound.get("p"), bound.get("train", None)
    if not (isinstance(x, torch.Tensor) and T.is_fornax(x) and isinstance(p, float) and 0.0 < p < 1.0
            and train in (None, True) and x.dtype in _DTYPES and x.numel() > 0 and x.is_contiguous()):
        return None
    shape = tuple(x.shape)
    # CPU's kernel: mask = empty_like(input).bernoulli_(1 - p), from the default generator
    host = torch.empty(shape, dtype=x.dtype).bernoulli_(1.0 - p).bool()
    mask = T.staged(host.numpy(), shape, torch.bool, session, stream)
    scale = 1.0 / (1.0 - p)
    plan = cached_plan(session, ("native_dropout", shape, x.dtype, scale),
                       lambda: _graph(shape, x.dtype, scale))
    out = T.empty(shape, x.dtype, session=session)
    plan([T.address(x, session), T.address(mask, session)], [T.address(out, session)], stream)
    return out, mask
