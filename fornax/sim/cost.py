"""A first roofline cost model: a simulated duration for every kernel and copy.

A kernel takes the launch latency plus the larger of its compute time and
its memory time.  Compute time sums, per dtype, the counted FLOPs over the
matrix or vector peak, scaled by the efficiency a tuned kernel reaches on
real hardware and by wave quantisation (a grid that does not fill the last
wave of compute units leaves units idle).  Memory time is the counted bytes
over the HBM bandwidth at the measured streaming efficiency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .execute import Counters
from .spec import ChipSpec


@dataclass(frozen=True)
class KernelCost:
    duration_s: float
    compute_s: float
    memory_s: float
    launch_s: float
    wave_efficiency: float
    bound: str          # "compute", "memory" or "latency"


def wave_efficiency(instances: int, units: int) -> float:
    """Fraction of unit-slots doing work across the waves a grid needs."""
    if instances <= 0:
        return 1.0
    waves = math.ceil(instances / units)
    return instances / (waves * units)


def kernel_cost(spec: ChipSpec, c: Counters) -> KernelCost:
    eff = wave_efficiency(c.instances, spec.compute_units)
    # Each unit processes one instance at a time; a grid smaller than the
    # device leaves units idle, so effective peak scales with occupancy.
    occupancy = min(1.0, c.instances / spec.compute_units) if c.instances else 1.0
    scale = eff if c.instances >= spec.compute_units else occupancy
    compute = 0.0
    for dtype, flops in c.matrix_flops.items():
        compute += flops / (spec.peak(dtype, matrix=True) * spec.matrix_efficiency)
    for dtype, flops in c.vector_flops.items():
        compute += flops / spec.peak(dtype, matrix=False)
    compute = compute / scale if scale > 0 else compute
    memory = (c.bytes_read + c.bytes_written) / (spec.hbm_bandwidth * spec.memory_efficiency)
    launch = spec.launch_latency_s
    body = max(compute, memory)
    bound = "latency" if body < launch else ("compute" if compute >= memory else "memory")
    return KernelCost(launch + body, compute, memory, launch, eff, bound)


def copy_cost(spec: ChipSpec, nbytes: int, direction: str) -> float:
    """Duration of one DMA copy: ``direction`` is h2d, d2h or d2d."""
    if direction in ("h2d", "d2h"):
        return spec.copy_latency_s + nbytes / spec.host_link_bandwidth
    if direction == "d2d":
        # read and write both cross HBM
        return spec.copy_latency_s + 2 * nbytes / (spec.hbm_bandwidth * spec.memory_efficiency)
    raise ValueError(f"unknown copy direction {direction!r}")
