"""What the shared profiling collector records: one host-side API call (:class:`ApiRecord`)
and the device work it caused — a kernel (:class:`KernelActivity`) or a copy
(:class:`CopyActivity`) — joined by a correlation id.

Times are simulated seconds: an API call's ``start_s``/``end_s`` on the host's simulated
clock (a synchronising call spans the wait; every other call takes no simulated time), the
device work's on the device timeline, so both sit on one time base.  ``wall_ns`` is the host
wall time the call took in this process, a different clock that is never mixed with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ApiRecord:
    """One API call of the runtime or driver seam (the outermost one per seam and thread)."""

    domain: str                 # "runtime" or "driver"
    call: str                   # the seam's generic operation ("launch", "memcpy_h2d", ...)
    name: str                   # the family's API name for it ([runtime.calls] / [driver.calls])
    correlation: int
    thread: int                 # 1, 2, ... in order of the host threads' first call
    start_s: float = 0.0
    end_s: float = 0.0
    wall_ns: int = 0
    error: str | None = None    # the error the call raised, if any

    kind = "api"


@dataclass(slots=True)
class KernelActivity:
    """One kernel that ran on a device, with its hardware-counter-like metrics
    (fornax's metric keys, :mod:`.metrics`)."""

    name: str
    device: int
    queue: int                  # the hardware queue's id on its device timeline
    start_s: float
    end_s: float
    correlation: int
    grid: tuple[int, int, int]
    launch: int                 # the driver's launch number (KernelRecord.launch)
    metrics: dict[str, float] = field(default_factory=dict)
    flops: float = 0.0          # FLOPs counted (matrix and vector)

    kind = "kernel"

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(slots=True)
class CopyActivity:
    """One copy that ran on a copy engine or peer link."""

    direction: str              # "h2d", "d2h", "d2d" or "peer"
    bytes: int
    device: int
    queue: int
    start_s: float
    end_s: float
    correlation: int

    kind = "memcpy"

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


Activity = KernelActivity | CopyActivity
Record = ApiRecord | KernelActivity | CopyActivity
