"""Dense vs 2:4 structured-sparse GEMM through a family's library, priced on a shape-only
device of the family's own kind of chip.

:func:`sweep` runs each bfloat16 shape ``m x n x k`` (A, the sparse operand, is ``m x k``: a
layer's weight; ``n`` is the token count) as the library's 2:4 matmul on the compressed
weight and as its dense GEMM forced to the algorithm the sparse call chose (the same
heuristic picks both, tile and split-K), so the two differ in their A operand only.  The
stack is shape-only (``meta=True``): kernels are priced by the cost model, not executed, so
large shapes cost no host time.  A family whose library has no 2:4 GEMM gets its dense time
and the refusal (code and hint).  ``benchmarks/sparse_sweep.py`` prints it for many shapes;
Lab 5 tabulates a few.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..layers.errors import FornaxError
from ..stack import Stack, compose, make_config

#: each family on its own kind of chip
SPECS = {"cuda-like": "h200-like", "rocm-like": "mi300x-like", "xpu-like": "max1550-like"}


def seconds(stack: Stack, call: Callable[[], Any]) -> float:
    """Simulated seconds of one library call, between two events on the default stream."""
    rt = stack.runtime
    start = rt.record_event()
    call()
    end = rt.record_event()
    rt.synchronize()
    return float(rt.elapsed_time(start, end)) / 1e3


def _kernels(stack: Stack, first: int) -> tuple[str, int]:
    """(the roofline bound of the longest kernel, bytes of all) the driver logged since ``first``."""
    ran = stack.driver.kernel_log[first:]
    return max(ran, key=lambda r: r.duration_s).bound, sum(r.bytes for r in ran)


def sweep(vendor: str, shapes: list[tuple[str, int, int, int]]) -> list[dict[str, Any]]:
    """One row per ``(label, m, n, k)``: dense and sparse simulated seconds, the algorithm,
    the speed-up (dense over sparse) and each call's roofline bound and bytes (``dense_bound``,
    ``dense_bytes``, ``sparse_...``), or the dense ones and why the family offers no sparse
    GEMM (``refused``: error type and code; ``hint``)."""
    spec = SPECS.get(vendor, "h200-like")
    stack = compose(make_config(vendor, spec=spec, meta=True))
    rt, lib = stack.runtime, stack.library
    p = rt.malloc(1 << 20)
    rows = []
    try:
        for label, m, n, k in shapes:
            params = {"m": m, "n": n, "k": k, "dtype": "bfloat16"}
            row: dict[str, Any] = {"shape": label, "m": m, "n": n, "k": k}
            calls: list[Any] = []
            first = len(stack.driver.kernel_log)
            try:
                row["sparse_s"] = seconds(stack, lambda: calls.append(lib.sparse_matmul(p, p, p, params)))
            except FornaxError as exc:
                row["refused"] = f"{type(exc).__name__} {exc.code}" if exc.code else str(exc)
                row["hint"] = exc.hint
                first = len(stack.driver.kernel_log)
                row["dense_s"] = seconds(stack, lambda: lib.gemm(p, p, p, params))
            else:
                row["sparse_bound"], row["sparse_bytes"] = _kernels(stack, first)
                first = len(stack.driver.kernel_log)
                # like for like: the dense GEMM with the sparse call's algorithm
                row["algorithm"] = calls[0].options["algorithm"]
                forced = {**params, "algorithm": row["algorithm"]}
                row["dense_s"] = seconds(stack, lambda: lib.gemm(p, p, p, forced))
                row["speedup"] = row["dense_s"] / row["sparse_s"]
            row["dense_bound"], row["dense_bytes"] = _kernels(stack, first)
            rows.append(row)
    finally:
        rt.free(p)
    return rows
