"""torch.distributed on fornax: the ``fornax`` backend for ``fornax`` tensors.

``import fornax.frameworks.torch`` registers it, so ``dist.init_process_group("fornax")``
(or ``"cpu:gloo,fornax:fornax"`` for a group that also serves CPU tensors) works in each
rank's process, as torchrun starts them (one process per simulated device)::

    import torch, torch.distributed as dist
    import fornax.frameworks.torch
    dist.init_process_group("fornax")
    x = torch.ones(4, device="fornax")
    dist.all_reduce(x)

Each collective runs the stack's collective library's algorithm choice on the fabric
between the ranks' devices, moves the real bytes between the processes and reconciles the
ranks' simulated clocks (:mod:`.process_group`).  :func:`report` gives this rank's
collectives.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .process_group import BACKEND, ProcessGroupFornax

_registered = False


def _create(store: dist.Store, rank: int, size: int, timeout: Any) -> ProcessGroupFornax:
    return ProcessGroupFornax(store, rank, size, timeout)


def register() -> None:
    """Register the ``fornax`` backend with torch.distributed for the ``fornax`` device (once
    per process; a backend of that name registered by someone else is left alone)."""
    global _registered
    if _registered or not dist.is_available():
        return
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, devices=["fornax"])
    _registered = True


def process_group(group: Any = None) -> ProcessGroupFornax | None:
    """The fornax backend of ``group`` (default: the world), or None if it has none."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        backend = pg._get_backend(dist.distributed_c10d._get_pg_default_device(pg)) \
            if not isinstance(pg, ProcessGroupFornax) else pg
    except RuntimeError:
        return None
    return backend if isinstance(backend, ProcessGroupFornax) else None


def report(group: Any = None) -> dict[str, Any] | None:
    """This rank's collectives on ``group``'s fornax backend (None without one)."""
    pg = process_group(group)
    return pg.report() if pg is not None else None


__all__ = ["BACKEND", "ProcessGroupFornax", "process_group", "register", "report"]
