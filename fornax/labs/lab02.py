"""Lab 2: the hardware-software contract.

Experiments: a roofline per chip from its spec (where bfloat16 turns compute-bound, and where
the modelled GEMMs land); GEMMs and tiles aligned and misaligned to the matrix instruction
(:mod:`fornax.sim.cost`); a sustained GEMM under the power and thermal model at two inlet
temperatures (:mod:`fornax.sim.power`); and the same model's KV capacity on two chips that
differ only in HBM (:mod:`fornax.serving.capacity`).  Every figure is simulated.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path
from typing import Any

from .lab import Exercise, Lab, Section, Table, figure, number_fact, text_fact

CHIPS = ("h100-like", "h200-like", "mi300x-like", "max1550-like")
DTYPE = "bfloat16"
#: problem shapes (m, n, k): a decode-like step, a square GEMM, and the square one off by one
SHAPES = ((16, 4096, 4096), (4096, 4096, 4096), (4097, 4097, 4097))
#: a GEMM tile that fits one chip's matrix instruction and not another's
ODD_TILE = (48, 128, 64)
EVEN_TILE = (128, 128, 64)
#: the sustained load: one large GEMM back to back for this much simulated time
SUSTAINED = (16384, 16384, 16384)
SUSTAINED_S = 120.0
HOT_INLET_C = 55.0
THERMAL_CHIP = "h100-like"
SEQ_LEN = 4096
MODEL = "llama-8b-like"
HBM_PAIR = ("h100-like", "h200-like")


def _spec(chip: str) -> Any:
    from fornax.sim.spec import load_spec
    return load_spec(chip)


def roofline(spec: Any) -> dict[str, float]:
    """A chip's bfloat16 roofline from its spec: datasheet peak and bandwidth, their ratio (the
    ridge point, FLOP per byte), and the ridge of what the cost model lets a kernel reach."""
    peak, bw = spec.peak(DTYPE, matrix=True), spec.hbm_bandwidth
    reach = peak * spec.matrix_efficiency_for(DTYPE) / (bw * spec.memory_efficiency)
    return {"peak": peak, "bandwidth": bw, "ridge": peak / bw, "achievable_ridge": reach}


@lru_cache(maxsize=1)
def _rooflines() -> dict[str, dict[str, float]]:
    return {chip: roofline(_spec(chip)) for chip in CHIPS}


@lru_cache(maxsize=1)
def _gemms() -> tuple[tuple[str, tuple[int, int, int], float, float, float, str], ...]:
    """(chip, shape, time s, TFLOP/s, FLOP per HBM byte, bound) of each problem shape on each chip."""
    from fornax.sim.cost import gemm_cost
    rows = []
    for chip in CHIPS:
        spec = _spec(chip)
        for shape in SHAPES:
            est = gemm_cost(spec, *shape, dtype=DTYPE)
            assert est.cost is not None
            rows.append((chip, shape, est.time_s, est.tflops, est.flops / est.cost.hbm_bytes,
                         str(est.detail["bound"])))
    return tuple(rows)


def tile_alignment(spec: Any, tile: tuple[int, int, int]) -> tuple[float, float, str]:
    """(alignment factor, modelled µs, bound) of a 4096^3 GEMM forced to ``tile`` on ``spec``."""
    from fornax.sim.cost import alignment_factor, gemm_cost
    est = gemm_cost(spec, 4096, 4096, 4096, dtype=DTYPE, tile=tile)
    return alignment_factor(tile, spec.matrix_shape), est.time_s * 1e6, str(est.detail["bound"])


@lru_cache(maxsize=1)
def _tiles() -> tuple[tuple[str, str, tuple[float, float, str], tuple[float, float, str]], ...]:
    rows = []
    for chip in CHIPS:
        spec = _spec(chip)
        even, odd = tile_alignment(spec, EVEN_TILE), tile_alignment(spec, ODD_TILE)
        rows.append((chip, "x".join(map(str, spec.matrix_shape)), even, odd))
    return tuple(rows)


def sustained(spec: Any, inlet_c: float, seconds: float = SUSTAINED_S) -> dict[str, float]:
    """A large bfloat16 GEMM run back to back for ``seconds`` of simulated time under the power
    model of ``spec`` with its inlet at ``inlet_c``."""
    from fornax.sim.cost import gemm_cost
    from fornax.sim.power import PowerModel
    spec = dataclasses.replace(spec, power={**spec.power, "ambient_c": inlet_c})
    est = gemm_cost(spec, *SUSTAINED, dtype=DTYPE)
    assert est.cost is not None
    model = PowerModel(spec)
    power_w = spec.power["static_w"] + model.kernel_energy(est.cost).dynamic_j / est.cost.duration_s
    t, done, first = 0.0, 0, -1.0
    while t < seconds:
        ran = model.run_kernel(est.cost, t)
        if first < 0 and ran.clock_fraction < 1.0:
            first = t
        t += ran.duration_s
        done += 1
    return {"power_w": power_w, "steady_c": inlet_c + spec.power["thermal_resistance_c_per_w"] * power_w,
            "peak_c": model.peak_temp_c, "clock": model.clock_fraction, "throttled_s": model.throttled_s,
            "first_throttle_s": first, "gemms": done, "throttle_c": spec.power["throttle_temp_c"]}


@lru_cache(maxsize=1)
def _thermal() -> dict[float, dict[str, float]]:
    spec = _spec(THERMAL_CHIP)
    return {inlet: sustained(spec, inlet) for inlet in (spec.power["ambient_c"], HOT_INLET_C)}


def kv_capacity(spec: Any) -> Any:
    from fornax import serving
    return serving.capacity(serving.REFERENCE_SHAPES[MODEL], spec, SEQ_LEN, model=MODEL)


@lru_cache(maxsize=1)
def _capacity() -> dict[str, Any]:
    return {chip: kv_capacity(_spec(chip)) for chip in HBM_PAIR}


def experiments(out: Path) -> list[Section]:
    roof, gemms, tiles, thermal, cap = _rooflines(), _gemms(), _tiles(), _thermal(), _capacity()
    _picture(roof, gemms, out / "roofline.png")
    spec = _spec(THERMAL_CHIP)
    gb = 1e9
    hot = "throttles" if thermal[HOT_INLET_C]["first_throttle_s"] >= 0 else "does not throttle either"
    return [
        Section("The roofline from a chip spec",
                "A chip spec (`fornax/sim/specs/*.toml`, `fornax specs`) promises a matrix peak per dtype "
                "and an HBM bandwidth. A kernel doing F FLOPs on B bytes can go no faster than "
                "min(peak, F/B x bandwidth): below the ridge point peak / bandwidth (FLOP per byte) it is "
                "memory-bound, above it compute-bound. The cost model (`fornax.sim.cost`) reaches only a "
                "fraction of either roof (matrix_efficiency, memory_efficiency), which moves its ridge. A tiled "
                "GEMM reloads its operands, but L2 serves most reloads: what counts against HBM is the "
                "bytes that reach it.",
                [Table("bfloat16 rooflines from the specs", ["chip", "matrix peak", "HBM bandwidth",
                                                             "ridge (FLOP/byte)", "achievable ridge"],
                       [[c, f"{r['peak'] / 1e12:.0f} TFLOP/s", f"{r['bandwidth'] / 1e12:.2f} TB/s",
                         f"{r['ridge']:.1f}", f"{r['achievable_ridge']:.1f}"] for c, r in roof.items()]),
                 Table("modelled bfloat16 GEMMs (`fornax cost gemm`)",
                       ["chip", "m x n x k", "time", "TFLOP/s", "FLOP per HBM byte", "bound"],
                       [[c, "x".join(map(str, s)), f"{t * 1e6:.1f} µs", f"{tf:.0f}", f"{ai:.1f}", b]
                        for c, s, t, tf, ai, b in gemms])], ["roofline.png"]),
        Section("Matrix instructions and tile efficiency",
                "The matrix unit works in fixed instruction shapes (the spec's matrix_shape: mma m16n8k16 "
                "on the cuda-like chips, MFMA 32x32x8 on mi300x-like, DPAS 8x16x16 on max1550-like). A "
                "kernel's tile is padded up to whole instructions: the cost model multiplies its matrix "
                "work by the alignment factor, the product over m, n, k of ceil(t/s) x s / t "
                "(`alignment_factor` in fornax/sim/cost.py). A problem size that does not divide into "
                "tiles pays the same way at its edges: 4097^3 above costs far more than 4096^3. Below, a "
                "4096^3 GEMM forced to two tiles on each chip: the small tile also reloads its operands "
                "more often, which can make it memory-bound before alignment matters.",
                [Table("tile against instruction (4096^3 bfloat16)",
                       ["chip", "instruction m x n x k", f"{'x'.join(map(str, EVEN_TILE))} alignment",
                        "time", f"{'x'.join(map(str, ODD_TILE))} alignment", "time"],
                       [[c, s, f"{e[0]:.3f}", f"{e[1]:.1f} µs ({e[2]})", f"{o[0]:.3f}", f"{o[1]:.1f} µs ({o[2]})"]
                        for c, s, e, o in tiles])]),
        Section("Power and thermal throttling",
                f"A {'x'.join(map(str, SUSTAINED))} bfloat16 GEMM back to back for {SUSTAINED_S:.0f} s of "
                f"simulated time on {THERMAL_CHIP} under the power model (`fornax.sim.power`): energy per "
                "FLOP and per byte gives the power a kernel draws; the temperature moves toward inlet + "
                f"R x power (R = {spec.power['thermal_resistance_c_per_w']} °C/W, time constant R x C = "
                f"{spec.power['thermal_resistance_c_per_w'] * spec.power['thermal_capacitance_j_per_c']:.0f} s); "
                f"at {spec.power['throttle_temp_c']:.0f} °C the clock drops until the power meets what the "
                f"cooling removes. The same spec with a {HOT_INLET_C:.0f} °C inlet (a copy of the spec with "
                f"ambient_c changed) {hot}; memory time would not scale with the clock.",
                [Table(f"sustained GEMM on {THERMAL_CHIP}",
                       ["inlet", "power at full clock", "steady temperature", "peak temperature",
                        "first throttled at", "final clock", "GEMMs done"],
                       [[f"{i:.0f} °C", f"{d['power_w']:.0f} W", f"{d['steady_c']:.1f} °C",
                         f"{d['peak_c']:.1f} °C",
                         f"{d['first_throttle_s']:.1f} s" if d["first_throttle_s"] >= 0 else "never",
                         f"{d['clock']:.2f}", str(int(d["gemms"]))] for i, d in thermal.items()])]),
        Section("HBM capacity: the same compute, more memory",
                f"h100-like and h200-like share the die (the same peaks and matrix instruction) and differ "
                f"in HBM. The capacity model (`fornax.serving.capacity`) sizes the serving engine's KV "
                f"block allocator from hbm_bytes: 90% usable, minus the weights and an activation reserve, "
                f"cut into 16-token blocks; {SEQ_LEN}-token sequences of {MODEL} (bfloat16).",
                [Table("KV capacity", ["chip", "HBM", "weights", "KV cache", "blocks", "sequences"],
                       [[c, f"{k.hbm_bytes / gb:.0f} GB", f"{k.weight_bytes / gb:.1f} GB",
                         f"{k.kv_bytes / gb:.1f} GB", str(k.blocks), str(k.max_sequences)]
                        for c, k in cap.items()])]),
    ]


def _picture(roof: dict[str, dict[str, float]], gemms: tuple[Any, ...], path: Path) -> None:
    fig = figure(8, 6)
    axes = fig.subplots(2, 2, sharex=True, sharey=True).flat
    xs = [2.0 ** (i / 4) for i in range(4 * 12 + 1)]      # 1 .. 4096 FLOP/byte
    for i, (ax, (chip, r)) in enumerate(zip(axes, roof.items())):
        ax.loglog(xs, [min(r["peak"], x * r["bandwidth"]) / 1e12 for x in xs], color=f"C{i}", label="roof")
        ax.axvline(r["ridge"], color="grey", linestyle=":", linewidth=1)
        pts = [(ai, tf) for c, _, _, tf, ai, _ in gemms if c == chip]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", color="black", markersize=4, label="GEMMs")
        ax.set_title(f"{chip}: ridge {r['ridge']:.0f} FLOP/B", fontsize=9)
        ax.set_xlabel("FLOP per byte")
        ax.set_ylabel("TFLOP/s (bf16)")
    fig.suptitle("bfloat16 roofline per chip spec, modelled GEMMs as points")
    fig.savefig(path, format="png", dpi=80)


def facts() -> dict[str, Any]:
    roof, thermal, cap = _rooflines(), _thermal(), _capacity()
    gemm = {(c, s): b for c, s, _, _, _, b in _gemms()}
    odd = {c: o[0] for c, _, _, o in _tiles()}
    nominal = _spec(THERMAL_CHIP).power["ambient_c"]
    return {"h200_ridge": roof["h200-like"]["ridge"], "mi300x_odd_alignment": odd["mi300x-like"],
            "decode_bound": gemm[("h100-like", SHAPES[0])],
            "steady_c": thermal[nominal]["steady_c"],
            "extra_sequences": cap["h200-like"].max_sequences - cap["h100-like"].max_sequences}


LAB = Lab(
    number=2, slug="02-hardware-contract", title="The hardware-software contract", part="Part 2",
    goal="Read a chip spec as a contract: derive the roofline from its peaks and bandwidth, see what "
         "the matrix instruction shape demands of a kernel's tiles, watch power and temperature lower "
         "the clock under sustained load, and follow a different HBM configuration into the serving "
         "engine's capacity.",
    minutes=30, experiments=experiments, facts=facts,
    exercises=[
        Exercise("2.1", "From the h200-like spec alone (matrix_peak.bfloat16 and hbm_bandwidth), compute "
                 "its bfloat16 ridge point in FLOP per byte.", number_fact("2.1", "h200_ridge", rel=0.02),
                 "fornax/sim/specs/h200-like.toml: ridge = matrix_peak.bfloat16 / hbm_bandwidth"),
        Exercise("2.2", f"What alignment factor does a {'x'.join(map(str, ODD_TILE))} tile get on the "
                 "mi300x-like chip? Compute it from the spec's matrix_shape.",
                 number_fact("2.2", "mi300x_odd_alignment", rel=0.01),
                 "alignment_factor in fornax/sim/cost.py against matrix_shape in mi300x-like.toml"),
        Exercise("2.3", f"Is the {'x'.join(map(str, SHAPES[0]))} bfloat16 GEMM (a decode step) compute- or "
                 "memory-bound on h100-like (answer compute or memory)?", text_fact("2.3", "decode_bound"),
                 "its FLOP per byte against the ridge point (fornax cost gemm, fornax/sim/cost.py)"),
        Exercise("2.4", f"At its shipped inlet temperature, what temperature (°C) does {THERMAL_CHIP} "
                 "settle toward under the sustained GEMM? Compute it from the power in the table and "
                 "the spec's [power] constants.", number_fact("2.4", "steady_c", rel=0.01),
                 "fornax/sim/power.py (the RC model: inlet + R x power) and the [power] table of "
                 f"{THERMAL_CHIP}.toml"),
        Exercise("2.5", f"How many more {SEQ_LEN}-token sequences of {MODEL} does the capacity model fit "
                 "on h200-like than on h100-like?", number_fact("2.5", "extra_sequences"),
                 "fornax/serving/capacity.py and the specs' hbm_bytes"),
    ])
