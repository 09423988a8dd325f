"""Device work still pending on tensors' memory, waited for by the first op that touches it.

A collective whose result is handed out through ``Work.get_future()`` (DDP's buckets) has
no event a torch Future can carry to this device: torch 2.13's Python device guard records
and blocks on no events, so a Future cannot make the consumer's stream wait when it is
read.  Waiting at ``get_future()`` instead would stall the caller's stream there, and
DDP's backward pass could not overlap its all-reduces.  So the collective's tensors are
*deferred* here with the runtime event of its completion: the first fornax op that
touches one of their storages (a kernel, a copy, a host read or write, a compiled graph,
another collective) makes its own stream wait for that event first.  The tensors stay
referenced until then, so their memory cannot be handed to other work while the
collective still reads or writes it.

Entries whose work the host has already waited past are settled when new ones come, so
tensors nobody touches again do not pile up; a device reset drops them with the context.
The entries live on the session (``Session.deferred``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from .session import Session
from .stream_selection import runtime_stream


def defer(session: Session, tensors: list[torch.Tensor], event: Any, keep: list[torch.Tensor]) -> None:
    """Whatever touches ``tensors``' storages next waits for ``event`` first."""
    pending = session.deferred     # storage data pointer -> (the event, what to keep alive)
    _settle(session, pending)
    for t in tensors:
        if t.device.type == "fornax" and t.untyped_storage().nbytes():
            pending[t.untyped_storage().data_ptr()] = (event, keep)


def before_use(session: Session, *values: Any) -> None:
    """Make the current stream wait for pending work on any fornax tensor in ``values``."""
    pending = session.deferred
    if not pending:
        return
    for leaf in tree_leaves(values):
        if isinstance(leaf, torch.Tensor) and leaf.device.type == "fornax":
            entry = pending.pop(leaf.untyped_storage().data_ptr(), None)
            if entry is not None:
                session.runtime.stream_wait_event(runtime_stream(session), entry[0])


def _settle(session: Session, pending: dict[int, tuple[Any, list[torch.Tensor]]]) -> None:
    """Entries whose event the device has passed by the host's time are waited for (which
    orders the host after them and costs no simulated time) and dropped."""
    for key, (event, _) in list(pending.items()):
        if session.runtime.query_event(event):
            session.runtime.event_synchronize(event)
            del pending[key]
