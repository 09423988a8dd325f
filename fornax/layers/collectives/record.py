"""What an executed collective reports: :class:`CollectiveRecord` and the bus-bandwidth factors.

Bus bandwidth is computed as nccl-tests does: ``algbw = S / t`` and
``busbw = algbw * BUS_FACTOR[op](N)`` with ``2(N-1)/N`` for all-reduce,
``(N-1)/N`` for all-gather, reduce-scatter and all-to-all, ``1`` for
broadcast and send/recv (``S``: the all-reduce buffer, the gathered output,
the reduce-scatter input, the all-to-all buffer of one rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

#: collective name -> nccl-tests bus-bandwidth factor as a function of N
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


@dataclass
class CollectiveRecord:
    """One executed collective (or send/recv pair), for the library report."""

    op: str                          # all_reduce, all_gather, ... send_recv
    call: str                        # the family's name: ncclAllReduce, ccl::allreduce, ...
    ranks: int
    count: int
    dtype: str
    bytes: int                       # S, as nccl-tests counts it
    algorithm: str
    reason: str
    time_s: float
    algbw: float                     # bytes / s
    busbw: float                     # bytes / s
    reduction: str | None = None
    root: int | None = None
    start_s: float = 0.0
    copies: int = 0
    kernels: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "op", "call", "ranks", "count", "dtype", "bytes", "algorithm", "reason", "time_s",
            "algbw", "busbw", "reduction", "root", "start_s", "copies", "kernels")}
