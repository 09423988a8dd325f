"""PyTorch front end: ``import fornax.frameworks.torch`` makes ``torch.device("fornax")`` real.

* Eager: tensors on ``"fornax"`` live in simulated device memory allocated through the
  runtime seam; every ATen op reaching the device is routed by the active stack's
  framework seam (see :mod:`.eager`), and ``torch.fornax`` is the device module
  (:mod:`.device`).  ``torch.autocast("fornax")`` follows the family's policy.
* The stack: :func:`use_stack` before first use, else ``FORNAX_CONFIG`` /
  ``FORNAX_VENDOR``, else cuda-like (:mod:`.session`).
* Graph path: ``torch.compile(model, backend="fornax")`` (the backend is an entry point
  of the package) and :func:`export` lower core ATen through the stack's compiler seam
  (:mod:`.graph`).
* torch.distributed: the ``fornax`` backend (:mod:`.distributed`), one process per rank.
* :func:`report` says what happened: routes per ATen op, fallbacks with reasons.

Importing is idempotent: the backend is registered once per process.
"""

from __future__ import annotations

from .distributed import register as _register_distributed
from .register import register as _register
from .session import DeviceError, current, use_stack

_register()
_register_distributed()      # dist.init_process_group("fornax")


def report() -> dict:
    """What the torch front end did on the active stack: routes per ATen op (native,
    decomposed, fallback with reasons, views) and live device memory; with a torch.distributed
    world whose group has the fornax backend, this rank's collectives (``distributed``)."""
    from . import distributed
    rep = current().report()
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            rep["distributed"] = distributed.report()
    except (RuntimeError, ValueError):      # no default group: nothing to add
        pass
    return rep


def stack():
    """The composed stack behind the ``fornax`` device."""
    return current().stack


def export(model, args, kwargs=None):
    """``torch.export`` the model, lower its core-ATen program into fornax graphs compiled by
    the active stack, and return a callable taking the model's inputs (see :mod:`.graph`)."""
    from .exported import export as _export
    return _export(model, args, kwargs)


def register_backend() -> None:
    """Register the ``"fornax"`` torch.compile backend now (it is also found lazily through
    the ``torch_dynamo_backends`` entry point of the installed package)."""
    from .graph import register_backend as _register_backend
    _register_backend()


__all__ = ["DeviceError", "current", "export", "register_backend", "report", "stack", "use_stack"]
