"""The driver's record of executed kernels: :class:`KernelRecord` and the bounded
:class:`KernelLog` the report reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class KernelRecord:
    """One kernel that ran: simulated duration (s), counted FLOPs and bytes, roofline bound."""

    name: str
    grid: tuple[int, int, int]
    duration_s: float
    flops: float
    bytes: int
    bound: str
    launch: int = 0          # the driver's launch number (counts["launches"] when it was launched)


class KernelLog(list[KernelRecord]):
    """The driver's kernel records, oldest first.  A long-lived process bounds it with
    ``limit``: past it the oldest half goes, and ``dropped``/``dropped_flops`` keep count,
    so :attr:`total` and :attr:`flops` still cover every kernel that ran."""

    def __init__(self, limit: int | None = None):
        super().__init__()
        self.limit = limit
        self.dropped = 0
        self.dropped_flops = 0.0

    def append(self, record: KernelRecord) -> None:
        super().append(record)
        if self.limit is not None and len(self) > self.limit:
            drop = len(self) - self.limit // 2
            self.dropped_flops += sum(r.flops for r in self[:drop])
            del self[:drop]
            self.dropped += drop

    @property
    def total(self) -> int:
        return self.dropped + len(self)

    @property
    def flops(self) -> float:
        return self.dropped_flops + sum(r.flops for r in self)
