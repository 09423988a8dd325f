"""Lab 5's sparsity experiment: where the 2:4 sparse matrix instruction pays.

Per family on its own kind of chip (fornax/scenarios/sparse_sweep.py: shape-only devices, so
large shapes cost no host time), a large square, a decode-like skinny, a short-K and a small
bfloat16 GEMM, each as the library's dense GEMM and as its 2:4 matmul with the same
algorithm; the xpu-like library's refusal; and one real run on the tiny chip through the
library's prune, check, compress and matmul calls, with the compressed format's bytes and the
product's error against float64.  Exercise 5.6 asks which of the shapes gain more than
:data:`GAIN` on cuda-like.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .lab import Section, Table, answer, figure

FAMILIES = ("cuda-like", "rocm-like", "xpu-like")
#: (name, m, n, k) of the sparsity experiment: A (the 2:4 operand) is m x k, a layer's weight
SHAPES = (("square", 4096, 4096, 4096), ("decode", 10240, 16, 8192),
          ("short-k", 8192, 8192, 64), ("small", 64, 64, 64))
#: what each shape stands for
ROLES = {"square": "a large square", "decode": "a projection at 16 tokens (decode-like skinny)",
         "short-k": "a short K", "small": "a small GEMM"}
#: the speed-up exercise 5.6 asks about
GAIN = 1.5
#: the real run on the tiny chip: m x n x k, bfloat16 (sizes multiples of 16)
REAL = (64, 32, 128)


@lru_cache(maxsize=1)
def _sweep() -> tuple[dict[str, Any], ...]:
    """Dense vs 2:4 rows of every family (each row names its family and chip)."""
    from fornax.scenarios.sparse_sweep import SPECS, sweep
    from fornax.sim.spec import load_spec
    rows = []
    for fam in FAMILIES:
        spec = load_spec(SPECS[fam])
        for row in sweep(fam, list(SHAPES)):
            rows.append({**row, "family": fam, "chip": SPECS[fam],
                         "dense_peak": spec.matrix_peak["bfloat16"],
                         "sparse_peak": spec.sparse_peak("bfloat16")})
    return tuple(rows)


@lru_cache(maxsize=1)
def _real() -> tuple[dict[str, Any], ...]:
    """Per family with a 2:4 GEMM, one real run on the tiny chip: a random bfloat16 weight
    pruned, checked, compressed and multiplied by the library, read back and compared."""
    import ml_dtypes

    from fornax.sim import sparsity
    from fornax.stack import compose, make_config
    m, n, k = REAL
    rng = np.random.default_rng(5)
    w = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    rows = []
    for fam in FAMILIES:
        stack = compose(make_config(fam, spec="tiny"))
        rt, lib = stack.runtime, stack.library
        if not lib.sparse_info()["supported"]:
            continue
        params = {"m": m, "k": k, "dtype": "bfloat16"}
        pw, pb, pc = rt.malloc(w.nbytes), rt.malloc(b.nbytes), rt.malloc(4 * m * n)
        rt.memcpy_h2d(pw, w)
        rt.memcpy_h2d(pb, b)
        before = lib.sparse_prune_check(pw, params)
        lib.sparse_prune(pw, pw, params)
        after = lib.sparse_prune_check(pw, params)
        size, _ = lib.sparse_compressed_size(params)
        packed = rt.malloc(size)
        lib.sparse_compress(pw, packed, params)
        lib.sparse_matmul(packed, pb, pc, {**params, "n": n, "out_dtype": "float32"})
        pruned, raw, c = np.empty_like(w), np.empty(size, np.uint8), np.empty((m, n), np.float32)
        rt.memcpy_d2h(pruned, pw)
        rt.memcpy_d2h(raw, packed)
        rt.memcpy_d2h(c, pc)
        rt.synchronize()
        values_b, meta_b = sparsity.compressed_bytes(m, k, 2)
        values = raw[:values_b].view(ml_dtypes.bfloat16).reshape(m, k // 2)
        words = raw[size - meta_b:].view(np.int32).reshape(m, sparsity.metadata_words(k))
        truth = pruned.astype(np.float64) @ b.astype(np.float64)
        rows.append({"family": fam, "library": lib.sparse_info()["name"], "before": before,
                     "after": after, "dense_bytes": w.nbytes, "size": size, "values": values_b,
                     "meta": meta_b, "pad": size - values_b - meta_b,
                     "kept": float(np.count_nonzero(pruned)) / pruned.size,
                     "roundtrip": bool(np.array_equal(sparsity.expand(values, words, k), pruned)),
                     "error": float(np.max(np.abs(c - truth))), "largest": float(np.max(np.abs(truth)))})
    return tuple(rows)


def gainers(family: str = "cuda-like") -> list[str]:
    """The shapes whose 2:4 speed-up on ``family`` exceeds :data:`GAIN`, in table order."""
    return [r["shape"] for r in _sweep() if r["family"] == family and r.get("speedup", 0) > GAIN]


def section(out: Path) -> Section:
    """The experiment's write-up; its picture goes into ``out``."""
    rows, real = _sweep(), _real()
    _picture(rows, out / "sparse-speedup.png")
    refused = next(r for r in rows if "refused" in r)
    chips = [next(r for r in rows if r["family"] == fam) for fam in FAMILIES]
    m, n, k = REAL
    return Section(
        "2:4 structured sparsity: where the sparse matrix instruction pays",
        "A 2:4-sparse matrix keeps at most two nonzeros in every group of four along K; a sparse "
        "matrix instruction (`sparse_dot` in the tile ISA, fornax/sim/isa.py) reads only the kept "
        "half of A plus two bits of metadata per kept value and runs at the chip spec's "
        "`sparse_matrix_peak`, twice the dense rate (docs/sparsity.md). The library seam's "
        "`sparse_prune`, `sparse_compress` and `sparse_matmul` (fornax/layers/sparse_gemm.py, "
        "cuSPARSELt- and hipSPARSELt-shaped) reach it. Each family runs on a shape-only device "
        "(`meta=True`: kernels priced by the cost model, not executed) of its own kind of chip; "
        "each bfloat16 shape is priced as the 2:4 matmul and as the dense GEMM forced to the "
        "same algorithm (fornax/scenarios/sparse_sweep.py), so the two differ in their A operand "
        "only. The shapes: " + "; ".join(f"{ROLES[name]} ({name}, {mm}x{nn}x{kk})"
                                          for name, mm, nn, kk in SHAPES)
        + ". The bound and the bytes are what the driver's kernel log records for the kernels "
        "(KernelRecord.bound of the longest, KernelRecord.bytes of all). Twice "
        "the rate halves the matrix time, not the kernel time: a kernel bound by latency or by "
        "traffic that 2:4 does not shrink (B, C, the re-reads of B between row blocks) keeps "
        "most of its time, and a weight-bound skinny shape gains through bytes, its weight "
        "shrinking to 9/16.",
        [Table("the chips (bfloat16 matrix peak)", ["family", "chip", "dense", "2:4 sparse",
                                                    "2:4 GEMM in the library"],
               [[r["family"], r["chip"], f"{r['dense_peak'] / 1e12:.1f} TFLOP/s",
                 f"{r['sparse_peak'] / 1e12:.1f} TFLOP/s" if r["sparse_peak"] else "none",
                 "refused" if "refused" in r else "yes"] for r in chips]),
         Table("dense vs 2:4, bfloat16, simulated", ["family", "shape", "M x N x K", "algorithm",
                                                     "dense", "dense bound", "2:4", "2:4 bound",
                                                     "bytes, 2:4 / dense", "speed-up"],
               [[r["family"], r["shape"], f"{r['m']}x{r['n']}x{r['k']}", r.get("algorithm", "-"),
                 f"{r['dense_s'] * 1e6:.2f} µs", r["dense_bound"],
                 "refused" if "refused" in r else f"{r['sparse_s'] * 1e6:.2f} µs",
                 r.get("sparse_bound", "-"),
                 f"{r['sparse_bytes'] / r['dense_bytes']:.2f}" if "sparse_bytes" in r else "-",
                 f"{r['speedup']:.2f}x" if "speedup" in r else "-"] for r in rows]),
         Table("the xpu-like refusal (every 2:4 call)", ["family", "call", "error", "hint"],
               [[refused["family"], "sparse_matmul", refused["refused"], refused["hint"]]]),
         Table(f"a real run on the tiny chip: a random {m}x{k} bfloat16 weight, pruned, "
               f"compressed and multiplied by a {k}x{n} matrix (float32 output; the error is against "
               "the float64 product of the pruned weight, largest C its largest magnitude)",
               ["family", "library", "2:4 before / after prune", "kept", "dense bytes",
                "compressed", "values", "metadata", "padding", "expands to the pruned matrix",
                "max error vs float64", "largest C"],
               [[r["family"], r["library"], f"{r['before']} / {r['after']}", f"{r['kept']:.0%}",
                 f"{r['dense_bytes']:,} B", f"{r['size']:,} B", f"{r['values']:,} B",
                 f"{r['meta']:,} B", f"{r['pad']:,} B", "yes" if r["roundtrip"] else "no",
                 f"{r['error']:.2e}", f"{r['largest']:.1f}"] for r in real])],
        ["sparse-speedup.png"])


def _picture(rows: tuple[dict[str, Any], ...], path: Path) -> None:
    fig = figure(7, 3.2)
    ax = fig.subplots()
    fams = [f for f in FAMILIES if any(r["family"] == f and "speedup" in r for r in rows)]
    width = 0.8 / len(fams)
    for i, fam in enumerate(fams):
        vals = [next(r["speedup"] for r in rows if r["family"] == fam and r["shape"] == name)
                for name, *_ in SHAPES]
        chip = next(r["chip"] for r in rows if r["family"] == fam)
        ax.bar([j + (i - (len(fams) - 1) / 2) * width for j in range(len(SHAPES))], vals, width,
               label=f"{fam} ({chip})", color=f"C{FAMILIES.index(fam)}")
    for level, style in ((1.0, "-"), (2.0, ":")):
        ax.axhline(level, color="grey", linestyle=style, linewidth=0.8)
    ax.set_xticks(range(len(SHAPES)), [f"{name}\n{m}x{n}x{k}" for name, m, n, k in SHAPES], fontsize=8)
    ax.set_ylabel("dense time / 2:4 time")
    ax.set_ylim(0, 2.2)
    missing = [f for f in FAMILIES if f not in fams]
    ax.set_title("bfloat16 GEMM, 2:4 speed-up per shape" + (f" ({', '.join(missing)}: no 2:4 GEMM)"
                                                           if missing else ""), fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.savefig(path, format="png", dpi=90)


def check_gainers(answers: dict[str, Any], folder: Path, facts: dict[str, Any]) -> tuple[bool, str, str]:
    """Exercise 5.6: the answer names exactly the shapes that gain more than GAIN on cuda-like
    (a list of names, any order and case)."""
    want = list(facts["sparse_gainers"])
    shown = repr(want)
    got = answer(answers, "5.6")
    if not isinstance(got, list) or not all(isinstance(x, str) for x in got):
        return False, shown, repr(got) if got != "" else "(blank)"
    names = {x.strip().lower() for x in got}
    unknown = sorted(names - {name for name, *_ in SHAPES})
    if unknown:
        return False, shown, f"{got!r} (not shapes of the experiment: {', '.join(unknown)})"
    return names == set(want), shown, repr(got)
