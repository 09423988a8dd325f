"""Cost-model calibration: predicted figures against measured and datasheet references.

Nothing runs on a device; every prediction comes from the analytic models in
``fornax.sim.cost`` on the shipped chip specs.  The ratio column is
predicted / reference.  Every prediction and ratio is recorded (``benchmarks.results``).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fornax.sim.cost import copy_estimate, gemm_cost
from fornax.sim.spec import available_specs, load_spec

from .results import Figures

GiB = 1 << 30
FIGURES = Figures("calibration.predicted[{spec}: {what}]", "calibration.vs_{reference}[{spec}: {what}]",
                  choices={"reference": ("measured", "datasheet")})


def rows():
    """(spec, what, predicted, reference, unit, where the reference comes from)."""
    h200 = load_spec("h200-like")
    out = [
        ("h200-like", "GEMM 8192³ bf16", gemm_cost(h200, 8192, 8192, 8192).tflops, 780.0, "TFLOP/s",
         "measured on one H200 (769-798)"),
        ("h200-like", "GEMM 1024³ bf16", gemm_cost(h200, 1024, 1024, 1024).tflops, 780.0, "TFLOP/s",
         "vs the 8192³ measurement: small GEMMs are less efficient"),
        ("h200-like", "D2D copy 1 GiB", copy_estimate(h200, GiB, "d2d").gbps / 1e3, 4.3, "TB/s",
         "measured on one H200 (read + write)"),
    ]
    for name in available_specs():
        if name == "tiny":
            continue
        s = load_spec(name)
        out.append((name, "GEMM 8192³ bf16", gemm_cost(s, 8192, 8192, 8192).tflops,
                    s.matrix_peak["bfloat16"] / 1e12, "TFLOP/s", "datasheet dense peak"))
        out.append((name, "D2D copy 1 GiB", copy_estimate(s, GiB, "d2d").gbps / 1e3,
                    s.hbm_bandwidth / 1e12, "TB/s", "datasheet HBM bandwidth"))
    return out


def main() -> None:
    table = Table(title="cost model calibration: predicted vs reference")
    for col in ("spec", "what", "predicted", "reference", "ratio", "reference source"):
        table.add_column(col, justify="right" if col in ("predicted", "reference", "ratio") else "left")
    predicted = set()
    for spec, what, pred, ref, unit, where in rows():
        if (spec, what) not in predicted:
            FIGURES.record(f"calibration.predicted[{spec}: {what}]", pred, unit)
            predicted.add((spec, what))
        source = "datasheet" if where.startswith("datasheet") else "measured"
        FIGURES.record(f"calibration.vs_{source}[{spec}: {what}]", pred / ref, "x",
                       note=f"reference {ref:g} {unit}: {where}")
        table.add_row(spec, what, f"{pred:.1f} {unit}", f"{ref:.1f} {unit}", f"{pred / ref:.2f}", where)
    Console().print(table)


if __name__ == "__main__":
    main()
