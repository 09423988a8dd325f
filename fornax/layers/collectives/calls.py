"""A rank's collective call as the communicator queues it (:class:`Call`), and the names of
the collectives and reductions.

Every rank must issue the same collectives in the same order; a collective
executes once every rank's oldest pending call has the same
:meth:`Call.signature` (op, count, dtype, reduction, root and algorithm); a
send executes with its peer's matching recv.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import DType

#: the collectives every rank joins (send and recv pair up instead)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
#: reduction name -> the pointwise ISA function that combines two partial results
#: (``avg`` sums, then divides by the rank count once)
REDUCTIONS = {"sum": "add", "max": "max", "min": "min", "avg": "add"}

#: what ranks must agree on: (op, count, dtype, reduction, root, algorithm)
Signature = tuple[str, int, DType, str | None, int | None, str | None]


@dataclass(eq=False)
class Call:
    """One call a rank made: its buffers (device addresses), count and options."""

    rank: int
    seq: int                         # 1-based index of this call among the rank's calls
    op: str
    count: int
    dtype: DType
    send: int
    recv: int
    reduction: str | None = None
    root: int | None = None
    peer: int | None = None
    algorithm: str | None = None
    done: bool = False

    def signature(self) -> Signature:
        return (self.op, self.count, self.dtype, self.reduction, self.root, self.algorithm)

    def peer_rank(self) -> int:
        """The other rank of a send or recv."""
        if self.peer is None:
            raise ValueError(f"{self.op} (call #{self.seq} of rank {self.rank}) names no peer")
        return self.peer

    def root_rank(self) -> int:
        """The root of a broadcast."""
        if self.root is None:
            raise ValueError(f"{self.op} (call #{self.seq} of rank {self.rank}) names no root")
        return self.root

    def reduction_name(self) -> str:
        """The reduction (``sum``, ``avg``, ...) of an all-reduce or reduce-scatter."""
        if self.reduction is None:
            raise ValueError(f"{self.op} (call #{self.seq} of rank {self.rank}) names no reduction")
        return self.reduction
