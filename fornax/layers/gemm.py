r"""GEMM on a library: argument checks, the algorithm choice and the launch (cuBLASLt-shaped).

:class:`GemmRoutines` is mixed into :class:`~fornax.layers.library.LibraryBase`.
Each call picks an algorithm (a tile configuration, maybe split-K) by a
heuristic over shape, dtype and compute units, or by an autotuner that prices
every candidate with the simulator's cost model, and says why.  The kernels are
in :mod:`fornax.layers.blas`::

    C[b] = act(alpha * a_scale * b_scale * op(A[b]) @ op(B[b]) + beta * C[b] + bias)

``params`` (only ``m``, ``n``, ``k``, ``dtype`` are required):

========================  =====================================================================
``m n k batch``           sizes; ``batch`` defaults to 1
``dtype``                 A and B: float32, float16, bfloat16, float64, float8_e4m3fn, float8_e5m2
``out_dtype``             C: the input dtype (bfloat16 for fp8 inputs), or one the family lists
``trans_a trans_b``       the operand is stored transposed (A: k x m, B: n x k)
``stride_a stride_b       elements between batches; default packed (B: 0 unless ``b_batched``)
stride_c``
``b_batched``             legacy switch: B has a batch dimension (packed stride ``k*n``)
``alpha beta``            scalars (default 1 and 0); with ``beta == 0`` C is not read
``bias``                  device address of ``n`` elements of the output dtype, added per column
``activation``            none, relu, gelu (tanh approximation), silu
``a_scale b_scale``       per-tensor scales of fp8 inputs (host floats)
``tf32``                  float32 inputs rounded to TF32 before the multiply (families with a
                          TF32 mode)
``algorithm``             force an algorithm by name
``autotune``              pick by the cost model (default: the library's ``autotune``)
``deterministic``         split-K reduction order (default: the library's ``deterministic``)
``workspace_limit``       most workspace bytes an algorithm may use (default: the family's)
========================  =====================================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..sim.cost import kernel_cost
from ..sim.device import estimate_counters
from ..sim.isa import Program
from ..sim.spec import ChipSpec
from . import blas
from .binary import KernelBinary
from .call_record import CallRecord
from .driver import Module
from .binary import ShippedImage
from .library_core import LibraryCore
from .runtime import Runtime, Stream
from .tiling import choose_gemm_tile

#: a split-K algorithm is considered when the output tiles fill less than this share of the units
SPLIT_K_FILL = 0.5
#: ... and K cuts into slices of at least this many whole k-steps
SPLIT_K_MIN_STEPS = 4


@dataclass(frozen=True)
class Algorithm:
    """One GEMM algorithm of the family's ``[[library.gemm_algorithms]]`` table."""

    name: str
    tile: tuple[int, int, int]
    split_k: int = 1
    dtypes: frozenset[str] | None = None     # None: every dtype the library supports

    def k_tile(self, dtype: str) -> int:
        """K depth for ``dtype``: one k-step moves the bytes the listed depth moves in 4-byte
        elements (fp16/bf16 twice as deep, fp8 four times, fp64 half)."""
        return max(8, self.tile[2] * 4 // blas.ITEMSIZE[dtype])

    def effective(self, dtype: str) -> tuple[int, int, int]:
        return (self.tile[0], self.tile[1], self.k_tile(dtype))


@dataclass(frozen=True)
class GemmProblem:
    """A validated GEMM call."""

    m: int
    n: int
    k: int
    batch: int
    dtype: str
    out: str
    trans_a: bool
    trans_b: bool
    strides: tuple[int, int, int]
    alpha: float
    beta: float
    bias: int | None
    act: str
    scale: float
    tf32: bool

    def variant(self, algo: Algorithm) -> blas.GemmVariant:
        return blas.GemmVariant(self.dtype, self.out, algo.effective(self.dtype), self.trans_a,
                                self.trans_b, self.beta != 0, self.bias is not None, self.act,
                                self.tf32, algo.split_k, self.strides[1] != 0)

    def workspace(self, algo: Algorithm) -> int:
        acc = "float64" if self.dtype == "float64" else "float32"
        return blas.workspace_bytes(algo.split_k, self.batch, self.m, self.n, acc)


#: an autotuned choice: the algorithm, why, and every candidate's predicted seconds
Selection = tuple[Algorithm, str, dict[str, float]]


def _no_workspace(algo: Algorithm) -> int:
    return 0


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class GemmRoutines(LibraryCore):
    """GEMM on a library (mixin for LibraryBase): validation, algorithm choice, launches."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        lib = self.facts["library"]
        self.algorithms = [Algorithm(a["name"], (a["tile"][0], a["tile"][1], a["tile"][2]),
                                     int(a.get("split_k", 1)),
                                     frozenset(a["dtypes"]) if "dtypes" in a else None)
                           for a in lib["gemm_algorithms"]]
        self.dtypes: frozenset[str] = frozenset(lib["gemm_dtypes"])
        #: input dtype -> output dtypes allowed besides the input's own
        self.out_dtypes: dict[str, list[str]] = {d: list(v) for d, v in
                                                 lib.get("gemm_out_dtypes", {}).items()}
        self.tf32_mode: str | None = lib.get("tf32_mode")
        #: library options (cublasLtMatmulPreference / a handle's math and determinism settings)
        self.autotune: bool = bool(lib.get("autotune", False))
        self.deterministic: bool = bool(lib.get("deterministic", True))
        self.workspace_limit: int = int(lib.get("workspace_limit", 32 << 20))
        self._order_rng = np.random.default_rng(int(lib.get("reduction_seed", 0)))
        self._images: dict[tuple[blas.GemmVariant, str, str], KernelBinary] = {}
        self._tuned: dict[tuple[GemmProblem, int], Selection] = {}
        #: the heuristic's choice per (m, n, k, batch, dtype, workspace limit, compute units)
        self._chosen: dict[tuple[Any, ...], tuple[Algorithm, str]] = {}
        self._programs_cache: dict[blas.GemmVariant, tuple[Program, Program | None]] = {}

    # -- algorithm choice ------------------------------------------------------------------
    def _candidates(self, dtype: str, workspace: Callable[[Algorithm], int] = _no_workspace,
                    limit: int | None = None) -> list[Algorithm]:
        limit = self.workspace_limit if limit is None else limit
        return [a for a in self.algorithms
                if (a.dtypes is None or dtype in a.dtypes) and workspace(a) <= limit]

    def choose(self, m: int, n: int, batch: int, k: int | None = None, dtype: str = "float32",
               candidates: list[Algorithm] | None = None) -> tuple[Algorithm, str]:
        """The heuristic: the shared tile rule (layers/tiling.py) over the family's one-pass
        algorithms by shape; split-K when the output tiles leave most units idle and K is
        long; the K depth of every tile follows the dtype (``Algorithm.k_tile``)."""
        algos = self._candidates(dtype) if candidates is None else candidates
        plain = [a for a in algos if a.split_k == 1]
        if not plain:
            raise self._error(f"no gemm algorithm of {self.name} supports {dtype} within the "
                              "workspace limit")
        units = self.runtime.driver.properties(self.runtime.current_device()).compute_units
        i, why = choose_gemm_tile(m, n, batch, units, [a.tile for a in plain])
        algo = plain[i]
        bk = algo.k_tile(dtype)
        why = f"{why}; k tile {bk} for {dtype}"
        count = math.ceil(m / algo.tile[0]) * math.ceil(n / algo.tile[1]) * batch
        if k is not None and count < SPLIT_K_FILL * units:
            best: tuple[tuple[int, int], Algorithm, int, int] | None = None
            for a in algos:
                if a.split_k <= 1:
                    continue
                tiles = math.ceil(m / a.tile[0]) * math.ceil(n / a.tile[1]) * batch
                steps = k // (a.split_k * a.k_tile(dtype))
                if steps < SPLIT_K_MIN_STEPS or k % (a.split_k * a.k_tile(dtype)):
                    continue
                score = (min(tiles * a.split_k, units), -a.split_k)
                if best is None or score > best[0]:
                    best = (score, a, tiles, steps)
            if best is not None and best[0][0] > count:
                _, algo, tiles, steps = best
                why = (f"split-K {algo.split_k}: {tiles} output tiles fill {tiles}/{units} units, "
                       f"{tiles * algo.split_k} tiles with K cut in {algo.split_k} "
                       f"({steps} k-steps of {algo.k_tile(dtype)} each); {why}")
        return algo, why

    def predict(self, problem: GemmProblem, algo: Algorithm) -> float:
        """Simulated seconds of ``algo`` on ``problem``: its kernels' attached estimates priced by
        the cost model with the current device's spec (what a shape-only device would charge)."""
        spec = self._spec()
        v = problem.variant(algo)
        main, red = self._programs(v)
        g_main, g_red = blas.grids(v, problem.m, problem.n, problem.batch)
        args = self._fake_args(problem, v)
        total = kernel_cost(spec, estimate_counters(main, g_main, args), main.meta).duration_s
        if red is not None and g_red is not None:
            total += kernel_cost(spec, estimate_counters(red, g_red, args), red.meta).duration_s
        return total

    def _spec(self) -> ChipSpec:
        """The current device's chip spec (``Driver.device_spec``), what the autotuner prices with."""
        spec: ChipSpec = self.runtime.driver.device_spec(self.runtime.current_device())
        return spec

    @staticmethod
    def _fake_args(p: GemmProblem, v: blas.GemmVariant) -> dict[str, int]:
        """Launch arguments for pricing: buffers laid out back to back from 0."""
        item, out = blas.ITEMSIZE[v.dtype], blas.ITEMSIZE[v.out]
        a_end = p.batch * p.m * p.k * item
        b_end = a_end + (p.batch if v.b_batched else 1) * p.k * p.n * item
        c_end = b_end + p.batch * p.m * p.n * out
        ks = math.ceil(p.k / v.split)
        return {"a": 0, "b": a_end, "c": b_end, "ws": c_end, "order": c_end, "bias": c_end,
                "m": p.m, "n": p.n, "k": p.k, "ks": ks}

    # -- kernels -----------------------------------------------------------------------------
    def _names(self, v: blas.GemmVariant) -> tuple[str, str]:
        base = f"{self.name}_gemm_{v.tag()}"
        return base, f"{base}_reduce"

    def _programs(self, v: blas.GemmVariant) -> tuple[Program, Program | None]:
        cache = self._programs_cache
        if v not in cache:
            main_name, red_name = self._names(v)
            cache[v] = (blas.gemm_program(main_name, v, self.group_size),
                        blas.reduce_program(red_name, v, self.group_size) if v.split > 1 else None)
        return cache[v]

    def _module(self, v: blas.GemmVariant) -> tuple[Module, ShippedImage]:
        dev = self.runtime.current_device()
        props = self.runtime.driver.properties(dev)
        image = self._image_for(props.target, self.runtime.driver.loadable_formats(dev))
        key = (v, image["format"], image["target"])
        if key not in self._images:
            self._images[key] = self.build([p for p in self._programs(v) if p is not None],
                                           image["format"], image["target"])
        return self.runtime.load_module(self._images[key]), image

    # -- GEMM --------------------------------------------------------------------------------
    def _problem(self, params: dict[str, Any]) -> GemmProblem:
        if not isinstance(params, dict):
            raise self._error(f"gemm params must be a dict, got {type(params).__name__}")
        missing = [key for key in ("m", "n", "k", "dtype") if key not in params]
        if missing:
            raise self._error(f"gemm params lack {', '.join(missing)}",
                              hint="pass m, n, k and dtype (and optionally batch, strides, ...)")
        sizes = {key: params.get(key, 1) for key in ("m", "n", "k", "batch")}
        for key, val in sizes.items():
            if not _is_int(val) or val <= 0:
                raise self._error("gemm sizes must be positive, got "
                                  + " ".join(f"{k}={v!r}" for k, v in sizes.items()))
        m, n, k, batch = (int(sizes[key]) for key in ("m", "n", "k", "batch"))
        dtype = params["dtype"]
        dtype = getattr(dtype, "value", dtype)
        if dtype not in self.dtypes:
            raise self._error(f"gemm does not support {dtype} (supports {', '.join(sorted(self.dtypes))})")
        fp8 = dtype in blas.FP8
        out = params.get("out_dtype") or ("bfloat16" if fp8 else dtype)
        out = getattr(out, "value", out)
        allowed = ([] if fp8 else [dtype]) + self.out_dtypes.get(dtype, [])
        if out not in allowed:
            raise self._error(f"gemm with {dtype} inputs cannot write {out} "
                              f"(outputs: {', '.join(allowed) or 'none'})")
        flags: dict[str, bool] = {}
        for key in ("trans_a", "trans_b", "tf32", "b_batched"):
            val = params.get(key, False)
            if not isinstance(val, (bool, np.bool_)):
                raise self._error(f"gemm {key} must be true or false, got {val!r}")
            flags[key] = bool(val)
        if flags["tf32"]:
            if self.tf32_mode is None:
                raise self._error(f"{self.name} has no TF32 mode", hint="call without tf32")
            if dtype != "float32":
                raise self._error(f"tf32 applies to float32 inputs, not {dtype}")
        packed = (m * k, k * n if (flags["b_batched"] or batch == 1) else 0, m * n)
        strides: list[int] = []
        for key, default in zip(("stride_a", "stride_b", "stride_c"), packed):
            val = params.get(key, default)
            if not _is_int(val) or val < 0:
                raise self._error(f"gemm {key} must be a non-negative integer, got {val!r}")
            strides.append(int(val))
        if batch > 1 and strides[2] < m * n:
            raise self._error(f"stride_c={strides[2]} is smaller than m*n={m * n}: the batches' "
                              "outputs would overlap", hint="use stride_c >= m*n")
        scalars: dict[str, float] = {}
        for key, fallback in (("alpha", 1.0), ("beta", 0.0), ("a_scale", 1.0), ("b_scale", 1.0)):
            val = params.get(key, fallback)
            if not isinstance(val, (int, float, np.integer, np.floating)) or isinstance(val, bool) \
                    or not math.isfinite(val):
                raise self._error(f"gemm {key} must be a finite number, got {val!r}")
            scalars[key] = float(val)
        if not fp8 and (scalars["a_scale"] != 1.0 or scalars["b_scale"] != 1.0):
            raise self._error(f"a_scale and b_scale apply to fp8 inputs, not {dtype}")
        act = params.get("activation", "none") or "none"
        if act not in blas.ACTIVATIONS:
            raise self._error(f"unknown gemm activation {act!r} (known: {', '.join(blas.ACTIVATIONS)})")
        bias = params.get("bias")
        if bias is not None and not _is_int(bias):
            raise self._error(f"gemm bias must be a device address, got {bias!r}")
        return GemmProblem(m, n, k, batch, dtype, out, flags["trans_a"], flags["trans_b"],
                           (strides[0], strides[1], strides[2]), scalars["alpha"], scalars["beta"],
                           None if bias is None else int(bias), act,
                           scalars["a_scale"] * scalars["b_scale"], flags["tf32"])

    def select(self, problem: GemmProblem, params: dict[str, Any] | None = None) -> Selection:
        """The algorithm for ``problem``: forced, autotuned or heuristic; and the predictions."""
        params = params or {}
        limit = params.get("workspace_limit", self.workspace_limit)
        if not _is_int(limit) or limit < 0:
            raise self._error(f"gemm workspace_limit must be a non-negative integer, got {limit!r}")
        forced = params.get("algorithm")
        tune = params.get("autotune", self.autotune)
        if forced is None and not tune:
            # the heuristic reads the shape, the dtype, the workspace limit and the device's
            # compute units only: its answer is kept per those
            units = self.runtime.driver.properties(self.runtime.current_device()).compute_units
            chosen_key = (problem.m, problem.n, problem.k, problem.batch, problem.dtype, int(limit), units)
            chosen = self._chosen.get(chosen_key)
            if chosen is None:
                if len(self._chosen) >= 4096:          # shapes that keep changing: start afresh
                    self._chosen.clear()
                candidates = self._candidates(problem.dtype, problem.workspace, int(limit))
                chosen = self._chosen[chosen_key] = self.choose(
                    problem.m, problem.n, problem.batch, problem.k, problem.dtype, candidates)
            return chosen[0], chosen[1], {}
        candidates = self._candidates(problem.dtype, problem.workspace, int(limit))
        if forced is not None:
            algo = next((a for a in self.algorithms if a.name == forced), None)
            if algo is None:
                raise self._error(f"unknown gemm algorithm {forced!r} (known: "
                                  f"{', '.join(a.name for a in self.algorithms)})")
            if algo not in candidates:
                raise self._error(f"algorithm {forced} does not run {problem.dtype} within a workspace "
                                  f"of {limit} bytes (needs {problem.workspace(algo)})")
            return algo, "requested by the caller", {}
        key = (problem, int(limit))
        if key not in self._tuned:
            if len(self._tuned) >= 4096:               # problems that keep changing: start afresh
                self._tuned.clear()
            heur, _ = self.choose(problem.m, problem.n, problem.batch, problem.k, problem.dtype,
                                  candidates)
            predictions = {a.name: self.predict(problem, a) for a in candidates}
            best = min(candidates, key=lambda a: (predictions[a.name], a.name != heur.name))
            why = (f"autotune: fastest of {len(candidates)} by the cost model, "
                   f"{predictions[best.name] * 1e6:.2f} us (heuristic {heur.name}: "
                   f"{predictions[heur.name] * 1e6:.2f} us); tile "
                   f"{'x'.join(map(str, best.effective(problem.dtype)))}")
            self._tuned[key] = (best, why, predictions)
        return self._tuned[key]

    def gemm(self, a: int, b: int, c: int, params: dict[str, Any],
             stream: Stream | None = None) -> CallRecord:
        """``C = act(alpha * scale * op(A) @ op(B) + beta * C + bias)`` per batch (see the module
        docstring for ``params``); the record names the algorithm, the image and why."""
        p = self._problem(params)
        algo, reason, predictions = self.select(p, params)
        deterministic = params.get("deterministic", self.deterministic)
        if not isinstance(deterministic, (bool, np.bool_)):
            raise self._error(f"gemm deterministic must be true or false, got {deterministic!r}")
        v = p.variant(algo)
        module, image = self._module(v)
        main, red = self._names(v)
        g_main, g_red = blas.grids(v, p.m, p.n, p.batch)
        scalars = {"alpha": p.alpha}
        if v.beta:
            scalars["beta"] = p.beta
        if v.scaled:
            scalars["scale"] = p.scale
        sizes = {"m": p.m, "n": p.n, "k": p.k, "sa": p.strides[0], "sb": p.strides[1],
                 "sc": p.strides[2]}
        bias = {"bias": p.bias} if p.bias is not None else {}
        rt = self.runtime
        ws_bytes = p.workspace(algo)
        if g_red is None:                     # one pass: no split-K reduction
            rt.launch(module, main, g_main, {"a": a, "b": b, "c": c, **bias, **sizes, **scalars}, stream)
        else:
            order = np.arange(v.split, dtype=np.int64)
            if not deterministic:
                # atomics-like: partial sums land in an order that differs from call to call
                order = self._order_rng.permutation(v.split).astype(np.int64)
            ws = rt.malloc(ws_bytes, stream)
            try:
                parts = ws + blas.order_bytes(v.split)
                rt.memcpy_h2d(ws, order, stream)
                rt.launch(module, main, g_main, {"a": a, "b": b, "c": parts, **sizes,
                                                 "ks": math.ceil(p.k / v.split)}, stream)
                rt.launch(module, red, g_red, {"ws": parts, "order": ws, "c": c, **bias, "m": p.m,
                                               "n": p.n, "sc": p.strides[2], **scalars}, stream)
            finally:
                rt.free(ws)
        options: dict[str, Any] = {
            "dtype": p.dtype, "out_dtype": p.out, "trans": ("T" if p.trans_a else "N")
            + ("T" if p.trans_b else "N"), "alpha": p.alpha, "beta": p.beta,
            "activation": p.act, "bias": p.bias is not None, "tf32": p.tf32,
            "split_k": v.split, "deterministic": bool(deterministic), "tile": list(v.tile)}
        if p.tf32:
            options["compute"] = self.tf32_mode
        record = CallRecord("gemm", algo.name, reason, f"{image['format']}:{image['target']}",
                            (p.batch, p.m, p.n, p.k), ws_bytes, dict(predictions), options)
        self.calls.append(record)
        return record
