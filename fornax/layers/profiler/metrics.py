"""Hardware-counter-like metrics of one kernel, from what the simulator counted
(:class:`~fornax.sim.counters.Counters`) and how the cost model priced it
(:class:`~fornax.sim.cost.KernelCost`).  Keys are fornax's; each family names them in its
own vocabulary (``[profiler.metrics]`` of its ``vendor.toml``).

- ``duration_ns``: the kernel's simulated duration;
- ``instances``: program instances of the grid (blocks, work-groups);
- ``occupancy_pct``: the share of the compute units' slots the grid kept busy across its
  waves — the cost model's wave efficiency, or the busy fraction of a grid smaller than the
  device;
- ``dram_bytes_read`` / ``dram_bytes_written``: the bytes that reached HBM (the cost model's
  ``hbm_bytes``: the footprint plus the reloads L2 could not hold), split in the ratio of the
  bytes the kernel read and wrote;
- ``dram_throughput_pct``: those bytes over the duration, against the spec's HBM bandwidth;
- ``l2_bytes``: every byte loaded and stored (all of it goes through L2);
- ``matrix_util_pct`` / ``vector_util_pct``: the matrix (vector) unit's work — matrix FLOPs
  padded to the instruction shape, vector FLOPs over the lanes that work — against its peak
  rate over the duration;
- ``memory_stall_pct``: the share of the duration the units wait on memory: the time the
  memory traffic outlasts the compute, plus the pipeline ramp (one HBM latency per round of
  waves before the first tiles arrive).
"""

from __future__ import annotations

from ...sim.cost import KernelCost
from ...sim.counters import Counters
from ...sim.spec import ChipSpec

#: every metric key, in the order reports show them
KEYS = ("duration_ns", "instances", "occupancy_pct", "dram_bytes_read", "dram_bytes_written",
        "dram_throughput_pct", "l2_bytes", "matrix_util_pct", "vector_util_pct", "memory_stall_pct")


def _pct(part: float, whole: float) -> float:
    return 0.0 if whole <= 0 else max(0.0, min(100.0, 100.0 * part / whole))


def kernel_metrics(spec: ChipSpec, counters: Counters, cost: KernelCost, duration_s: float) -> dict[str, float]:
    """The metrics of one kernel that ran for ``duration_s`` simulated seconds."""
    units = spec.compute_units
    inst = counters.instances
    occupancy = cost.wave_efficiency if inst >= units else (inst / units if inst else 1.0)
    moved = counters.bytes_read + counters.bytes_written
    hbm = cost.hbm_bytes
    read = hbm * counters.bytes_read / moved if moved else 0.0
    matrix = sum(f * cost.alignment / spec.peak(dt, matrix=True) for dt, f in cost.matrix_flops.items())
    vector = sum(f / (spec.peak(dt, matrix=False) * cost.lane_efficiency)
                 for dt, f in cost.vector_flops.items())
    waiting = max(0.0, cost.memory_s - cost.compute_s) + cost.ramp_s
    return {
        "duration_ns": duration_s * 1e9,
        "instances": float(inst),
        "occupancy_pct": 100.0 * occupancy,
        "dram_bytes_read": read,
        "dram_bytes_written": hbm - read,
        "dram_throughput_pct": _pct(hbm / spec.hbm_bandwidth, duration_s),
        "l2_bytes": float(cost.l2_bytes),
        "matrix_util_pct": _pct(matrix, duration_s),
        "vector_util_pct": _pct(vector, duration_s),
        "memory_stall_pct": _pct(waiting, duration_s),
    }
