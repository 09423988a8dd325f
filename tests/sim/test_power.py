"""Power and thermal: energy accounting, the RC thermal model, clock throttling."""

import dataclasses
import math

import pytest

from fornax.sim.cost import gemm_counters, kernel_cost
from fornax.sim.device import Device
from fornax.sim.power import PowerModel
from fornax.sim.spec import load_spec

TILE = {"tile": [128, 256, 64]}


def with_power(spec, **kw):
    fields = {k: v for k, v in kw.items() if k in ("board_power_w",)}
    power = dict(spec.power, **{k: v for k, v in kw.items() if k not in fields})
    return dataclasses.replace(spec, power=power, **fields)


def gemm_loop(device: Device, count: int, size: int = 8192) -> float:
    """``count`` back-to-back GEMMs accounted on ``device`` (priced, not executed)."""
    c = gemm_counters(size, size, size, 1, "bfloat16", tuple(TILE["tile"]))
    t = 0.0
    for _ in range(count):
        t += device.account_kernel(c, TILE, start=t).duration_s
    return t


def test_low_power_limit_throttles_and_high_does_not():
    h200 = load_spec("h200-like")
    cool = Device(h200)
    t_cool = gemm_loop(cool, 4000)
    assert cool.power.throttled_s == 0 and cool.power.clock_fraction == 1.0
    nominal = kernel_cost(h200, gemm_counters(8192, 8192, 8192, 1, "bfloat16", (128, 256, 64)), TILE)
    assert t_cool == pytest.approx(4000 * nominal.duration_s)

    capped = Device(dataclasses.replace(h200, board_power_w=500.0))
    t_capped = gemm_loop(capped, 4000)
    assert capped.power.throttled_s == pytest.approx(t_capped)     # every kernel ran slower
    assert t_capped > 1.2 * t_cool
    # the clock lands where the kernel's power meets the cap
    p = capped.power.summary()
    assert p["avg_power_w"] == pytest.approx(500.0, rel=0.01)
    assert h200.power["min_clock_fraction"] < capped.power.clock_fraction < 1.0


def test_clock_never_below_the_floor():
    spec = dataclasses.replace(load_spec("h200-like"), board_power_w=120.0)
    dev = Device(spec)
    gemm_loop(dev, 10)
    assert dev.power.clock_fraction == spec.power["min_clock_fraction"]


def test_thermal_throttle_holds_the_throttle_temperature():
    # high power cap, low throttle point, a small heat sink (time constant 6 s)
    spec = with_power(load_spec("h200-like"), throttle_temp_c=60.0, thermal_capacitance_j_per_c=100.0)
    dev = Device(spec)
    t = gemm_loop(dev, 30000)                                            # tens of seconds: several tau
    assert t > 3 * dev.power.tau_s
    assert dev.power.throttled_s > 0 and dev.power.clock_fraction < 1.0
    # at the throttle point the power is the one whose steady temperature is that point
    sustainable = (60.0 - spec.power["ambient_c"]) / spec.power["thermal_resistance_c_per_w"]
    assert dev.power.power_limit_w() == pytest.approx(sustainable)
    assert dev.power.peak_temp_c < 60.5
    assert dev.power.temp_c == pytest.approx(60.0, abs=0.5)


def test_energy_is_the_sum_of_its_parts():
    spec = load_spec("h200-like")
    p = spec.power
    dev = Device(spec)
    c = gemm_counters(4096, 4096, 4096, 1, "bfloat16", (128, 256, 64))
    t = 0.0
    for _ in range(5):
        k = dev.account_kernel(c, TILE, start=t)
        t += k.duration_s + 1e-3                                     # 1 ms idle between kernels
    dev.power.run_copy(10**9, "d2d", t, 1e-3)
    end = t + 1e-3
    s = dev.power.summary(until=end + 0.5)
    flops = c.matrix_flops["bfloat16"]
    footprint = 3 * 4096 * 4096 * 2
    expect = (p["static_w"] * (end + 0.5)
              + 5 * flops * p["matrix_pj_per_flop"] * 1e-12
              + 5 * footprint * p["hbm_pj_per_byte"] * 1e-12
              + 5 * (c.bytes_read + c.bytes_written) * p["l2_pj_per_byte"] * 1e-12
              + 2 * 10**9 * p["hbm_pj_per_byte"] * 1e-12)
    assert s["energy_j"] == pytest.approx(expect)
    assert s["energy_j"] == pytest.approx(s["static_j"] + s["dynamic_j"])
    assert s["avg_power_w"] == pytest.approx(expect / (end + 0.5))


def test_fp64_flop_costs_more_energy_than_bf16():
    pm = PowerModel(load_spec("h200-like"))
    assert pm.matrix_pj("float64") == pytest.approx(0.6 * 989 / 67)
    assert pm.matrix_pj("bfloat16") == pytest.approx(0.6)


def test_temperature_relaxes_toward_ambient_when_idle():
    spec = with_power(load_spec("h200-like"), thermal_capacitance_j_per_c=50.0)   # tau = 3 s
    dev = Device(spec)
    t = gemm_loop(dev, 5000)
    pm = dev.power
    hot = pm.temp_c
    assert hot > spec.power["ambient_c"] + 10 and pm.peak_temp_c == pytest.approx(hot)
    r, tau = spec.power["thermal_resistance_c_per_w"], pm.tau_s
    idle_steady = spec.power["ambient_c"] + r * spec.power["static_w"]
    pm.idle_until(t + tau)
    assert pm.temp_c == pytest.approx(idle_steady + (hot - idle_steady) * math.exp(-1))
    pm.idle_until(t + 10 * tau)
    assert pm.temp_c == pytest.approx(idle_steady, abs=0.01)
    assert pm.peak_temp_c == pytest.approx(hot)                    # the peak is remembered


def test_device_prices_kernels_on_its_timeline():
    """A kernel run through the timeline is accounted at the packet's start."""
    import numpy as np
    from fornax.layers import codegen
    from fornax.layers.graph import DType
    from fornax.sim.timeline import Packet

    dev = Device(load_spec("tiny"))
    space = dev.memory.create_space()
    program, grid = codegen.gemm_kernel("g", DType.FLOAT32, 64, 64, 64, 1, False, (32, 32, 16), 32)
    args = {p: space.map(64 * 64 * 4).va for p in ("a", "b", "c")}
    space.write(args["a"], np.ones((64, 64), np.float32).tobytes())
    q = dev.timeline.create_queue()
    costs = []
    q.submit(Packet("compute", lambda: costs.append(dev.run_kernel(space, program, grid, args)[1])
                    or costs[-1].duration_s))
    dev.timeline.drain()
    assert len(costs) == 1
    assert dev.power.time_s == pytest.approx(costs[0].duration_s)
    assert dev.power.parts.matrix_j == pytest.approx(2 * 64 ** 3 * 0.5e-12 * 16e12 / 4e12)
