"""Chip spec figures, the kernel cost model and the analytic GEMM / attention / copy models."""

import dataclasses
import math

import numpy as np
import pytest

from fornax.layers import codegen
from fornax.layers.graph import DType
from fornax.sim.cost import (attention_cost, attention_counters, copy_cost, copy_estimate, gemm_cost,
                             gemm_counters, kernel_cost)
from fornax.sim.device import Device
from fornax.sim.execute import Counters, execute
from fornax.sim.spec import available_specs, load_spec

GiB = 1 << 30


# ---- shipped specs against their datasheets ----------------------------------------------
@pytest.mark.parametrize("name, units, hbm, bw, bf16, watts, simd, shape", [
    ("h100-like", 132, 80e9, 3.35e12, 989e12, 700, 32, (16, 8, 16)),
    ("h200-like", 132, 141e9, 4.8e12, 989e12, 700, 32, (16, 8, 16)),
    ("mi300x-like", 304, 192e9, 5.3e12, 1307.4e12, 750, 64, (32, 32, 8)),
    ("max1550-like", 128, 128e9, 3.2e12, 832e12, 600, 16, (8, 16, 16)),
])
def test_datasheet_figures(name, units, hbm, bw, bf16, watts, simd, shape):
    s = load_spec(name)
    assert s.name == name and name in available_specs()
    assert (s.compute_units, s.hbm_bytes, s.hbm_bandwidth) == (units, hbm, bw)
    assert s.matrix_peak["bfloat16"] == bf16 and s.board_power_w == watts
    assert s.simd_width == simd and s.matrix_shape == shape
    assert "tfloat32" in s.matrix_peak                                   # all three have TF32/XF32
    # the bf16 peak is units x FLOP/clk x clock: the clock is the one the peak is quoted at
    per_clock = bf16 / (units * s.clock_ghz * 1e9)
    assert per_clock == pytest.approx(4096 if simd != 64 else 2048, rel=0.02)


def test_dtype_coverage():
    h = load_spec("h200-like")
    for dt in ("float64", "tfloat32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"):
        assert dt in h.matrix_peak
    assert "float32" not in h.matrix_peak          # no plain-fp32 tensor-core path: vector rate
    assert h.peak("float32", matrix=True) == h.vector_peak["float32"]
    assert "float32" in load_spec("mi300x-like").matrix_peak
    assert "float8_e4m3fn" not in load_spec("max1550-like").matrix_peak


# ---- the analytic GEMM counters equal what the executor counts ---------------------------
@pytest.mark.parametrize("m, n, k, batch, tile, dtype", [
    (100, 70, 50, 1, (32, 32, 16), DType.FLOAT32),
    (64, 64, 64, 2, (32, 32, 16), DType.FLOAT32),
    (33, 129, 40, 3, (64, 64, 32), DType.BFLOAT16),
    (5, 7, 3, 1, (32, 32, 16), DType.FLOAT16),
])
def test_gemm_counters_match_the_executor(m, n, k, batch, tile, dtype):
    dev = Device(load_spec("tiny"))
    space = dev.memory.create_space()
    program, grid = codegen.gemm_kernel("g", dtype, m, n, k, batch, True, tile, 32)
    isz = np.dtype(dtype.value if dtype is not DType.BFLOAT16 else "float16").itemsize
    args = {"a": space.map(batch * m * k * isz).va, "b": space.map(batch * k * n * isz).va,
            "c": space.map(batch * m * n * isz).va}
    got = execute(program, grid, args, space)
    est = gemm_counters(m, n, k, batch, dtype.value, tile, b_batched=True)
    assert est.instances == got.instances == math.prod(grid)
    assert est.matrix_flops == got.matrix_flops
    assert (est.bytes_read, est.bytes_written) == (got.bytes_read, got.bytes_written)
    assert est.footprint_bytes == got.footprint_bytes
    for name in ("a", "b"):
        assert est.read_ranges[name][1] - est.read_ranges[name][0] == \
            got.read_ranges[name][1] - got.read_ranges[name][0]


def test_gemm_counters_by_hand():
    c = gemm_counters(1000, 600, 300, 1, "bfloat16", (128, 256, 64), clamp=False)
    gm, gn, steps = 8, 3, 5                       # ceil(1000/128), ceil(600/256), ceil(300/64)
    assert c.instances == gm * gn
    assert c.matrix_flops["bfloat16"] == 2 * 128 * 256 * 64 * steps * gm * gn
    assert c.bytes_read == 2 * (gn * 1000 * 300 + gm * 300 * 600)
    assert c.bytes_written == 2 * 1000 * 600
    assert c.footprint_bytes == 2 * (1000 * 300 + 300 * 600 + 1000 * 600)


# ---- calibration -----------------------------------------------------------------------
def test_h200_gemm_8192_near_measured():
    e = gemm_cost(load_spec("h200-like"), 8192, 8192, 8192, "bfloat16")
    assert e.flops == 2 * 8192 ** 3
    assert 0.9 * 780 <= e.tflops <= 1.1 * 780            # measured 769-798 TFLOP/s
    assert e.cost.bound == "compute"


def test_h200_d2d_copy_near_measured():
    e = copy_estimate(load_spec("h200-like"), GiB, "d2d")
    assert 0.9 * 4.3e12 <= e.bytes / e.time_s <= 1.1 * 4.3e12    # measured ~4.3 TB/s
    assert e.bytes == 2 * GiB


def test_small_gemm_less_efficient():
    spec = load_spec("h200-like")
    big, small = gemm_cost(spec, 8192, 8192, 8192), gemm_cost(spec, 1024, 1024, 1024)
    assert small.tflops < 0.6 * big.tflops
    # the fixed costs are what a small GEMM cannot amortise
    assert small.cost.launch_s + small.cost.ramp_s > 0.3 * small.time_s


# fraction of the datasheet bf16 peak a large tuned GEMM reaches on real parts (public measurements:
# H100/H200 cuBLAS ~750-800 of 989; MI300X hipBLASLt ~600-700 of 1307; Max 1550: vendor-tuned estimate)
GEMM_FRACTION = {"h100-like": (0.70, 0.85), "h200-like": (0.70, 0.85), "mi300x-like": (0.45, 0.55),
                 "max1550-like": (0.70, 0.85)}


@pytest.mark.parametrize("name", sorted(GEMM_FRACTION))
def test_large_bf16_gemm_plausible(name):
    spec = load_spec(name)
    e = gemm_cost(spec, 8192, 8192, 8192, "bfloat16")
    lo, hi = GEMM_FRACTION[name]
    assert lo <= e.tflops * 1e12 / spec.matrix_peak["bfloat16"] <= hi
    copy = copy_estimate(spec, GiB, "d2d")
    assert 0.6 * spec.hbm_bandwidth <= copy.gbps * 1e9 <= spec.hbm_bandwidth


def test_dtype_rates_order():
    spec = load_spec("h200-like")
    t = {dt: gemm_cost(spec, 4096, 4096, 4096, dt).time_s
         for dt in ("float8_e4m3fn", "bfloat16", "tfloat32", "float32", "float64")}
    assert t["float8_e4m3fn"] < t["bfloat16"] < t["tfloat32"] < t["float32"]
    assert t["float64"] > t["bfloat16"] * 5


# ---- model effects -----------------------------------------------------------------------
def test_l2_serves_repeated_loads_when_the_wave_fits():
    spec = load_spec("h200-like")
    c = gemm_counters(8192, 8192, 8192, 1, "bfloat16", (128, 256, 64))
    footprint = 3 * 8192 * 8192 * 2
    k = kernel_cost(spec, c, {"tile": [128, 256, 64]})
    assert k.hbm_bytes == footprint
    assert k.l2_bytes == c.bytes_read + c.bytes_written > 10 * footprint
    # a cache too small for one wave's share: repeated loads spill to HBM, by the model's formula
    small = dataclasses.replace(spec, l2_bytes=4 << 20)
    k2 = kernel_cost(small, c, {"tile": [128, 256, 64]})
    ws = footprint * spec.compute_units * k2.resident / c.instances
    expect = footprint + (c.bytes_read + c.bytes_written - footprint) * (1 - (4 << 20) / ws)
    assert k2.hbm_bytes == pytest.approx(expect)
    assert k2.memory_s > k.memory_s


def test_hbm_time_from_footprint_and_l2_time_from_traffic():
    spec = load_spec("tiny")
    c = Counters(instances=64, bytes_read=8 * 10**8, bytes_written=0,
                 read_ranges={"x": (0, 10**8)})          # every byte read 8 times
    k = kernel_cost(spec, c)
    assert k.hbm_bytes < 8 * 10**8
    assert k.memory_s == pytest.approx(max(k.hbm_bytes / (spec.hbm_bandwidth * spec.memory_efficiency),
                                           8 * 10**8 / spec.l2_bandwidth))


def test_matrix_instruction_alignment():
    spec = dataclasses.replace(load_spec("tiny"), matrix_shape=(32, 32, 8))
    flops = {"bfloat16": 1e12}
    aligned = kernel_cost(spec, Counters(instances=64, matrix_flops=flops), {"tile": [64, 64, 32]})
    narrow = kernel_cost(spec, Counters(instances=64, matrix_flops=flops), {"tile": [8, 64, 32]})
    assert aligned.alignment == 1.0 and narrow.alignment == 4.0       # 8 rows padded to 32
    assert narrow.compute_s == pytest.approx(4 * aligned.compute_s)


def test_occupancy_and_ramp():
    spec = load_spec("h200-like")
    # 128x256x64 bf16, two stages: 96 KiB shared memory, 32K accumulator registers -> 2 per SM
    c = gemm_counters(8192, 8192, 8192, 1, "bfloat16", (128, 256, 64))
    k = kernel_cost(spec, c, {"tile": [128, 256, 64]})
    assert k.resident == min(233472 // (2 * (128 * 64 + 64 * 256) * 2), 65536 // (128 * 256))
    waves = math.ceil(2048 / 132)
    assert k.ramp_s == pytest.approx(spec.memory_latency_s * math.ceil(waves / k.resident))
    assert k.wave_efficiency == pytest.approx(2048 / (waves * 132))
    assert k.duration_s == pytest.approx(k.launch_s + k.ramp_s + max(k.compute_s, k.memory_s))
    # an untiled kernel has no ramp
    assert kernel_cost(spec, Counters(instances=10, bytes_read=100)).ramp_s == 0.0


def test_clock_scales_compute_only():
    spec = load_spec("h200-like")
    c = gemm_counters(4096, 4096, 4096, 1, "bfloat16", (128, 256, 64))
    k = kernel_cost(spec, c, {"tile": [128, 256, 64]})
    slow = k.at_clock(0.5)
    assert slow.compute_s == pytest.approx(2 * k.compute_s) and slow.memory_s == k.memory_s
    assert kernel_cost(spec, c, {"tile": [128, 256, 64]}, clock_fraction=0.5).duration_s == \
        pytest.approx(slow.duration_s)


def test_tile_choice_is_the_fastest_fitting_tile():
    spec = load_spec("h200-like")
    chosen = gemm_cost(spec, 2048, 2048, 2048)
    for tile in ((128, 256, 64), (128, 128, 64), (64, 64, 64)):
        assert chosen.time_s <= gemm_cost(spec, 2048, 2048, 2048, tile=tile).time_s
    # tiny has 64 KiB of shared memory: a 128x256x64 bf16 pipeline (96 KiB) does not fit
    assert gemm_cost(load_spec("tiny"), 4096, 4096, 4096).detail["tile"] != [128, 256, 64]


def test_attention():
    spec = load_spec("h200-like")
    b, h, s, d = 2, 8, 2048, 128
    full = attention_cost(spec, b, h, s, d, causal=False)
    causal = attention_cost(spec, b, h, s, d, causal=True)
    assert full.flops == 4 * b * h * s * s * d and causal.flops == full.flops / 2
    nq = s // 128
    c = attention_counters(b, h, s, d, causal=True)
    assert c.matrix_flops["bfloat16"] == 4 * 128 * 128 * d * (nq * (nq + 1) // 2) * b * h
    assert c.instances == b * h * nq
    assert 0.45 < causal.time_s / full.time_s < 0.65
    assert full.cost.hbm_bytes == 4 * b * h * s * d * 2      # Q, K, V, O once: K/V streams hit L2
    assert 0.5 < full.tflops * 1e12 / spec.matrix_peak["bfloat16"] < 0.85


def test_copy_kinds():
    spec = load_spec("h200-like")
    n = 10**9
    assert copy_cost(spec, n, "peer") == pytest.approx(spec.peer_link_latency_s + n / 450e9)
    assert copy_estimate(spec, n, "h2d").gbps == pytest.approx(n / (8e-6 + n / 64e9) / 1e9)
    with pytest.raises(ValueError, match="sideways"):
        copy_estimate(spec, n, "sideways")
    with pytest.raises(ValueError, match="positive"):
        gemm_cost(spec, 0, 1, 1)
    with pytest.raises(ValueError, match="dtype"):
        gemm_cost(spec, 1, 1, 1, "float7")
