"""Lab 5: kernel libraries -- tiling, small and irregular shapes, autotuning, 2:4 sparsity.

Experiments: the library seam's GEMM (fornax/layers/gemm.py, kernels in fornax/layers/blas.py)
on a square, a skinny decode-like and an irregular shape on each family: the algorithm and
tile its heuristic picks from ``[library] gemm_algorithms`` and why, the simulated device time
and the share of the float32 matrix peak; then the autotuner's pick beside it; then the
global-memory traffic of a one-output-per-lane kernel against the library's tiled kernel;
then where the 2:4 sparse matrix instruction pays (fornax/labs/lab05_sparsity.py).

Exercise 5.5 imports the student's own ``gemm.py`` deliberately (it runs their code, as a test
would): ``build(M, N, K)`` returns a tile-ISA program and its grid, which the check launches
through the library seam's ``custom_kernel`` on a fresh cuda-like stack, compares with numpy
and scores by the bytes the driver's kernel log records for it.
"""

from __future__ import annotations

import importlib.util
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from . import lab05_sparsity
from .lab import Exercise, Lab, Section, Table, figure, number_fact, text_fact

FAMILIES = ("cuda-like", "rocm-like", "xpu-like")
#: (what the shape stands for, (m, n, k)) of the library experiments
SHAPES = (("square", (512, 512, 512)), ("skinny (decode-like)", (16, 4096, 4096)),
          ("irregular", (1000, 1000, 1000)))
#: the shapes gemm.py is checked on: a square one and a ragged one (no side a multiple of 32)
CHECK_SHAPES = ((64, 64, 64), (75, 50, 40))
#: the tile (rows and columns of C per program instance) the traffic budget assumes
BUDGET_TILE = 32
#: how far over a well-tiled kernel's traffic a kernel may go
BUDGET_SLACK = 2
#: most program instances a gemm.py grid may launch (a guard against runaway grids)
MAX_INSTANCES = 4096

STARTER_GEMM = '''"""Lab 5, exercise 5.5: a GEMM kernel that reads global memory sparingly.

`fornax lab check 5` imports this file (it runs your code, as a test would) and, for each of
its shapes -- a square 64x64x64 and a ragged 75x50x40 -- calls build(M, N, K), which returns
(program, grid): a tile-ISA program (fornax/sim/isa.py; write it with
fornax/layers/kernel_builder.py's KernelBuilder) and its launch grid (x, y, z).  The program
computes C = A @ B for float32 row-major A [M, K], B [K, N], C [M, N]; its pointer parameters
are a, b, c in that order.  The check launches it through the library seam's
custom_kernel(program, grid, {"a": ..., "b": ..., "c": ...}) on a fresh cuda-like stack,
compares C with numpy, and reads the bytes the kernel moved from the driver's kernel log
(fornax/layers/driver/kernel_log.py).  It passes when C is right and the bytes are within

    budget = 2 * 4 * (K * (M * ceil(N / 32) + N * ceil(M / 32)) + M * N)

twice what a kernel with 32x32 output tiles moves (A read once per column of tiles, B once
per row of tiles, C written once).

This starter is right but naive: one program, one lane per output, and a K loop that loads
one element of A and one of B per lane per step -- every element of A is read N times and
every element of B M times.  Tile it: a program per output tile (ProgramId), a Loop over K
that Loads a tile of A and a tile of B (masked at the ragged edges) and accumulates with Dot.
"""

from fornax.layers.kernel_builder import KernelBuilder
from fornax.sim import isa


def build(M, N, K):
    kb = KernelBuilder("naive_gemm")
    a, b, c = (kb.param(p, "ptr", "float32") for p in ("a", "b", "c"))
    m_k, n = kb.const(K, "int64"), kb.const(N, "int64")
    zero = kb.emit(isa.Broadcast(kb.reg(), kb.const(0, "int64"), (M, N)))
    rows = kb.binary("add", kb.emit(isa.Reshape(kb.reg(), kb.arange(M), (M, 1))), zero)   # (M, N)
    cols = kb.binary("add", kb.emit(isa.Reshape(kb.reg(), kb.arange(N), (1, N))), zero)   # (M, N)
    acc = kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, "float32"), (M, N)))
    row_start = kb.binary("mul", rows, m_k)
    start = len(kb.body)                     # the loop body: emitted, then moved into the Loop
    x = kb.emit(isa.Load(kb.reg(), a, kb.binary("add", row_start, "%k")))            # A[i, k]
    y = kb.emit(isa.Load(kb.reg(), b, kb.binary("add", kb.binary("mul", "%k", n), cols)))  # B[k, j]
    kb.emit(isa.Binary(acc, "add", acc, kb.binary("mul", x, y)))
    body = tuple(kb.body[start:])
    del kb.body[start:]
    kb.emit(isa.Loop("%k", 0, K, 1, body))
    kb.emit(isa.Store(c, kb.binary("add", kb.binary("mul", rows, n), cols), acc))
    return kb.program(group_size=128), (1, 1, 1)
'''


def budget(m: int, n: int, k: int) -> int:
    """The traffic budget of an m x n x k float32 GEMM: BUDGET_SLACK times the bytes a kernel
    with BUDGET_TILE x BUDGET_TILE output tiles moves."""
    t = BUDGET_TILE
    return BUDGET_SLACK * 4 * (k * (m * math.ceil(n / t) + n * math.ceil(m / t)) + m * n)


def _shape(s: tuple[int, int, int]) -> str:
    return "x".join(map(str, s))


# -- the library's GEMM on each family ----------------------------------------------------------
@lru_cache(maxsize=1)
def _library() -> tuple[dict[str, Any], ...]:
    """Per family, shape and choice mode (heuristic, autotune): what the library picked, why,
    and what its kernels cost on the simulated device."""
    from fornax.stack import compose, make_config
    rows = []
    for fam in FAMILIES:
        stack = compose(make_config(fam))
        rt, lib, drv = stack.runtime, stack.library, stack.driver
        peak = drv.device_spec(0).peak("float32", True)
        for label, (m, n, k) in SHAPES:
            for tune in (False, True):
                a, b, c = rt.malloc(4 * m * k), rt.malloc(4 * k * n), rt.malloc(4 * m * n)
                first = len(drv.kernel_log)
                rec = lib.gemm(a, b, c, {"m": m, "n": n, "k": k, "dtype": "float32", "autotune": tune})
                rt.synchronize()
                ran = drv.kernel_log[first:]
                seconds = sum(r.duration_s for r in ran)
                rows.append({"family": fam, "label": label, "shape": (m, n, k), "autotune": tune,
                             "algorithm": rec.algorithm, "tile": "x".join(map(str, rec.options["tile"])),
                             "reason": rec.reason, "kernels": len(ran),
                             "instances": math.prod(ran[0].grid), "seconds": seconds,
                             "predicted": rec.predictions.get(rec.algorithm),
                             "efficiency": 2 * m * n * k / seconds / peak})
                for ptr in (a, b, c):
                    rt.free(ptr)
    return tuple(rows)


# -- running a gemm.py kernel through the library seam ------------------------------------------
def _launch(build: Any, m: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray, int, float]:
    """``build(m, n, k)``'s kernel launched through custom_kernel on a fresh cuda-like stack:
    (C read back, numpy's A @ B, bytes the kernel log records, simulated seconds).  Raises
    ValueError with a readable message for a malformed answer."""
    from fornax.sim import isa
    from fornax.stack import compose, make_config
    built = build(m, n, k)
    if not (isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], isa.Program)):
        raise ValueError(f"build({m}, {n}, {k}) returned {type(built).__name__}, not (program, grid)")
    program, grid = built
    try:
        grid3 = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    except (TypeError, ValueError):
        raise ValueError(f"the grid {grid!r} is not up to three integers") from None
    if len(grid3) != 3 or min(grid3) < 1 or math.prod(grid3) > MAX_INSTANCES:
        raise ValueError(f"the grid {grid!r} is not (x, y, z) of 1 to {MAX_INSTANCES} instances in all")
    ptrs = [p.name for p in program.params]
    if ptrs != ["a", "b", "c"] or any(p.kind != "ptr" for p in program.params):
        raise ValueError(f"the program's parameters are {ptrs or 'none'}; want pointers a, b, c in that order")
    stack = compose(make_config("cuda-like"))
    rt, drv = stack.runtime, stack.driver
    rng = np.random.default_rng(m * 10007 + n * 101 + k)
    a_host = rng.standard_normal((m, k)).astype(np.float32)
    b_host = rng.standard_normal((k, n)).astype(np.float32)
    a, b, c = rt.malloc(a_host.nbytes), rt.malloc(b_host.nbytes), rt.malloc(4 * m * n)
    rt.memcpy(a, a_host)
    rt.memcpy(b, b_host)
    rt.memcpy(c, np.full((m, n), np.nan, np.float32))
    rt.synchronize()
    first = len(drv.kernel_log)
    stack.library.custom_kernel(program, grid3, {"a": a, "b": b, "c": c})
    out = np.empty((m, n), np.float32)
    rt.memcpy_d2h(out, c)
    rt.synchronize()
    ran = drv.kernel_log[first:]
    return out, a_host @ b_host, sum(r.bytes for r in ran), sum(r.duration_s for r in ran)


def _load_build(path: Path) -> Any:
    """The student's ``build`` from ``path`` (their code, imported and run as a test would)."""
    spec = importlib.util.spec_from_file_location(f"fornax_lab05_gemm_{abs(hash(str(path)))}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn = getattr(mod, "build", None)
    if not callable(fn):
        raise TypeError("gemm.py defines no function build(M, N, K)")
    return fn


def _starter_build() -> Any:
    """The naive starter kernel's ``build`` (the lab's own copy, for the experiments)."""
    scope: dict[str, Any] = {}
    exec(compile(STARTER_GEMM, "<lab05 starter gemm.py>", "exec"), scope)   # noqa: S102 - our own text
    return scope["build"]


@lru_cache(maxsize=1)
def _traffic() -> tuple[dict[str, Any], ...]:
    """Per check shape: the naive starter's bytes and time, the library GEMM's, the budget."""
    from fornax.stack import compose, make_config
    naive = _starter_build()
    rows = []
    for m, n, k in CHECK_SHAPES:
        _, _, nbytes, seconds = _launch(naive, m, n, k)
        stack = compose(make_config("cuda-like"))
        rt, drv = stack.runtime, stack.driver
        a, b, c = rt.malloc(4 * m * k), rt.malloc(4 * k * n), rt.malloc(4 * m * n)
        first = len(drv.kernel_log)
        rec = stack.library.gemm(a, b, c, {"m": m, "n": n, "k": k, "dtype": "float32"})
        rt.synchronize()
        ran = drv.kernel_log[first:]
        rows.append({"shape": (m, n, k), "naive_bytes": nbytes, "naive_s": seconds,
                     "lib_algorithm": rec.algorithm, "lib_bytes": sum(r.bytes for r in ran),
                     "lib_s": sum(r.duration_s for r in ran), "budget": budget(m, n, k)})
    return tuple(rows)


def experiments(out: Path) -> list[Section]:
    lib, traffic = _library(), _traffic()
    _picture(lib, out / "gemm-efficiency.png")
    heur = [r for r in lib if not r["autotune"]]
    pairs = [(h, t) for h in heur for t in lib
             if t["autotune"] and t["family"] == h["family"] and t["shape"] == h["shape"]]
    return [
        Section("One GEMM routine, three shapes, three families",
                "The library seam's `gemm` (fornax/layers/gemm.py) on a freshly composed stack of each "
                "family (the default chip): float32, C = A @ B. Each family lists its algorithms -- a "
                "tile of C per work-group, a K depth, maybe split-K -- in `[library] gemm_algorithms` of "
                "its vendor.toml; the heuristic (fornax/layers/tiling.py) takes the largest tile that "
                "still fills the compute units and says why in the call's record (CallRecord.reason). "
                "The kernels are in fornax/layers/blas.py. Device time is what the driver's kernel log "
                "records for the call's kernels; efficiency is 2MNK / time over the chip's float32 "
                "matrix peak. The skinny decode-like shape (16 rows) cannot fill the units with large "
                "tiles, and a 1000-wide shape pads its edge tiles.",
                [Table("the heuristic's choice", ["family", "shape", "M x N x K", "algorithm", "tile",
                                                  "work-groups", "device time", "efficiency", "why"],
                       [[r["family"], r["label"], _shape(r["shape"]), r["algorithm"], r["tile"],
                         str(r["instances"]), f"{r['seconds'] * 1e6:.2f} µs", f"{r['efficiency']:.0%}",
                         r["reason"]] for r in heur])], ["gemm-efficiency.png"]),
        Section("The autotuner beside the heuristic",
                "With `autotune` the library prices every candidate algorithm with the simulator's "
                "cost model (GemmRoutines.predict: the kernels' attached estimates, without running "
                "them) and takes the fastest prediction. The prediction is a model, so the measured "
                "time of its pick can differ from the heuristic's, either way.",
                [Table("heuristic vs autotune", ["family", "M x N x K", "heuristic", "its time",
                                                 "autotuned", "predicted", "measured"],
                       [[h["family"], _shape(h["shape"]), h["algorithm"], f"{h['seconds'] * 1e6:.2f} µs",
                         t["algorithm"], f"{(t['predicted'] or 0) * 1e6:.2f} µs",
                         f"{t['seconds'] * 1e6:.2f} µs"] for h, t in pairs])]),
        Section("Global-memory traffic: one output per lane vs tiles",
                "Exercise 5.5's starter gemm.py (one program, one lane per output of C, a K loop "
                "loading one element of A and one of B per lane per step) launched through the "
                "library seam's `custom_kernel` (fornax/layers/library.py; the MAX-style front end "
                "calls it for custom ops) on the shapes the check uses, beside the library's own "
                "tiled GEMM on the same shape. Bytes are what the driver's kernel log "
                "(fornax/layers/driver/kernel_log.py, KernelRecord.bytes) records: bytes read plus "
                "bytes written, counted per active lane of every Load and Store. The naive kernel "
                "reads every element of A N times and of B M times: 4(2MNK) + 4MN bytes. The budget "
                f"the check applies is {BUDGET_SLACK}x what a kernel with {BUDGET_TILE}x{BUDGET_TILE} "
                f"output tiles moves: budget = {BUDGET_SLACK} * 4 * (K * (M * ceil(N/{BUDGET_TILE}) + "
                f"N * ceil(M/{BUDGET_TILE})) + M * N). The check imports your gemm.py deliberately "
                "and runs it, as a test would.",
                [Table("bytes moved, cuda-like", ["M x N x K", "naive kernel", "naive time",
                                                  "library algorithm", "library bytes", "library time",
                                                  "budget"],
                       [[_shape(r["shape"]), f"{r['naive_bytes']:,} B", f"{r['naive_s'] * 1e6:.2f} µs",
                         r["lib_algorithm"], f"{r['lib_bytes']:,} B", f"{r['lib_s'] * 1e6:.2f} µs",
                         f"{r['budget']:,} B"] for r in traffic])]),
        lab05_sparsity.section(out),
    ]


def _picture(lib: tuple[dict[str, Any], ...], path: Path) -> None:
    fig = figure(7, 3.4)
    ax = fig.subplots()
    width = 0.8 / len(FAMILIES)
    for i, fam in enumerate(FAMILIES):
        vals = [next(r["efficiency"] for r in lib if r["family"] == fam and r["label"] == label
                     and not r["autotune"]) for label, _ in SHAPES]
        ax.bar([j + (i - 1) * width for j in range(len(SHAPES))], [v * 100 for v in vals], width,
               label=fam, color=f"C{i}")
    ax.set_xticks(range(len(SHAPES)), [f"{label}\n{_shape(s)}" for label, s in SHAPES], fontsize=8)
    ax.set_ylabel("% of float32 matrix peak")
    ax.set_title("library GEMM, heuristic choice: efficiency per shape", fontsize=10)
    ax.legend(fontsize=8)
    fig.savefig(path, format="png", dpi=90)


def facts() -> dict[str, Any]:
    lib, traffic = _library(), _traffic()

    def pick(fam: str, label: str, tune: bool) -> dict[str, Any]:
        return next(r for r in lib if r["family"] == fam and r["label"] == label and r["autotune"] == tune)
    return {"cuda_irregular": pick("cuda-like", "irregular", False)["algorithm"],
            "rocm_skinny_groups": pick("rocm-like", "skinny (decode-like)", False)["instances"],
            "xpu_irregular_tuned": pick("xpu-like", "irregular", True)["algorithm"],
            "naive_square_kib": traffic[0]["naive_bytes"] / 1024,
            "sparse_gainers": lab05_sparsity.gainers("cuda-like")}


def _check_gemm(answers: dict[str, Any], folder: Path, facts: dict[str, Any]) -> tuple[bool, str, str]:
    """gemm.py's kernel computes A @ B on every check shape within the traffic budget."""
    want = ("C == A @ B (float32, within 1e-4) and kernel bytes <= budget on "
            + ", ".join(f"{_shape(s)} ({budget(*s):,} B)" for s in CHECK_SHAPES))
    path = folder / "gemm.py"
    if not path.is_file():
        return False, want, "no gemm.py"
    try:
        build = _load_build(path)
    except Exception as exc:         # noqa: BLE001 - the student's module may raise anything
        return False, want, f"gemm.py does not import: {type(exc).__name__}: {_first_line(exc)}"
    seen = []
    for m, n, k in CHECK_SHAPES:
        shape = _shape((m, n, k))
        try:
            got, truth, nbytes, _ = _launch(build, m, n, k)
        except ValueError as exc:
            return False, want, f"{shape}: {exc}"
        except Exception as exc:     # noqa: BLE001 - the student's code may raise anything
            return False, want, (f"{shape}: building or running the kernel raised "
                                 f"{type(exc).__name__}: {_first_line(exc)}")
        finite = bool(np.isfinite(got).all())
        err = f"largest error {float(np.max(np.abs(got - truth))):g}" if finite else "some outputs NaN or inf"
        if not np.allclose(got, truth, rtol=1e-4, atol=1e-4):
            bad = int(np.sum(~np.isclose(got, truth, rtol=1e-4, atol=1e-4)))
            return False, want, (f"{shape}: wrong result, {bad} of {m * n} outputs differ from numpy "
                                 f"({err}; C[0, 0] = {float(got[0, 0]):g}, "
                                 f"want {float(truth[0, 0]):g})")
        limit = budget(m, n, k)
        if nbytes > limit:
            return False, want, (f"{shape}: correct, but the kernel moved {nbytes:,} B, "
                                 f"{nbytes / limit:.1f}x the budget of {limit:,} B")
        seen.append(f"{shape}: {nbytes:,} B of {limit:,} B")
    return True, want, "correct within budget; " + "; ".join(seen)


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0][:160] if text else ""


LAB = Lab(
    number=5, slug="05-kernel-libraries", title="Kernel libraries", part="Part 5",
    goal="See how a vendor library's GEMM picks an algorithm and tile for square, skinny and "
         "irregular shapes on each family -- by heuristic or by autotuning -- and what that costs, "
         "then write a tiled GEMM kernel of your own that launches through the library seam and "
         "keeps its global-memory traffic within budget; last, see where a 2:4 structured-sparse "
         "GEMM beats the dense one and where it does not.",
    minutes=45, experiments=experiments, facts=facts,
    exercises=[
        Exercise("5.1", "Which algorithm does the cuda-like library's heuristic pick for the "
                 "irregular 1000x1000x1000 GEMM (its name, e.g. tile128x128x32)?",
                 text_fact("5.1", "cuda_irregular"),
                 "the heuristic in fornax/layers/gemm.py (GemmRoutines.choose) and fornax/layers/tiling.py"),
        Exercise("5.2", "How many work-groups (output tiles) does the rocm-like library launch for the "
                 "skinny 16x4096x4096 GEMM?", number_fact("5.2", "rocm_skinny_groups"),
                 "blas.grids in fornax/layers/blas.py and the tile in rocm_like/vendor.toml [library]"),
        Exercise("5.3", "Which algorithm does the xpu-like autotuner pick for the irregular "
                 "1000x1000x1000 GEMM?", text_fact("5.3", "xpu_irregular_tuned"),
                 "GemmRoutines.select and predict in fornax/layers/gemm.py (the cost model prices each "
                 "candidate)"),
        Exercise("5.4", "How many KiB (1024 bytes) does the driver's kernel log record for the naive "
                 "starter kernel on 64x64x64?", number_fact("5.4", "naive_square_kib"),
                 "KernelRecord.bytes in fornax/layers/driver/kernel_log.py: every active lane of every "
                 "Load and Store"),
        Exercise("5.5", "Make gemm.py (in this folder, written by `fornax lab new`) a tiled kernel: "
                 "build(M, N, K) returns (program, grid) computing C = A @ B, right on every check "
                 "shape and within the traffic budget. The check imports your gemm.py and runs it, "
                 "deliberately, as a test would.", _check_gemm,
                 "the library's tiled kernel (gemm_program in fornax/layers/blas.py) and the tile ISA "
                 "(fornax/sim/isa.py: Loop, Load with a mask, Dot)", points=2),
        Exercise("5.6", "Which of the sparsity experiment's shapes (square, decode, short-k, small) "
                 f"run more than {lab05_sparsity.GAIN}x faster as the cuda-like library's 2:4 matmul "
                 "than as its dense GEMM on the h200-like chip? Answer a list of their names, e.g. "
                 '["square", "small"] ([] for none); the page says why the others do not.',
                 lab05_sparsity.check_gainers,
                 "the roofline bound of each kernel: fornax/sim/cost.py (gemm_counters, kernel_cost "
                 "with sparsity 2:4) and docs/sparsity.md's cost model"),
    ],
    starter_files={"gemm.py": STARTER_GEMM})
