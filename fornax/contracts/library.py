"""The library seam's contract, clause by clause.

Every clause drives the family's library (``Vendor.library``) over the
family's own runtime and driver on fresh simulated devices, and compares what
comes back with a float64 numpy reference computed from the very inputs the
device saw (rounded to the call's dtype first).

Tolerances.  A GEMM element passes when

    |out - ref| <= RTOL[dtype] * |ref| + ACC * k * (|A| @ |B|)

``RTOL`` covers rounding the result once to the output dtype (about twice the
dtype's unit roundoff); the second term is the worst-case error of a float32
accumulation over ``k`` products (``ACC`` = 2 * 2**-24 per product).  A
library that accumulates float16 or bfloat16 products in their own dtype
misses this bound at ``k`` of a few hundred, which the clauses use.

| dtype | RTOL | why |
|---|---|---|
| float64 | 1e-12 | float64 output; float32 accumulation is not allowed there |
| float32 | 1e-6 | unit roundoff 6e-8, twice over, plus slack |
| float16 | 1e-3 | unit roundoff 4.9e-4 |
| bfloat16 | 8e-3 | unit roundoff 3.9e-3 |
| float8_e4m3fn | 1.25e-1 | unit roundoff 6.25e-2 |
| float8_e5m2 | 2.5e-1 | unit roundoff 1.25e-1 |

Row routines (softmax, layer norm, RMS norm) pass when
``|out - ref| <= ROW_RTOL[dtype] * (|ref| + max |ref| of the row)`` with
ROW_RTOL 1e-5 (float32), 2e-3 (float16), 1.6e-2 (bfloat16): the reductions
run in float32, so the error is a few roundings of the output dtype.

Routines the :class:`~fornax.layers.library.Library` protocol names but an
implementation lacks fail with ``not implemented: library.ROUTINE``; a clause
about a routine the protocol does not name has nothing to check and passes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..layers import library as library_layer
from ..layers.errors import FornaxError, LibraryError
from ..sim.device import Device
from .base import ContractFailure, Subject, clause, require

SEAM = "library"

#: per-output-dtype relative tolerance (one rounding of the result); see the module docstring
RTOL = {"float64": 1e-12, "float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3,
        "float8_e4m3fn": 1.25e-1, "float8_e5m2": 2.5e-1}
#: float32 accumulation: worst-case error per accumulated product, relative to |a||b|
ACC = 2.0 * 2.0 ** -24


# -- helpers -----------------------------------------------------------------------------------
def protocol_requires(routine: str) -> bool:
    """Whether the Library protocol (as it is when the clause runs) names ``routine``."""
    proto = library_layer.Library
    names = getattr(proto, "__protocol_attrs__", None)
    return routine in names if names is not None else hasattr(proto, routine)


def routine_of(lib, routine: str):
    """The bound routine, or a failure naming it as the hook that is missing."""
    fn = getattr(lib, routine, None)
    if not callable(fn):
        raise ContractFailure(f"not implemented: library.{routine} (the Library protocol requires it)")
    return fn


def open_library(s: Subject):
    """(runtime, library) of the family on the subject's devices."""
    rt = s.runtime()
    return rt, s.vendor.library(rt)


def np_dtype(name: str) -> np.dtype:
    from ..sim.isa import np_dtype as isa_np_dtype
    return isa_np_dtype(name)


def to_device(rt, host: np.ndarray) -> int:
    ptr = rt.malloc(max(host.nbytes, 1))
    rt.memcpy_h2d(ptr, np.ascontiguousarray(host))
    return ptr


def from_device(rt, ptr: int, shape: tuple, dtype) -> np.ndarray:
    out = np.empty(shape, np_dtype(dtype) if isinstance(dtype, str) else dtype)
    rt.memcpy_d2h(out, ptr)
    return out


def random_operand(rng: np.random.Generator, shape: tuple, dtype: str) -> np.ndarray:
    """Standard-normal values rounded to ``dtype`` (the reference uses the rounded values)."""
    return rng.standard_normal(shape).astype(np.float32).astype(np_dtype(dtype))


def gemm_bound(a64: np.ndarray, b64: np.ndarray, ref: np.ndarray, k: int, dtype: str) -> np.ndarray:
    """The per-element error bound of the module docstring."""
    return RTOL[dtype] * np.abs(ref) + ACC * k * (np.abs(a64) @ np.abs(b64)) + 1e-30


def check_close(what: str, out: np.ndarray, ref: np.ndarray, bound: np.ndarray) -> None:
    out64 = np.asarray(out, np.float64)
    if out64.shape != ref.shape:
        raise ContractFailure(f"{what}: result has shape {out64.shape}, expected {ref.shape}")
    if not np.all(np.isfinite(out64)):
        raise ContractFailure(f"{what}: the result holds non-finite values")
    err = np.abs(out64 - ref)
    bad = err > bound
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ContractFailure(f"{what}: {int(bad.sum())} of {bad.size} elements outside tolerance; "
                              f"at {idx} got {out64[idx]:.6g}, float64 reference {ref[idx]:.6g} "
                              f"(bound {bound[idx]:.3g})")


def expect_library_error(fn, what: str) -> LibraryError:
    try:
        fn()
    except LibraryError as exc:
        return exc
    except FornaxError as exc:
        raise ContractFailure(f"{what}: raised {type(exc).__name__} ({exc}), expected a LibraryError") from None
    raise ContractFailure(f"{what}: no error was raised")


def run_gemm(rt, lib, rng, m: int, n: int, k: int, batch: int, b_batched: bool, dtype: str):
    """One plain GEMM C = A @ B on the device: (record, out, ref, bound)."""
    a = random_operand(rng, (batch, m, k), dtype)
    b = random_operand(rng, (batch if b_batched else 1, k, n), dtype)
    pa, pb = to_device(rt, a), to_device(rt, b)
    pc = rt.malloc(batch * m * n * np_dtype(dtype).itemsize)
    params = {"m": m, "n": n, "k": k, "batch": batch, "b_batched": b_batched, "dtype": dtype}
    record = routine_of(lib, "gemm")(pa, pb, pc, params)
    out = from_device(rt, pc, (batch, m, n), dtype)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = a64 @ b64
    return record, out, ref, gemm_bound(a64, b64, ref, k, dtype)


def gemm_sweep(s: Subject, dtype: str, seed: int, cases: int, kmax: int) -> None:
    rt, lib = open_library(s)
    rng = np.random.default_rng(seed)
    shapes = [(1, 1, 1, 1, False), (33, 17, kmax, 1, False)]       # degenerate, and a long reduction
    while len(shapes) < cases:
        shapes.append((int(rng.integers(1, 97)), int(rng.integers(1, 97)), int(rng.integers(1, kmax + 1)),
                       int(rng.integers(1, 4)), bool(rng.integers(0, 2))))
    for m, n, k, batch, b_batched in shapes:
        _, out, ref, bound = run_gemm(rt, lib, rng, m, n, k, batch, b_batched, dtype)
        check_close(f"{dtype} gemm m={m} n={n} k={k} batch={batch} b_batched={b_batched}", out, ref, bound)


# -- clauses -----------------------------------------------------------------------------------
@clause(SEAM, "L01", "describes itself: shipped formats, graph ops, a report naming the vendor")
def describes(s: Subject) -> None:
    _, lib = open_library(s)
    fmts = routine_of(lib, "formats")()
    require(len(fmts) > 0 and all(isinstance(f, str) and f for f in fmts), f"formats() is {fmts!r}")
    ops = routine_of(lib, "ops")()
    require(all(isinstance(o, str) and o for o in ops), f"ops() is {ops!r}, not a set of op names")
    rep = routine_of(lib, "report")()
    require(isinstance(rep, dict) and rep.get("vendor") == s.vendor.name,
            f"report() must be a dict naming the vendor, got {str(rep)[:80]}")
    require(isinstance(getattr(lib, "name", None), str) and lib.name, "the library has no name")


@clause(SEAM, "L02", "float32 GEMM over random shapes (batched, shared or batched B) matches float64")
def gemm_float32(s: Subject) -> None:
    gemm_sweep(s, "float32", seed=11, cases=6, kmax=96)


@clause(SEAM, "L03", "float16 GEMM matches float64 within float32-accumulation tolerance")
def gemm_float16(s: Subject) -> None:
    gemm_sweep(s, "float16", seed=12, cases=5, kmax=384)


@clause(SEAM, "L04", "bfloat16 GEMM matches float64 within float32-accumulation tolerance")
def gemm_bfloat16(s: Subject) -> None:
    gemm_sweep(s, "bfloat16", seed=13, cases=5, kmax=384)


@clause(SEAM, "L05", "each call records its algorithm and why; the same shape gets the same choice")
def algorithm_choice(s: Subject) -> None:
    rt, lib = open_library(s)
    rng = np.random.default_rng(5)
    records = []
    for m, n, k in ((8, 8, 8), (96, 80, 32), (8, 8, 8)):
        rec, out, ref, bound = run_gemm(rt, lib, rng, m, n, k, 1, False, "float32")
        check_close(f"float32 gemm m={m} n={n} k={k}", out, ref, bound)
        for field in ("routine", "algorithm", "reason"):
            value = getattr(rec, field, None)
            require(isinstance(value, str) and value.strip(),
                    f"the call record's {field!r} is {value!r}: a call must say which algorithm ran and why")
        records.append(rec)
    require(records[0].algorithm == records[2].algorithm,
            f"the same shape chose {records[0].algorithm} and then {records[2].algorithm}")
    listed = routine_of(lib, "report")().get("algorithms")
    if listed is not None:                 # a library that lists its algorithms must choose among them
        names = {a["name"] if isinstance(a, dict) else str(a) for a in listed}
        for rec in records:
            require(rec.algorithm in names, f"algorithm {rec.algorithm!r} is not in the library's list "
                                            f"{sorted(names)}")


@clause(SEAM, "L06", "an unsupported dtype or bad sizes give a LibraryError, never a crash")
def bad_calls(s: Subject) -> None:
    rt, lib = open_library(s)
    gemm = routine_of(lib, "gemm")
    p = rt.malloc(4096)
    for dtype in ("bool", "int64"):
        err = expect_library_error(lambda: gemm(p, p, p, {"m": 4, "n": 4, "k": 4, "dtype": dtype}),
                                   f"gemm in {dtype}")
        require(dtype in str(err), f"the error for a {dtype} gemm does not name the dtype: {err}")
    for bad in ({"m": 0, "n": 4, "k": 4}, {"m": 4, "n": -1, "k": 4}, {"m": 4, "n": 4, "k": 4, "batch": 0}):
        expect_library_error(lambda: gemm(p, p, p, {**bad, "dtype": "float32"}), f"gemm with sizes {bad}")
    try:
        gemm(p, p, p, {"m": 4, "n": 4, "k": 4, "dtype": "float7"})
    except FornaxError:
        pass
    else:
        raise ContractFailure("gemm in an unknown dtype 'float7': no error was raised")


def _chips(s: Subject) -> dict[str, str]:
    """chip name -> arch, from the family's own [driver.arch] table (``default`` left out)."""
    table = (s.vendor.facts.get("driver") or {}).get("arch")
    if not isinstance(table, dict) or not table:
        raise ContractFailure("this clause needs the family's chip -> arch table (vendor.toml "
                              "[driver.arch]) to reach its targets")
    return {chip: arch for chip, arch in table.items() if chip != "default"}


@clause(SEAM, "L07", "runs from a shipped image on its targets; outside its list fails with 'no kernel image'")
def shipped_images(s: Subject) -> None:
    """Every chip of the family's arch table gets one device (the subject's spec figures under the
    chip's name).  On each, GEMM must either compute the right result from an image the report
    lists as shipped, or fail with a LibraryError saying there is no kernel image for that arch.
    A family must show the failure on at least one chip, or show that an IL / virtual image serves
    an arch it has no exact image for (the driver JIT-compiles or builds it at load)."""
    rt, lib = open_library(s)
    shipped = routine_of(lib, "report")().get("shipped")
    require(isinstance(shipped, list) and shipped, f"report()['shipped'] is {shipped!r}: a library must "
            f"list the images it ships as 'format:target'")
    failed, jitted = [], []
    for chip, arch in _chips(s).items():
        spec = dataclasses.replace(s.spec, name=chip)
        drv = s.vendor.driver([Device(spec, 0)])
        target = drv.properties(0).target
        require(target == arch, f"a {chip} device reports target {target}, the family's table says {arch}")
        crt = s.vendor.runtime(drv)
        clib = s.vendor.library(crt)
        try:
            rec, out, ref, bound = run_gemm(crt, clib, np.random.default_rng(7), 20, 12, 16, 1, False, "float32")
        except LibraryError as exc:
            require("no kernel image" in str(exc) and arch in str(exc),
                    f"on {chip} ({arch}) gemm failed with {exc!r}; a missing image must say "
                    f"'no kernel image' and name the arch")
            failed.append(arch)
            continue
        check_close(f"float32 gemm on {chip} ({arch})", out, ref, bound)
        require(rec.image in shipped, f"on {chip} ({arch}) the call used image {rec.image!r}, which is not "
                f"among the shipped images {shipped}")
        if not rec.image.endswith(":" + arch):
            jitted.append(f"{arch} from {rec.image}")
    own = s.driver().properties(0).target
    require(own not in failed, f"the library has no image for the subject's own devices ({own})")
    require(failed or jitted, "every chip of the family's [driver.arch] table has an exact image, so "
            "nothing shows the 'no kernel image' failure: list a chip the library was not built for")


@clause(SEAM, "L08", "the report names every call with its routine, shape, algorithm and image")
def report_calls(s: Subject) -> None:
    rt, lib = open_library(s)
    rng = np.random.default_rng(8)
    shapes = ((5, 7, 3, 1), (16, 9, 12, 2), (3, 3, 3, 1))
    records = [run_gemm(rt, lib, rng, m, n, k, b, False, "float32")[0] for m, n, k, b in shapes]
    rep = routine_of(lib, "report")()
    require(rep.get("calls") == len(records), f"report()['calls'] is {rep.get('calls')!r} after "
            f"{len(records)} calls")
    chosen = rep.get("algorithms_chosen")
    require(isinstance(chosen, list) and len(chosen) == len(records),
            f"report()['algorithms_chosen'] has {len(chosen) if isinstance(chosen, list) else chosen!r} "
            f"entries after {len(records)} calls")
    for entry, rec in zip(chosen, records):
        for field in ("routine", "algorithm", "image", "reason"):
            require(entry.get(field) == getattr(rec, field), f"report entry {entry} does not match the "
                    f"call's record ({field} {getattr(rec, field)!r})")


#: row routines (softmax, norms): |out - ref| <= ROW_RTOL[dtype] * (|ref| + max |ref| of the row)
ROW_RTOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
ROW_ROUTINES = ("softmax_fwd", "softmax_bwd", "layer_norm_fwd", "rms_norm_fwd")


def _row_bound(ref: np.ndarray, dtype: str) -> np.ndarray:
    return ROW_RTOL[dtype] * (np.abs(ref) + np.abs(ref).max(axis=-1, keepdims=True)) + 1e-30


@clause(SEAM, "L09", "softmax (forward, backward), layer norm and RMS norm forward match float64")
def row_routines(s: Subject) -> None:
    rt, lib = open_library(s)
    wanted = [r for r in ROW_ROUTINES if protocol_requires(r) or callable(getattr(lib, r, None))]
    if not wanted:
        return                              # neither the protocol nor the library has row routines
    fns = {r: routine_of(lib, r) for r in ROW_ROUTINES}
    rng = np.random.default_rng(9)
    for dtype, (rows, cols) in (("float32", (5, 37)), ("float16", (3, 130)), ("bfloat16", (4, 64))):
        x = random_operand(rng, (rows, cols), dtype)
        x64 = x.astype(np.float64)
        params = {"rows": rows, "cols": cols, "dtype": dtype}
        px, py = to_device(rt, x), rt.malloc(x.nbytes)
        fns["softmax_fwd"](px, py, params)
        y = from_device(rt, py, (rows, cols), dtype)
        e = np.exp(x64 - x64.max(axis=1, keepdims=True))
        ref = e / e.sum(axis=1, keepdims=True)
        check_close(f"{dtype} softmax_fwd {rows}x{cols}", y, ref, _row_bound(ref, dtype))
        dy = random_operand(rng, (rows, cols), dtype)
        pdy, pdx = to_device(rt, dy), rt.malloc(x.nbytes)
        fns["softmax_bwd"](py, pdy, pdx, params)
        y64, dy64 = y.astype(np.float64), dy.astype(np.float64)
        ref = y64 * (dy64 - (dy64 * y64).sum(axis=1, keepdims=True))
        check_close(f"{dtype} softmax_bwd {rows}x{cols}", from_device(rt, pdx, (rows, cols), dtype), ref,
                    _row_bound(ref, dtype))
        gamma, beta = random_operand(rng, (cols,), dtype), random_operand(rng, (cols,), dtype)
        g64, b64 = gamma.astype(np.float64), beta.astype(np.float64)
        pg, pb = to_device(rt, gamma), to_device(rt, beta)
        pmean, prstd = rt.malloc(rows * 4), rt.malloc(rows * 4)
        fns["layer_norm_fwd"](px, pg, pb, py, pmean, prstd, {**params, "eps": 1e-5})
        mean = x64.mean(axis=1, keepdims=True)
        rstd = 1.0 / np.sqrt(((x64 - mean) ** 2).mean(axis=1, keepdims=True) + 1e-5)
        ref = (x64 - mean) * rstd * g64 + b64
        check_close(f"{dtype} layer_norm_fwd {rows}x{cols}", from_device(rt, py, (rows, cols), dtype), ref,
                    _row_bound(ref, dtype))
        check_close(f"{dtype} layer_norm_fwd saved rstd", from_device(rt, prstd, (rows,), "float32"),
                    rstd[:, 0], 1e-4 * rstd[:, 0])
        fns["rms_norm_fwd"](px, pg, py, prstd, {**params, "eps": 1e-5})
        rstd = 1.0 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + 1e-5)
        ref = x64 * rstd * g64
        check_close(f"{dtype} rms_norm_fwd {rows}x{cols}", from_device(rt, py, (rows, cols), dtype), ref,
                    _row_bound(ref, dtype))
