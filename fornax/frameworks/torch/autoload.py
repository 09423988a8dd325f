"""PyTorch's device-backend autoload: ``import torch`` registers the ``fornax`` device.

The package declares this function under the ``torch.backends`` entry-point group, which
``import torch`` walks (``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` opts out).  Registering then,
before anything else imports ``torch.testing._internal.common_utils``, is what lets
PyTorch's device-generic test harness see ``fornax`` as a native device type.
"""

from __future__ import annotations


def autoload() -> None:
    """Register the ``fornax`` PrivateUse1 backend (idempotent)."""
    from . import register
    register.register()
