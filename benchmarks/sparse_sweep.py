"""Dense vs 2:4 structured-sparse GEMM through each family's library: simulated time and speed-up.

A sweep of bfloat16 shapes ``m x n x k`` (A, the sparse operand, is ``m x k``: a layer's
weight with ``m`` output features; ``n`` is the token count): squares from 256 to 8192,
a 70B-class layer's projections at 16 and 4096 tokens, and skinny ones.  Each family runs
on shape-only devices of its own kind of chip (h200-like, mi300x-like, max1550-like), so
the large shapes cost no host time.  The sparse call is the library's 2:4 matmul on the
compressed weight; the dense one its GEMM forced to the same tile algorithm in one pass
(like for like: the 2:4 path has no split-K, so a dense split-K choice would compare two
algorithms, not two operands).  The speed-up is dense time over
sparse time as the device charged them: about 1 where launch latency or memory traffic
the 2:4 operand does not shrink bound the kernel.  Beside it, the speed-up over the dense
heuristic's own choice, which is below 1 where that choice is split-K (fornax's 2:4 path
has none).  The xpu-like
library has no 2:4 GEMM and says so.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fornax.layers.errors import FornaxError
from fornax.stack import BUILTIN_FAMILIES, compose, make_config

from .results import Figures

SQUARES = [256, 512, 1024, 2048, 4096, 8192]
#: (label, m, n, k): a weight of m x k against n tokens
SHAPES = [("qkv 16tok", 10240, 16, 8192), ("mlp-up 16tok", 28672, 16, 8192),
          ("mlp-down 4096tok", 8192, 4096, 28672), ("qkv 4096tok", 10240, 4096, 8192),
          ("skinny k=64", 8192, 8192, 64), ("long k", 128, 128, 16384), ("small 64^3", 64, 64, 64)]
#: each family on its own kind of chip (as the GEMM sweep)
SPECS = {"cuda-like": "h200-like", "rocm-like": "mi300x-like", "xpu-like": "max1550-like"}
FIGURES = Figures("sparse24.speedup[{family}: {shape}]", "sparse24.vs_heuristic[{family}: {shape}]",
                  "sparse24.sparse_us[{family}: {shape}]", "sparse24.dense_us[{family}: {shape}]")


def _seconds(stack, call) -> float:
    """Simulated seconds of one library call, between two events on the default stream."""
    rt = stack.runtime
    start = rt.record_event()
    call()
    end = rt.record_event()
    rt.synchronize()
    return float(rt.elapsed_time(start, end)) / 1e3


def sweep(vendor: str, shapes: list[tuple[str, int, int, int]]) -> list[dict]:
    """One row per shape: dense and sparse simulated seconds and the speed-up (or why the
    family offers no sparse GEMM)."""
    spec = SPECS.get(vendor, "h200-like")
    stack = compose(make_config(vendor, spec=spec, meta=True))
    rt, lib = stack.runtime, stack.library
    p = rt.malloc(1 << 20)
    rows = []
    try:
        for label, m, n, k in shapes:
            params = {"m": m, "n": n, "k": k, "dtype": "bfloat16"}
            row: dict = {"shape": label, "m": m, "n": n, "k": k}
            try:
                calls: list = []
                row["sparse_s"] = _seconds(stack, lambda: calls.append(lib.sparse_matmul(p, p, p, params)))
                # like for like: the dense GEMM with the sparse call's tile, in one pass
                row["algorithm"] = calls[0].options["algorithm"]
                row["dense_s"] = _seconds(stack, lambda: lib.gemm(p, p, p, {**params, "algorithm": row["algorithm"]}))
                row["speedup"] = row["dense_s"] / row["sparse_s"]
            except FornaxError as exc:
                row["refused"] = f"{type(exc).__name__} {exc.code}" if exc.code else str(exc)
            # and the dense GEMM as the library's heuristic picks it (split-K where it fills the
            # device better): what a caller switching to 2:4 gains over its current call
            row["heuristic_s"] = _seconds(stack, lambda: lib.gemm(p, p, p, params))
            if "sparse_s" in row:
                row["vs_heuristic"] = row["heuristic_s"] / row["sparse_s"]
            rows.append(row)
    finally:
        rt.free(p)
    return rows


def main(vendors=BUILTIN_FAMILIES) -> None:
    console = Console(width=max(Console().width, 110))
    shapes = [(f"{s}^3", s, s, s) for s in SQUARES] + SHAPES
    for vendor in vendors:
        rows = sweep(vendor, shapes)
        lib = compose(make_config(vendor, spec=SPECS.get(vendor, "h200-like"), meta=True)).library
        table = Table(title=f"2:4 sparse vs dense bf16 GEMM — {vendor} {lib.name} on "
                            f"{SPECS.get(vendor, 'h200-like')} (simulated)")
        for col in ("shape", "m x n x k", "tile", "dense us", "2:4 us", "speed-up", "heuristic us",
                    "vs heuristic"):
            table.add_column(col, justify="left" if col in ("shape", "m x n x k", "tile") else "right")
        for r in rows:
            dims = f"{r['m']}x{r['n']}x{r['k']}"
            if "refused" in r:
                table.add_row(r["shape"], dims, "", "", "[dim]not offered[/dim]", "",
                              f"{r['heuristic_s'] * 1e6:.1f}", f"[dim]{r['refused']}[/dim]")
                continue
            where = f"{vendor}: {r['shape']}"
            FIGURES.record(f"sparse24.dense_us[{where}]", r["dense_s"] * 1e6, "us", kind="min",
                           note=f"simulated; the library's dense GEMM, {r['algorithm']} in one pass")
            FIGURES.record(f"sparse24.sparse_us[{where}]", r["sparse_s"] * 1e6, "us", kind="min",
                           note="simulated; the library's 2:4 matmul")
            FIGURES.record(f"sparse24.speedup[{where}]", r["speedup"], "x",
                           note="dense over 2:4 simulated time, the same tile")
            FIGURES.record(f"sparse24.vs_heuristic[{where}]", r["vs_heuristic"], "x",
                           note="the dense heuristic's simulated time over 2:4's")

            def ratio(x: float) -> str:
                return f"{x:.2f}x" + ("" if x >= 1 else " [red](< 1)[/red]")
            table.add_row(r["shape"], dims, r["algorithm"], f"{r['dense_s'] * 1e6:.1f}",
                          f"{r['sparse_s'] * 1e6:.1f}", ratio(r["speedup"]),
                          f"{r['heuristic_s'] * 1e6:.1f}", ratio(r["vs_heuristic"]))
        console.print(table)


if __name__ == "__main__":
    main()
