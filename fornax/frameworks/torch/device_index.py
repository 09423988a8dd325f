"""The index of a ``fornax`` device argument: the PyTorch face addresses device 0 only.

Every hook of :mod:`.device`, the storage and copy kernels of :mod:`.register` and the
factories that name a device (:mod:`.requested`) refuse any other index the same way.
"""

from __future__ import annotations

import os

import torch

from .session import DeviceError


def device_index(device: torch.device | str | int | None) -> int:
    """The index ``device`` names (None: 0); a ``ValueError`` for a device of another type, a
    :class:`~.session.DeviceError` for a fornax index other than 0."""
    if device is None:
        return 0
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "fornax":
            raise ValueError(f"expected a fornax device, got {device}")
        index = device.index or 0
    else:
        index = int(device)
    if index != 0:
        if "LOCAL_RANK" in os.environ:     # under torchrun: one device per process
            raise DeviceError(f"fornax device {index} does not exist: each rank's process simulates "
                              "one device, as with one GPU visible per process (CUDA_VISIBLE_DEVICES)",
                              seam="framework",
                              hint=f"use fornax:0 (or 'fornax') in every rank, not LOCAL_RANK "
                                   f"({os.environ['LOCAL_RANK']})")
        raise DeviceError(f"fornax device {index} does not exist: the PyTorch face addresses "
                          "device 0 only", seam="framework",
                          hint="use fornax:0; multi-device runs go through `fornax compose --devices N` "
                               "or torchrun (one process per device)")
    return index
