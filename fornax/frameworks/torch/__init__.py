"""PyTorch front end: ``import fornax.frameworks.torch`` makes ``torch.device("fornax")`` real.

* Eager: tensors on ``"fornax"`` live in simulated device memory allocated through the
  runtime seam; every ATen op reaching the device is routed by the active stack's
  framework seam (see :mod:`.eager`), and ``torch.fornax`` is the device module
  (:mod:`.device`).  ``torch.autocast("fornax")`` follows the family's policy.
* The stack: :func:`use_stack` before first use, else ``FORNAX_CONFIG`` /
  ``FORNAX_VENDOR``, else cuda-like (:mod:`.session`).
* :func:`report` says what happened: routes per ATen op, fallbacks with reasons.

Importing is idempotent: the backend is registered once per process.
"""

from __future__ import annotations

from .register import register as _register
from .session import DeviceError, current, use_stack

_register()


def report() -> dict:
    """What the torch front end did on the active stack: routes per ATen op (native,
    decomposed, fallback with reasons, views) and live device memory."""
    return current().report()


def stack():
    """The composed stack behind the ``fornax`` device."""
    return current().stack


__all__ = ["DeviceError", "current", "report", "stack", "use_stack"]
