"""The device an op's own ``device=`` argument asks for.

A factory that reaches the ``fornax`` key because of a fornax tensor argument
(``torch.zeros_like(x, device="cpu")``, ``x.new_full(..., device="cpu")``) may still be asked
to put its result elsewhere; PyTorch's samples do so on purpose.  Such a call runs on the
host and its result stays where it was asked to be.
"""

from __future__ import annotations

import torch

from .device_index import device_index
from .tensors import DEVICE

_POSITION: dict = {}


def device_argument(op, args, kwargs) -> torch.device | None:
    """The ``device`` argument of an ATen op call, or None when the op has none or it is unset."""
    pos = _POSITION.get(op)
    if pos is None:
        names = [a.name for a in op._schema.arguments]
        pos = _POSITION[op] = names.index("device") if "device" in names else -1
    if pos < 0:
        return None
    value = kwargs["device"] if "device" in kwargs else args[pos] if pos < len(args) else None
    return None if value is None else torch.device(value)


def check_index(device: torch.device | None) -> None:
    """Refuse a ``device=fornax:N`` (an op's :func:`device_argument`) the PyTorch face cannot
    address, as ``empty`` and ``.to`` do: every factory the same way, before anything is
    allocated."""
    if device is not None and device.type == DEVICE and device.index:
        device_index(device)


def elsewhere(device: torch.device | None) -> bool:
    """Whether an op's :func:`device_argument` asks for a device other than fornax."""
    return device is not None and device.type != DEVICE
