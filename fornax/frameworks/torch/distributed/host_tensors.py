"""CPU tensors on a fornax group: served by gloo, as in a ``"cpu:gloo,fornax:fornax"`` group.

c10d hands the whole group to a backend whose creator returns a Python ProcessGroup, so
the fornax group must serve a mixed group's CPU half itself (``gather_object``,
``torch.distributed.checkpoint``'s planning and a DDP's CPU buffers go through it).  CPU
tensors travel over a gloo group of their own, made on first use under a prefix of the
group's store: it is separate from the exchange's, whose operations run lazily when the
simulated device reaches them, so the two sequences never interleave differently on
different ranks.  No simulated time is charged: CPU collectives are host work.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_leaves

#: ProcessGroup methods gloo serves under the same name and arguments
GLOO_METHODS = ("allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather",
                "_allgather_base", "allgather_coalesced", "reduce_scatter", "_reduce_scatter_base",
                "alltoall_base", "alltoall", "scatter", "gather", "send", "recv")


def on_host(args: tuple) -> bool:
    """Whether a collective's tensor arguments are all CPU tensors (and there is one)."""
    tensors = [t for t in tree_leaves(args) if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(t.device.type == "cpu" for t in tensors)


class HostGroup:
    """The gloo group a fornax group's CPU tensors use, made when first needed."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta):
        self._args = (dist.PrefixStore("fornax-cpu", store), rank, size, timeout)
        self._pg: dist.ProcessGroupGloo | None = None

    def get(self) -> dist.ProcessGroupGloo:
        if self._pg is None:
            self._pg = dist.ProcessGroupGloo(*self._args)
        return self._pg

    def abort(self) -> None:
        if self._pg is not None:
            self._pg.abort()


def _served(name: str, method: Any) -> Any:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if on_host(args):
            return getattr(self.host.get(), name)(*args, **kwargs)
        return method(self, *args, **kwargs)
    return wrapper


def serve_host_tensors(cls: type) -> type:
    """Wrap ``cls``'s collectives in :data:`GLOO_METHODS` so CPU tensors go to its
    ``host`` (:class:`HostGroup`); fornax tensors take the method as written."""
    for name in GLOO_METHODS:
        setattr(cls, name, _served(name, getattr(cls, name)))
    return cls
