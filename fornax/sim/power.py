"""Power and thermal state of one device: energy, a thermal RC model, clock throttling.

Energy is static power over elapsed time plus dynamic energy per unit of
work: per matrix FLOP (``matrix_pj_per_flop`` at the bfloat16 rate; a dtype
with a lower peak costs proportionally more per FLOP, since the unit draws
about the same power at full rate; a 2:4 sparse kernel's dense-equivalent FLOP
costs the same at the sparse rate, so its energy is that of the half it
multiplies), per vector FLOP (against the float32 vector peak), per byte moved
to or from HBM and per byte served by L2.

Temperature follows a first-order RC model: at constant power ``P`` it moves
exponentially, with time constant ``R * C``, toward ``ambient + R * P``.

Clocks are lowered when a kernel at the nominal clock would draw more than
the power limit: the limit is ``board_power_w``, or, once the temperature has
reached ``throttle_temp_c``, the power at which the steady temperature equals
the throttle point (``(throttle_temp_c - ambient_c) / R``) if that is lower.
The compute clock drops just enough that the kernel's energy spread over its
now longer duration meets the limit, never below ``min_clock_fraction``.
Memory time does not scale with the compute clock, so memory-bound work
barely slows down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .cost import KernelCost
from .spec import ChipSpec

PJ = 1e-12


@dataclass
class EnergyParts:
    static_j: float = 0.0
    matrix_j: float = 0.0
    vector_j: float = 0.0
    hbm_j: float = 0.0
    l2_j: float = 0.0

    @property
    def dynamic_j(self) -> float:
        return self.matrix_j + self.vector_j + self.hbm_j + self.l2_j

    @property
    def total_j(self) -> float:
        return self.static_j + self.dynamic_j


#: kernel energies by (spec, cost object), shared by every device's model (the objects are
#: kept with them, so an id is never mistaken for a later object's)
_ENERGY: dict[tuple[int, int], tuple[ChipSpec, KernelCost, EnergyParts]] = {}
ENERGY_CACHE = 1 << 16


class PowerModel:
    """The power and thermal state of one device along its simulated time."""

    def __init__(self, spec: ChipSpec):
        self.spec = spec
        self._pj: dict[tuple[str, bool], float] = {}     # (dtype, matrix) -> pJ per FLOP (the spec is fixed)
        p = spec.power
        self.static_w = p["static_w"]
        self.ambient_c = p["ambient_c"]
        self.r = p["thermal_resistance_c_per_w"]
        self.c = p["thermal_capacitance_j_per_c"]
        self.throttle_c = p["throttle_temp_c"]
        self.min_clock = p["min_clock_fraction"]
        self.temp_c = self.ambient_c
        self.peak_temp_c = self.ambient_c
        self.time_s = 0.0               # simulated time accounted so far
        self.throttled_s = 0.0          # kernel time spent below the nominal clock
        self.clock_fraction = 1.0       # clock of the last kernel
        self.parts = EnergyParts()
        #: (time_s, {"power_w", "temp_c", "clock_fraction"}) at the start of each piece of work,
        #: for the trace's counter tracks; bounded so long runs stay cheap
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.max_samples = 100_000

    # -- energy per unit of work ---------------------------------------------------------
    def matrix_pj(self, dtype: str) -> float:
        pj = self._pj.get((dtype, True))
        if pj is None:
            s = self.spec
            ref = s.matrix_peak.get("bfloat16") or max(s.matrix_peak.values(), default=s.peak(dtype, True))
            pj = self._pj[(dtype, True)] = s.power["matrix_pj_per_flop"] * ref / s.peak(dtype, matrix=True)
        return pj

    def vector_pj(self, dtype: str) -> float:
        pj = self._pj.get((dtype, False))
        if pj is None:
            s = self.spec
            pj = self._pj[(dtype, False)] = \
                s.power["vector_pj_per_flop"] * s.vector_peak["float32"] / s.peak(dtype, matrix=False)
        return pj

    def kernel_energy(self, cost: KernelCost) -> EnergyParts:
        """Dynamic energy of one kernel (independent of the clock it runs at)."""
        p = self.spec.power
        return EnergyParts(
            matrix_j=sum(f * self.matrix_pj(dt) * cost.alignment * self._sparse_share(cost, dt)
                         for dt, f in cost.matrix_flops.items()) * PJ,
            vector_j=sum(f * self.vector_pj(dt) for dt, f in cost.vector_flops.items()) * PJ,
            hbm_j=cost.hbm_bytes * p["hbm_pj_per_byte"] * PJ,
            l2_j=cost.l2_bytes * p["l2_pj_per_byte"] * PJ)

    def _sparse_share(self, cost: KernelCost, dtype: str) -> float:
        """Energy per dense-equivalent FLOP of a 2:4 kernel relative to a dense one: the dense
        peak over the sparse peak (1 for a dense kernel or a chip without the instruction)."""
        sparse = self.spec.sparse_peak(dtype) if cost.sparse else None
        return self.spec.peak(dtype, matrix=True) / sparse if sparse else 1.0

    def copy_energy(self, nbytes: int, direction: str) -> EnergyParts:
        """Dynamic energy of a copy: HBM is read and written for d2d, touched once otherwise."""
        crossings = 2 if direction == "d2d" else 1
        return EnergyParts(hbm_j=crossings * nbytes * self.spec.power["hbm_pj_per_byte"] * PJ)

    # -- thermal ---------------------------------------------------------------------------
    @property
    def tau_s(self) -> float:
        return self.r * self.c

    def _heat(self, dt: float, power_w: float) -> None:
        """Temperature after ``dt`` seconds at constant ``power_w`` (exact RC solution)."""
        if dt <= 0:
            return
        steady = self.ambient_c + self.r * power_w
        self.temp_c = steady + (self.temp_c - steady) * math.exp(-dt / self.tau_s)
        self.peak_temp_c = max(self.peak_temp_c, self.temp_c)

    def power_limit_w(self) -> float:
        limit = self.spec.board_power_w
        if self.temp_c >= self.throttle_c:
            limit = min(limit, (self.throttle_c - self.ambient_c) / self.r)
        return limit

    def idle_until(self, t: float) -> None:
        """Nothing runs until ``t``: static power only, temperature relaxes toward ambient."""
        if t > self.time_s:
            dt = t - self.time_s
            self.parts.static_j += self.static_w * dt
            self._heat(dt, self.static_w)
            self.time_s = t

    def _activity(self, start: float, duration: float, e: EnergyParts) -> None:
        if len(self.samples) < self.max_samples:
            power = self.static_w + (e.dynamic_j / duration if duration > 0 else 0.0)
            self.samples.append((start, {"power_w": power, "temp_c": self.temp_c,
                                         "clock_fraction": self.clock_fraction}))
        self.parts.matrix_j += e.matrix_j
        self.parts.vector_j += e.vector_j
        self.parts.hbm_j += e.hbm_j
        self.parts.l2_j += e.l2_j
        dyn = e.dynamic_j
        if start >= self.time_s:
            self.idle_until(start)
            if duration > 0:
                self.parts.static_j += self.static_w * duration
                self._heat(duration, self.static_w + dyn / duration)
            else:
                self.temp_c += dyn / self.c
                self.peak_temp_c = max(self.peak_temp_c, self.temp_c)
            self.time_s = start + duration
            return
        # overlaps work already accounted (another engine): its heat arrives at once
        self.temp_c += dyn / self.c
        self.peak_temp_c = max(self.peak_temp_c, self.temp_c)
        end = start + duration
        if end > self.time_s:
            dt = end - self.time_s
            self.parts.static_j += self.static_w * dt
            self._heat(dt, self.static_w)
            self.time_s = end

    # -- work --------------------------------------------------------------------------------
    def run_kernel(self, cost: KernelCost, start: float) -> KernelCost:
        """Account one kernel starting at ``start``; returns its cost at the clock it ran at."""
        if start > self.time_s:
            self.idle_until(start)
        # a replayed kernel brings the same cost object, on this device or on another of the
        # same spec (the ranks of a step): its energy is computed once
        key = (id(self.spec), id(cost))
        hit = _ENERGY.get(key)
        if hit is not None and hit[0] is self.spec and hit[1] is cost:
            e = hit[2]
        else:
            e = self.kernel_energy(cost)
            if len(_ENERGY) >= ENERGY_CACHE:
                _ENERGY.clear()
            _ENERGY[key] = (self.spec, cost, e)
        dyn = e.dynamic_j
        fraction = 1.0
        headroom = self.power_limit_w() - self.static_w
        if dyn > 0 and cost.compute_s > 0:
            needed = dyn / headroom if headroom > 0 else math.inf    # shortest duration within the limit
            if cost.duration_s < needed:
                compute_budget = needed - cost.launch_s - cost.ramp_s
                fraction = cost.compute_s * cost.clock_fraction / compute_budget \
                    if compute_budget > 0 else self.min_clock
                fraction = min(1.0, max(self.min_clock, fraction))
        if fraction < 1.0:
            cost = cost.at_clock(fraction)
            self.throttled_s += cost.duration_s
        self.clock_fraction = fraction
        self._activity(start, cost.duration_s, e)
        return cost

    def run_copy(self, nbytes: int, direction: str, start: float, duration: float) -> None:
        self._activity(start, duration, self.copy_energy(nbytes, direction))

    # -- totals ------------------------------------------------------------------------------
    @property
    def energy_j(self) -> float:
        return self.parts.total_j

    def summary(self, until: float | None = None) -> dict[str, Any]:
        """Totals, with static power counted up to ``until`` (the end of the device's work)."""
        if until is not None:
            self.idle_until(until)
        return {
            "energy_j": self.energy_j,
            "static_j": self.parts.static_j,
            "dynamic_j": self.parts.dynamic_j,
            "avg_power_w": self.energy_j / self.time_s if self.time_s > 0 else 0.0,
            "throttled_s": self.throttled_s,
            "peak_temp_c": self.peak_temp_c,
            "temp_c": self.temp_c,
        }
