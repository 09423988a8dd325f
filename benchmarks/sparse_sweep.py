"""Dense vs 2:4 structured-sparse GEMM through each family's library: simulated time and speed-up.

A sweep of bfloat16 shapes ``m x n x k`` (A, the sparse operand, is ``m x k``: a layer's
weight with ``m`` output features; ``n`` is the token count): squares from 256 to 8192,
a 70B-class layer's projections at 16 and 4096 tokens, and skinny ones.  Each family runs
on shape-only devices of its own kind of chip (h200-like, mi300x-like, max1550-like), so
the large shapes cost no host time.  The sparse call is the library's 2:4 matmul on the
compressed weight; the dense one its GEMM forced to the algorithm the sparse call chose (the
same heuristic picks both, tile and split-K, unless a K slice would cut a metadata word),
so the two differ in their A operand only.  The speed-up is dense time over
sparse time as the device charged them: about 1 where launch latency or memory traffic
the 2:4 operand does not shrink bound the kernel, and marked where it falls below 1.  The xpu-like
library has no 2:4 GEMM and says so.  The sweep itself is fornax/scenarios/sparse_sweep.py
(Lab 5 tabulates a few of its shapes).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fornax.scenarios.sparse_sweep import SPECS, sweep
from fornax.stack import BUILTIN_FAMILIES, compose, make_config

from .results import Figures

SQUARES = [256, 512, 1024, 2048, 4096, 8192]
#: (label, m, n, k): a weight of m x k against n tokens
SHAPES = [("qkv 16tok", 10240, 16, 8192), ("mlp-up 16tok", 28672, 16, 8192),
          ("mlp-down 4096tok", 8192, 4096, 28672), ("qkv 4096tok", 10240, 4096, 8192),
          ("skinny k=64", 8192, 8192, 64), ("long k", 128, 128, 16384), ("small 64^3", 64, 64, 64)]
FIGURES = Figures("sparse24.speedup[{family}: {shape}]", "sparse24.sparse_us[{family}: {shape}]",
                  "sparse24.dense_us[{family}: {shape}]")

def main(vendors=BUILTIN_FAMILIES) -> None:
    console = Console(width=max(Console().width, 110))
    shapes = [(f"{s}^3", s, s, s) for s in SQUARES] + SHAPES
    for vendor in vendors:
        rows = sweep(vendor, shapes)
        lib = compose(make_config(vendor, spec=SPECS.get(vendor, "h200-like"), meta=True)).library
        table = Table(title=f"2:4 sparse vs dense bf16 GEMM — {vendor} {lib.name} on "
                            f"{SPECS.get(vendor, 'h200-like')} (simulated)")
        for col in ("shape", "m x n x k", "algorithm", "dense us", "2:4 us", "speed-up"):
            table.add_column(col, justify="left" if col in ("shape", "m x n x k", "algorithm") else "right")
        for r in rows:
            dims = f"{r['m']}x{r['n']}x{r['k']}"
            if "refused" in r:
                table.add_row(r["shape"], dims, "", f"{r['dense_s'] * 1e6:.1f}",
                              "[dim]not offered[/dim]", "[dim]-[/dim]")
                table.caption = f"2:4 refused by the library: {r['refused']}"
                continue
            where = f"{vendor}: {r['shape']}"
            FIGURES.record(f"sparse24.dense_us[{where}]", r["dense_s"] * 1e6, "us", kind="min",
                           note=f"simulated; the library's dense GEMM, {r['algorithm']}")
            FIGURES.record(f"sparse24.sparse_us[{where}]", r["sparse_s"] * 1e6, "us", kind="min",
                           note=f"simulated; the library's 2:4 matmul, {r['algorithm']}")
            FIGURES.record(f"sparse24.speedup[{where}]", r["speedup"], "x",
                           note="dense over 2:4 simulated time, the same algorithm")
            mark = "" if r["speedup"] >= 1 else " [red](< 1)[/red]"
            table.add_row(r["shape"], dims, r["algorithm"], f"{r['dense_s'] * 1e6:.1f}",
                          f"{r['sparse_s'] * 1e6:.1f}", f"{r['speedup']:.2f}x{mark}")
        console.print(table)


if __name__ == "__main__":
    main()
