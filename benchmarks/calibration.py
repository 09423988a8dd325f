"""Cost-model calibration: predicted figures against measured and datasheet references.

Nothing runs on a device; every prediction comes from the analytic models in
``fornax.sim.cost`` and ``fornax.sim.topology`` on the shipped chip specs.  The
ratio column is predicted / reference.  Each row's source says what the
reference is:

- ``measured: <source>`` -- a published (or this project's) measurement of the
  same figure; the spec figures it calibrates cite the same source, and the
  ratio must stay within :data:`TOLERANCE` of 1 (``tests/sim/test_calibration.py``);
- ``datasheet: <what>`` -- the vendor's peak, which no real kernel reaches;
- ``context: <why>`` -- a figure set beside a measurement of another size, to
  show how the model scales (not a calibration target).

Every prediction and ratio is recorded (``benchmarks.results``).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fornax.sim.cost import copy_estimate, gemm_cost
from fornax.sim.spec import available_specs, load_spec
from fornax.sim.topology import Topology

from .results import Figures

GiB = 1 << 30
MiB = 1 << 20
#: how far a calibrated (``measured``) figure may be from its source: within 10 %
TOLERANCE = 0.10
REFERENCES = ("measured", "datasheet", "context")
FIGURES = Figures("calibration.predicted[{spec}: {what}]", "calibration.vs_{reference}[{spec}: {what}]",
                  choices={"reference": REFERENCES})

#: AMD ROCm blog, Feb 2025 (B. Sander et al.): hipBLASLt-bench max-achievable FLOPs on MI300X
MAF = ('"Measuring Max-Achievable FLOPs – Part 2" (AMD ROCm blog, 2025; hipBLASLt-bench, '
       'rocm.blogs.amd.com/software-tools-optimization/measuring-max-achievable-flops-part2)')
#: AMD ROCm blog, Mar 2025 (J. Kolla et al.): TransferBench and rccl-tests on one 8x MI300X node
RCCL = ('"Understanding RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X" (AMD ROCm blog, '
        '2025; rocm.blogs.amd.com/software-tools-optimization/mi300x-rccl-xgmi)')


def allreduce_busbw(spec_name: str, devices: int, kind: str, nbytes: int) -> float:
    """nccl-tests bus bandwidth (bytes/s) of a ring all-reduce of ``nbytes`` on ``devices``
    devices of ``spec_name`` joined by a ``kind`` fabric: ``S / t * 2(N-1)/N``."""
    t = Topology.build(load_spec(spec_name), devices, kind).allreduce_time(nbytes, "ring")
    return nbytes / t * 2 * (devices - 1) / devices


def peer_copy_gbps(spec_name: str, devices: int, kind: str, nbytes: int) -> float:
    """Bandwidth (GB/s) of one copy of ``nbytes`` from device 0 to device 1 over the fabric."""
    t = Topology.build(load_spec(spec_name), devices, kind).peer_copy_time(nbytes, 0, 1)
    return nbytes / t / 1e9


def rows():
    """(spec, what, predicted, reference, unit, where the reference comes from)."""
    h200, mi300x = load_spec("h200-like"), load_spec("mi300x-like")
    out = [
        ("h200-like", "GEMM 8192³ bf16", gemm_cost(h200, 8192, 8192, 8192).tflops, 780.0, "TFLOP/s",
         "measured: one H200, 8192³ bf16 GEMM 769-798 TFLOP/s (this project, random data)"),
        ("h200-like", "GEMM 1024³ bf16", gemm_cost(h200, 1024, 1024, 1024).tflops, 780.0, "TFLOP/s",
         "context: vs the 8192³ measurement: small GEMMs are less efficient"),
        ("h200-like", "D2D copy 1 GiB", copy_estimate(h200, GiB, "d2d").gbps / 1e3, 4.3, "TB/s",
         "measured: one H200, device-to-device copy read + write ~4.3 TB/s (this project)"),
        # MI300X: AMD's hipBLASLt max-achievable FLOPs, at the shapes AMD measured them
        ("mi300x-like", "GEMM 4096x4864x32896 bf16",
         gemm_cost(mi300x, 4096, 4864, 32896, "bfloat16").tflops, 708.0, "TFLOP/s",
         f"measured: {MAF}: MAF BF16 708 TFLOPs (median 1207 MHz)"),
        ("mi300x-like", "GEMM 4096x4864x32896 fp16",
         gemm_cost(mi300x, 4096, 4864, 32896, "float16").tflops, 654.0, "TFLOP/s",
         f"measured: {MAF}: MAF FP16 654 TFLOPs (median 1115 MHz)"),
        ("mi300x-like", "GEMM 4096x3648x32896 fp8",
         gemm_cost(mi300x, 4096, 3648, 32896, "float8_e4m3fn").tflops, 1273.0, "TFLOP/s",
         f"measured: {MAF}: MAF FP8 (f8_fnuz) 1273 TFLOPs (median 1230 MHz)"),
        ("mi300x-like", "GEMM 8192³ fp8", gemm_cost(mi300x, 8192, 8192, 8192, "float8_e4m3fn").tflops,
         1273.0, "TFLOP/s", "context: vs the 4096x3648x32896 MAF measurement: a large square GEMM"),
        # MI300X: one xGMI link, and RCCL's all-reduce over the full mesh of 8
        ("mi300x-like", "peer copy 64 MiB, one xGMI link (8-device mesh)",
         peer_copy_gbps("mi300x-like", 8, "mesh", 64 * MiB), 46.552, "GB/s",
         f"measured: {RCCL}: TransferBench a2a 64 MiB per pair, 45.1-47.2 GB/s, average 46.552 GB/s"),
        ("mi300x-like", "all-reduce busbw 256 MiB, 8-device mesh",
         allreduce_busbw("mi300x-like", 8, "mesh", 256 * MiB) / 1e9, 305.62, "GB/s",
         f"measured: {RCCL}: rccl-tests all_reduce_perf float sum, 8x MI300X, 268435456 B "
         "out-of-place busbw 305.62 GB/s"),
    ]
    for name in available_specs():
        if name == "tiny":
            continue
        s = load_spec(name)
        out.append((name, "GEMM 8192³ bf16", gemm_cost(s, 8192, 8192, 8192).tflops,
                    s.matrix_peak["bfloat16"] / 1e12, "TFLOP/s", "datasheet: dense bf16 peak"))
        out.append((name, "D2D copy 1 GiB", copy_estimate(s, GiB, "d2d").gbps / 1e3,
                    s.hbm_bandwidth / 1e12, "TB/s", "datasheet: HBM bandwidth"))
    return out


def reference_kind(where: str) -> str:
    """``measured``, ``datasheet`` or ``context``: the word a row's source starts with."""
    kind = where.split(":", 1)[0]
    if kind not in REFERENCES:
        raise ValueError(f"a calibration row's source must start with one of "
                         f"{', '.join(f'{k}:' for k in REFERENCES)}; got {where!r}")
    return kind


def main() -> None:
    table = Table(title="cost model calibration: predicted vs reference")
    for col in ("spec", "what", "predicted", "reference", "ratio", "reference source"):
        table.add_column(col, justify="right" if col in ("predicted", "reference", "ratio") else "left")
    predicted = set()
    for spec, what, pred, ref, unit, where in rows():
        if (spec, what) not in predicted:
            FIGURES.record(f"calibration.predicted[{spec}: {what}]", pred, unit)
            predicted.add((spec, what))
        source = reference_kind(where)
        FIGURES.record(f"calibration.vs_{source}[{spec}: {what}]", pred / ref, "x",
                       note=f"reference {ref:g} {unit}: {where}")
        table.add_row(spec, what, f"{pred:.1f} {unit}", f"{ref:.1f} {unit}", f"{pred / ref:.2f}", where)
    Console().print(table)


if __name__ == "__main__":
    main()
