"""GEMM shape sweep through each family's library: chosen algorithm and simulated TFLOP/s.

Square GEMMs from 256 to 8192 and a few LLM shapes (a 70B-class layer's
projections at a small and a large token count), in bfloat16 and fp8 (e4m3,
bfloat16 out; xpu-like has no fp8), each family on shape-only devices of its
own kind of chip (h200-like, mi300x-like, max1550-like), so
the large shapes cost no host time.  Per family: the heuristic's algorithm
and the autotuned one (the fastest by the cost model), each with the
simulated TFLOP/s of the call as the device charged it.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fornax.layers.errors import LibraryError
from fornax.stack import compose, make_config
from fornax.stack import BUILTIN_FAMILIES

from .results import Figures

SQUARES = [256, 512, 1024, 2048, 4096, 8192]
#: (label, m, n, k): tokens x (hidden -> out), a 70B-class layer (hidden 8192, MLP 28672)
LLM = [("qkv 16tok", 16, 10240, 8192), ("mlp-up 16tok", 16, 28672, 8192),
       ("mlp-down 4096tok", 4096, 8192, 28672), ("qkv 4096tok", 4096, 10240, 8192)]
DTYPES = {"bfloat16": "bf16", "float8_e4m3fn": "fp8 e4m3"}
#: each family on its own kind of chip
SPECS = {"cuda-like": "h200-like", "rocm-like": "mi300x-like", "xpu-like": "max1550-like"}
FIGURES = Figures("gemm.{choice}_tflops[{family}: {shape}: {dtype}]",
                  choices={"choice": ("heuristic", "autotuned"), "dtype": tuple(DTYPES.values())})


def _timed(stack, params: dict) -> tuple[str, float]:
    """(algorithm, simulated TFLOP/s) of one library call on a fresh stream's timeline."""
    rt, lib = stack.runtime, stack.library
    p = rt.malloc(1 << 20)
    start = rt.record_event()
    rec = lib.gemm(p, p, p, params)
    end = rt.record_event()
    rt.synchronize()
    seconds = rt.elapsed_time(start, end) / 1e3
    rt.free(p)
    flops = 2.0 * params["m"] * params["n"] * params["k"] * params.get("batch", 1)
    return rec.algorithm, flops / seconds / 1e12


def main(vendors=BUILTIN_FAMILIES) -> None:
    console = Console(width=max(Console().width, 110))
    shapes = [(f"{s}^3", s, s, s) for s in SQUARES] + LLM
    for vendor in vendors:
        spec = SPECS.get(vendor, "h200-like")
        stack = compose(make_config(vendor, spec=spec, meta=True))
        table = Table(title=f"GEMM sweep — {vendor} {stack.library.name} on {spec} (simulated)")
        for col in ("shape", "dtype", "heuristic", "TFLOP/s", "autotuned", "TFLOP/s "):
            table.add_column(col, justify="right" if "TFLOP" in col else "left")
        for label, m, n, k in shapes:
            for dtype, short in DTYPES.items():
                params = {"m": m, "n": n, "k": k, "dtype": dtype}
                try:
                    h_algo, h_tf = _timed(stack, params)
                    t_algo, t_tf = _timed(stack, {**params, "autotune": True})
                except LibraryError:
                    table.add_row(label, short, "[dim]not offered[/dim]", "", "", "")
                    continue
                where = f"{vendor}: {label}: {short}"
                FIGURES.record(f"gemm.heuristic_tflops[{where}]", h_tf, "TFLOP/s", note=f"simulated; {h_algo}")
                FIGURES.record(f"gemm.autotuned_tflops[{where}]", t_tf, "TFLOP/s", note=f"simulated; {t_algo}")
                table.add_row(label, short, h_algo, f"{h_tf:.0f}", t_algo, f"{t_tf:.0f}")
        console.print(table)


if __name__ == "__main__":
    main()
