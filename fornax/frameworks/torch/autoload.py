"""PyTorch's device-backend autoload: ``import torch`` registers the ``fornax`` device.

The package declares this function under the ``torch.backends`` entry-point group, which
``import torch`` walks (``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` opts out).  Registering then,
before anything else imports ``torch.testing._internal.common_utils``, is what lets
PyTorch's device-generic test harness see ``fornax`` as a native device type.

When the first import is fornax's own (``import fornax.frameworks.torch``), that import is
what imports torch, and it is still under way when torch calls this hook: the registration
module is then half-initialised, and it registers the device itself once torch is in place.
"""

from __future__ import annotations

import sys

_REGISTER = "fornax.frameworks.torch.register"


def autoload() -> None:
    """Register the ``fornax`` PrivateUse1 backend (idempotent)."""
    pending = sys.modules.get(_REGISTER)
    if pending is not None and not hasattr(pending, "register"):
        return        # fornax's own import is importing torch: it registers when torch is ready
    from . import register
    register.register()
