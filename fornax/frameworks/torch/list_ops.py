"""The ``_foreach_*`` list ops on the device: when an in-place one may write all its tensors at
once.  PyTorch defines a list op position by position, in order; a device plan computes every
position from the inputs as they were, which is the same unless a tensor the op writes is
also read at another position."""

from __future__ import annotations

import torch

from . import tensors as T


def crossed(args, kwargs) -> bool:
    """Whether a tensor of a list op's first list (the one it writes) shares memory with a
    tensor at another position of its lists (computed at once, those positions would see each
    other's old values; two reads at different positions never matter)."""
    spans = []
    for k, x in enumerate((*args, *kwargs.values())):
        if isinstance(x, (list, tuple)):
            for pos, t in enumerate(x):
                if isinstance(t, torch.Tensor) and T.is_fornax(t) and t.numel():
                    size = t.element_size()
                    lo = t.untyped_storage().data_ptr() + int(t.storage_offset()) * size
                    hi = lo + (sum((int(d) - 1) * abs(int(st)) for d, st in zip(t.shape, t.stride())) + 1) * size
                    spans.append((lo, hi, pos, k == 0))
    spans.sort()
    live: list[tuple[int, int, int, bool]] = []      # spans that reach past the current start
    for lo, hi, pos, written in spans:
        live = [s for s in live if s[1] > lo]
        if any(other != pos and (written or wrote) for _, _, other, wrote in live):
            return True
        live.append((lo, hi, pos, written))
    return False
