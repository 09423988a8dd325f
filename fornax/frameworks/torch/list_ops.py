"""The ``_foreach_*`` list ops on the device: when an in-place one may write all its tensors at
once.  PyTorch defines a list op position by position, in order; a device plan computes every
position from the inputs as they were, which is the same unless a tensor the op writes is
also read at another position."""

from __future__ import annotations

import torch

from . import tensors as T


def crossed(args, kwargs) -> bool:
    """Whether a tensor of a list op's first list shares memory with a tensor at another
    position of its lists (computed at once, the positions would see each other's old values)."""
    spans = []
    for x in (*args, *kwargs.values()):
        if isinstance(x, (list, tuple)):
            for pos, t in enumerate(x):
                if isinstance(t, torch.Tensor) and T.is_fornax(t) and t.numel():
                    size = t.element_size()
                    lo = t.untyped_storage().data_ptr() + int(t.storage_offset()) * size
                    hi = lo + (sum((int(d) - 1) * abs(int(st)) for d, st in zip(t.shape, t.stride())) + 1) * size
                    spans.append((lo, hi, pos))
    spans.sort()
    reach, owner = -1, -1
    for lo, hi, pos in spans:
        if lo < reach and pos != owner:
            return True
        if hi > reach:
            reach, owner = hi, pos
    return False
