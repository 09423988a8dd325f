"""One simulated device: a chip spec, its memory and its timeline."""

from __future__ import annotations

from .cost import KernelCost, copy_cost, kernel_cost
from .execute import Counters, execute
from .isa import Program
from .memory import AddressSpace, DeviceMemory
from .spec import ChipSpec
from .timeline import Timeline


class Device:
    def __init__(self, spec: ChipSpec, index: int = 0):
        self.spec = spec
        self.index = index
        self.memory = DeviceMemory(spec.hbm_bytes, spec.page_size, index)
        self.timeline = Timeline(spec.copy_engines)
        self.kernels_executed = 0
        self.bytes_copied = {"h2d": 0, "d2h": 0, "d2d": 0}

    def run_kernel(self, space: AddressSpace, program: Program, grid: tuple[int, int, int],
                   args: dict) -> tuple[Counters, KernelCost]:
        """Execute a kernel functionally and price it.  Called when its packet runs."""
        counters = execute(program, grid, args, space)
        self.kernels_executed += 1
        return counters, kernel_cost(self.spec, counters)

    def copy_duration(self, nbytes: int, direction: str) -> float:
        self.bytes_copied[direction] += nbytes
        return copy_cost(self.spec, nbytes, direction)
