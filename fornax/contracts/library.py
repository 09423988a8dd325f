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

GEMM options (L10) add one float32 rounding of every epilogue term (alpha·AB,
beta·C, bias) to that bound, times 1.2 (the largest slope of relu, gelu and
silu) behind an activation.  Convolution (L11) uses the GEMM rule with ``k``
the number of terms each output sums and ``|A| @ |B|`` the same convolution of
the inputs' magnitudes.  Attention (L12) passes when ``|out - ref| <=
ATT_RTOL[dtype] * (|ref| + max |ref|)``: 2e-5 (float32), 4e-3 (float16), 3e-2
(bfloat16), which covers rounding the probabilities to the storage dtype
before the second product, as flash kernels do.  Collectives (L14) are exact:
integer-valued float32 data sum the same in every order.

Routines the :class:`~fornax.layers.library.Library` protocol names but an
implementation lacks fail with ``not implemented: library.ROUTINE``; a clause
about a routine the protocol does not name has nothing to check and passes.

The operands, device transfers, float64 references and tolerance constants the clauses
use are in :mod:`fornax.contracts.library_harness` (and importable from here).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..layers.errors import FornaxError, LibraryError
from ..sim.device import Device
from .base import ContractFailure, Subject, clause, require
from .library_harness import (ACC, ATT_RTOL, FP8, ROW_ROUTINES, ROW_RTOL, RTOL, WATCHDOG_S,
                              attention_reference, check_close, conv_cases, conv_reference,
                              expect_library_error, from_device, gemm_bound, gemm_listed_dtypes,
                              gemm_sweep, host_wait, norm_bwd_reference, np_dtype, open_library,
                              pool_reference, protocol_requires, random_operand, routine_of,
                              row_bound, run_gemm, run_gemm_opts, tensor_bound, to_device,
                              upload_ranks)

SEAM = "library"

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
        check_close(f"{dtype} softmax_fwd {rows}x{cols}", y, ref, row_bound(ref, dtype))
        dy = random_operand(rng, (rows, cols), dtype)
        pdy, pdx = to_device(rt, dy), rt.malloc(x.nbytes)
        fns["softmax_bwd"](py, pdy, pdx, params)
        y64, dy64 = y.astype(np.float64), dy.astype(np.float64)
        ref = y64 * (dy64 - (dy64 * y64).sum(axis=1, keepdims=True))
        check_close(f"{dtype} softmax_bwd {rows}x{cols}", from_device(rt, pdx, (rows, cols), dtype), ref,
                    row_bound(ref, dtype))
        gamma, beta = random_operand(rng, (cols,), dtype), random_operand(rng, (cols,), dtype)
        g64, b64 = gamma.astype(np.float64), beta.astype(np.float64)
        pg, pb = to_device(rt, gamma), to_device(rt, beta)
        pmean, prstd = rt.malloc(rows * 4), rt.malloc(rows * 4)
        fns["layer_norm_fwd"](px, pg, pb, py, pmean, prstd, {**params, "eps": 1e-5})
        mean = x64.mean(axis=1, keepdims=True)
        rstd = 1.0 / np.sqrt(((x64 - mean) ** 2).mean(axis=1, keepdims=True) + 1e-5)
        ref = (x64 - mean) * rstd * g64 + b64
        check_close(f"{dtype} layer_norm_fwd {rows}x{cols}", from_device(rt, py, (rows, cols), dtype), ref,
                    row_bound(ref, dtype))
        check_close(f"{dtype} layer_norm_fwd saved rstd", from_device(rt, prstd, (rows,), "float32"),
                    rstd[:, 0], 1e-4 * rstd[:, 0])
        fns["rms_norm_fwd"](px, pg, py, prstd, {**params, "eps": 1e-5})
        rstd = 1.0 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + 1e-5)
        ref = x64 * rstd * g64
        check_close(f"{dtype} rms_norm_fwd {rows}x{cols}", from_device(rt, py, (rows, cols), dtype), ref,
                    row_bound(ref, dtype))


@clause(SEAM, "L10", "GEMM options: transposes, strided batch, alpha/beta, bias + activation "
                     "epilogues, fp8 with scales, deterministic mode")
def gemm_options(s: Subject) -> None:
    rt, lib = open_library(s)
    gemm = routine_of(lib, "gemm")
    rng = np.random.default_rng(10)
    cases: list[dict[str, Any]] = [
        dict(m=19, n=23, k=40, trans_a=True),
        dict(m=17, n=9, k=33, trans_b=True),
        dict(m=12, n=20, k=28, trans_a=True, trans_b=True, batch=3, pad=5),
        dict(m=21, n=14, k=37, batch=2, pad=3, alpha=0.75, beta=-1.5),
        dict(m=16, n=24, k=30, bias=True, act="relu"),
        dict(m=15, n=18, k=26, bias=True, act="gelu", alpha=0.5, beta=0.25),
        dict(m=13, n=22, k=35, bias=True, act="silu", batch=2),
        dict(m=24, n=17, k=96, dtype="float16", trans_b=True, beta=1.0, bias=True, act="gelu"),
        dict(m=11, n=19, k=80, dtype="bfloat16", trans_a=True, batch=2, pad=1, alpha=2.0, beta=0.5),
    ]
    for case in cases:
        _, got, ref, bound, label = run_gemm_opts(rt, lib, rng, **case)
        check_close(label, got, ref, bound)
    listed = gemm_listed_dtypes(s, lib)
    for dtype in FP8:
        if dtype in listed:
            for scales, out in (((0.5, 3.0), None), ((0.25, 1.5), "float32")):
                _, got, ref, bound, label = run_gemm_opts(
                    rt, lib, rng, 20, 12, 64, dtype, batch=2, trans_b=True, scales=scales, out=out)
                check_close(f"{label} scales={scales}", got, ref, bound)
        else:
            p = rt.malloc(4096)
            exc = expect_library_error(
                lambda d=dtype: gemm(p, p, p, {"m": 4, "n": 4, "k": 4, "dtype": d}),
                f"gemm in {dtype}, which the family does not list")
            require(dtype in str(exc), f"gemm in unlisted {dtype} raised {exc!r}, which does not "
                    f"name the dtype")
    # deterministic mode: a split-K algorithm (when the library lists one) reduces its slices in
    # a fixed order, so two calls give the same bits
    algos = routine_of(lib, "report")().get("algorithms") or []
    split = [a for a in algos if isinstance(a, dict) and int(a.get("split_k", 1)) > 1]
    m, n, k = 16, 16, 512
    a = random_operand(rng, (m, k), "float32")
    b = random_operand(rng, (k, n), "float32")
    pa, pb = to_device(rt, a), to_device(rt, b)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    bound = gemm_bound(a.astype(np.float64), b.astype(np.float64), ref, k, "float32")
    for forced in ([None] + [x["name"] for x in split])[:3]:
        outs = []
        for _ in range(2):
            pc = rt.malloc(m * n * 4)
            params = {"m": m, "n": n, "k": k, "dtype": "float32", "deterministic": True}
            if forced:
                params["algorithm"] = forced
            gemm(pa, pb, pc, params)
            outs.append(from_device(rt, pc, (m, n), "float32"))
        what = f"deterministic float32 gemm m={m} n={n} k={k} algorithm={forced or 'heuristic'}"
        check_close(what, outs[0], ref, bound)
        require(np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)),
                f"{what}: two calls on the same inputs gave different bits "
                f"({int((outs[0] != outs[1]).sum())} of {m * n} elements differ)")


@clause(SEAM, "L11", "conv2d forward, backward-data and backward-weights (stride, padding, "
                     "dilation, groups) match a float64 direct convolution")
def conv2d(s: Subject) -> None:
    rt, lib = open_library(s)
    fns = {name: routine_of(lib, name) for name in ("conv2d_fwd", "conv2d_bwd_data", "conv2d_bwd_weights")}
    rng = np.random.default_rng(111)
    cases = [(g, "float32") for g in conv_cases(11, 4)] + [(g, d) for g, d in
                                                           zip(conv_cases(12, 2), ("float16", "bfloat16"))]
    for g, dtype in cases:
        n, c, h, w, k, R, S, G = (g[key] for key in ("n", "c", "h", "w", "k", "r", "s", "groups"))
        x = random_operand(rng, (n, c, h, w), dtype)
        wt = random_operand(rng, (k, c // G, R, S), dtype)
        dy = random_operand(rng, (n, k, g["P"], g["Q"]), dtype)
        params = {key: g[key] for key in ("n", "c", "h", "w", "k", "r", "s", "groups", "stride",
                                          "padding", "dilation")} | {"dtype": dtype}
        px, pw, pdy = to_device(rt, x), to_device(rt, wt), to_device(rt, dy)
        runs = (("conv2d_fwd", "fwd", (px, pw), (x, wt), dy.shape, (c // G) * R * S),
                ("conv2d_bwd_data", "bwd_data", (pdy, pw), (dy, wt), x.shape, (k // G) * R * S),
                ("conv2d_bwd_weights", "bwd_weights", (px, pdy), (x, dy), wt.shape, n * g["P"] * g["Q"]))
        for routine, pass_, ptrs, hosts, shape, terms in runs:
            pout = rt.malloc(int(np.prod(shape)) * np_dtype(dtype).itemsize)
            fns[routine](*ptrs, pout, params)
            got = from_device(rt, pout, shape, dtype)
            a64, b64 = (h_.astype(np.float64) for h_ in hosts)
            ref = conv_reference(pass_, a64, b64, g)
            mag = conv_reference(pass_, np.abs(a64), np.abs(b64), g)
            bound = RTOL[dtype] * np.abs(ref) + ACC * terms * mag + 1e-30
            geo = (f"n={n} c={c} h={h} w={w} k={k} r={R} s={S} stride={g['stride']} "
                   f"padding={g['padding']} dilation={g['dilation']} groups={G}")
            check_close(f"{dtype} {routine} {geo}", got, ref, bound)


@clause(SEAM, "L12", "attention forward and backward (head dims 64 and 128, causal or not, "
                     "several K/V tiles), layer norm and RMS norm backward match float64")
def attention_and_norm_backward(s: Subject) -> None:
    rt, lib = open_library(s)
    fwd, bwd = routine_of(lib, "attention_fwd"), routine_of(lib, "attention_bwd")
    norm = {r: routine_of(lib, r) for r in ("layer_norm_fwd", "layer_norm_bwd", "rms_norm_fwd",
                                             "rms_norm_bwd")}
    rng = np.random.default_rng(12)
    cases = [("float32", 1, 2, 40, 70, 64, False), ("float32", 1, 2, 40, 70, 64, True),
             ("float32", 2, 1, 33, 72, 128, False), ("float32", 1, 1, 70, 70, 128, True),
             ("bfloat16", 1, 2, 24, 66, 64, True), ("float16", 1, 1, 17, 65, 128, False)]
    for dtype, b, h, sq, sk, d, causal in cases:
        q, k, v = (random_operand(rng, (b, h, n_, d), dtype) for n_ in (sq, sk, sk))
        do = random_operand(rng, (b, h, sq, d), dtype)
        params = {"batch": b, "heads": h, "seq_q": sq, "seq_k": sk, "head_dim": d, "causal": causal,
                  "dtype": dtype}
        pq, pk, pv, pdo = (to_device(rt, t) for t in (q, k, v, do))
        po, plse = rt.malloc(q.nbytes), rt.malloc(b * h * sq * 4)
        pdq, pdk, pdv = rt.malloc(q.nbytes), rt.malloc(k.nbytes), rt.malloc(v.nbytes)
        fwd(pq, pk, pv, po, plse, params)
        bwd(pq, pk, pv, po, pdo, plse, pdq, pdk, pdv, params)
        q64, k64, v64, do64 = (t.astype(np.float64) for t in (q, k, v, do))
        refs = attention_reference(q64, k64, v64, do64, 1.0 / np.sqrt(d), causal)
        what = f"{dtype} attention b={b} h={h} seq_q={sq} seq_k={sk} head_dim={d} causal={causal}"
        for name, ptr, shape, dt, ref in (("o", po, q.shape, dtype, refs[0]),
                                          ("lse", plse, (b, h, sq), "float32", refs[1]),
                                          ("dq", pdq, q.shape, dtype, refs[2]),
                                          ("dk", pdk, k.shape, dtype, refs[3]),
                                          ("dv", pdv, v.shape, dtype, refs[4])):
            bound = (1e-4 * np.maximum(1.0, np.abs(ref)) if name == "lse"
                     else tensor_bound(ref, ATT_RTOL[dtype]))
            check_close(f"{what}: {name}", from_device(rt, ptr, shape, dt), ref, bound)
    for dtype, (rows, cols) in (("float32", (5, 37)), ("bfloat16", (4, 64)), ("float16", (3, 130))):
        x = random_operand(rng, (rows, cols), dtype)
        gamma, beta = random_operand(rng, (cols,), dtype), random_operand(rng, (cols,), dtype)
        dy = random_operand(rng, (rows, cols), dtype)
        params = {"rows": rows, "cols": cols, "dtype": dtype, "eps": 1e-5}
        px, pg, pb, pdy = (to_device(rt, t) for t in (x, gamma, beta, dy))
        py, pmean, prstd = rt.malloc(x.nbytes), rt.malloc(rows * 4), rt.malloc(rows * 4)
        pdx, pdg, pdb = rt.malloc(x.nbytes), rt.malloc(gamma.nbytes), rt.malloc(gamma.nbytes)
        x64, g64, dy64 = x.astype(np.float64), gamma.astype(np.float64), dy.astype(np.float64)
        for kind in ("layer", "rms"):
            if kind == "layer":
                norm["layer_norm_fwd"](px, pg, pb, py, pmean, prstd, params)
                norm["layer_norm_bwd"](pdy, px, pg, pmean, prstd, pdx, pdg, pdb, params)
            else:
                norm["rms_norm_fwd"](px, pg, py, prstd, params)
                norm["rms_norm_bwd"](pdy, px, pg, prstd, pdx, pdg, params)
            dx, dgamma, dbeta, natural, dg_mag = norm_bwd_reference(kind, x64, g64, dy64)
            rtol = ROW_RTOL[dtype]
            what = f"{dtype} {kind}_norm_bwd {rows}x{cols}"
            check_close(f"{what}: dx", from_device(rt, pdx, (rows, cols), dtype), dx,
                        rtol * (np.abs(dx) + natural) + 1e-30)
            check_close(f"{what}: dgamma", from_device(rt, pdg, (cols,), dtype), dgamma,
                        rtol * (np.abs(dgamma) + dg_mag) + 1e-30)
            if kind == "layer":
                check_close(f"{what}: dbeta", from_device(rt, pdb, (cols,), dtype), dbeta,
                            rtol * (np.abs(dbeta) + np.abs(dy64).sum(axis=0)) + 1e-30)


@clause(SEAM, "L13", "max and average pooling forward (and backward) match float64")
def pooling(s: Subject) -> None:
    rt, lib = open_library(s)
    fwd = routine_of(lib, "pool2d_fwd")
    backward = protocol_requires("pool2d_bwd") or callable(getattr(lib, "pool2d_bwd", None))
    bwd = routine_of(lib, "pool2d_bwd") if backward else None
    rng = np.random.default_rng(13)
    cases = [((2, 3, 7, 6), (3, 2), (2, 2), (1, 1)), ((1, 2, 8, 9), (2, 2), (2, 2), (0, 0)),
             ((1, 1, 5, 7), (3, 3), (1, 2), (1, 0))]
    for mode in ("max", "avg"):
        # max pooling in float32: random values with no ties, so the argmax is unique
        dtypes = ("float32", "float32", "bfloat16" if mode == "avg" else "float32")
        for dtype, (shape, kernel, stride, padding) in zip(dtypes, cases):
            x = random_operand(rng, shape, dtype)
            x64 = x.astype(np.float64)
            y_ref, idx_ref, _ = pool_reference(x64, None, mode, kernel, stride, padding)
            dy = random_operand(rng, y_ref.shape, dtype)
            _, _, dx_ref = pool_reference(x64, dy.astype(np.float64), mode, kernel, stride, padding)
            n, c, h, w = shape
            params = {"n": n, "c": c, "h": h, "w": w, "kernel": kernel, "stride": stride,
                      "padding": padding, "mode": mode, "dtype": dtype}
            px, py = to_device(rt, x), rt.malloc(y_ref.size * x.itemsize)
            pidx = rt.malloc(y_ref.size * 8) if mode == "max" else None
            fwd(px, py, params, indices=pidx)
            what = f"{dtype} {mode} pool2d {shape} kernel={kernel} stride={stride} padding={padding}"
            check_close(f"{what}: y", from_device(rt, py, y_ref.shape, dtype), y_ref,
                        RTOL[dtype] * (np.abs(y_ref) + np.abs(x64).max()) + 1e-30)
            if mode == "max" and pidx is not None:
                got = from_device(rt, pidx, y_ref.shape, np.int64)
                if not np.array_equal(got, idx_ref):
                    at = tuple(int(i) for i in np.argwhere(got != idx_ref)[0])
                    raise ContractFailure(f"{what}: argmax index at {at} is {got[at]}, expected "
                                          f"{idx_ref[at]} (h*W + w of the window's largest input)")
            if bwd is not None:
                pdy, pdx = to_device(rt, dy), rt.malloc(x.nbytes)
                bwd(pdy, pdx, params, indices=pidx)
                check_close(f"{what}: dx", from_device(rt, pdx, shape, dtype), dx_ref,
                            RTOL[dtype] * (np.abs(dx_ref) + np.abs(dy.astype(np.float64)).max())
                            + 1e-30)


@clause(SEAM, "L14", "collectives over the devices give numpy's results exactly; a rank that "
                     "skips a collective is diagnosed by the watchdog with a code, not a hang")
def collectives(s: Subject) -> None:
    _, lib = open_library(s)
    routine_of(lib, "communicator")
    comm = s.communicator(lib)
    n = len(s.devices)
    require(getattr(comm, "size", None) == n, f"a communicator over {n} devices has size "
            f"{getattr(comm, 'size', None)!r}")
    rng = np.random.default_rng(14)

    def ints(count):                   # integer-valued floats: every order of summation is exact
        return [rng.integers(-1000, 1000, count).astype(np.float32) for _ in range(n)]

    def put(arrays):
        return upload_ranks(comm, arrays)

    def empty(count):
        return [comm.malloc(r, count * 4) for r in range(n)]

    def expect(what, ptrs, count, want):
        for r, p in enumerate(ptrs):
            got = comm.download(r, p, count, "float32")
            w = want[r] if isinstance(want, list) else want
            if not np.array_equal(got, w):
                i = int(np.argmax(got != w)) if got.shape == w.shape else 0
                raise ContractFailure(f"{what} over {n} ranks: rank {r} got "
                                      f"{got[i] if got.size else 'nothing'} at element {i}, numpy "
                                      f"says {w[i] if w.size else 'nothing'}")

    count = 301                                      # odd: uneven chunks per rank
    xs = ints(count)
    send = put(xs)
    stack = np.stack(xs).astype(np.float64)
    for op, want in (("sum", stack.sum(0)), ("max", stack.max(0))):
        recv = empty(count)
        for r in range(n):
            comm.rank(r).all_reduce(send[r], recv[r], count, "float32", op)
        expect(f"all_reduce {op}", recv, count, want.astype(np.float32))
    big = empty(n * count)
    for r in range(n):
        comm.rank(r).all_gather(send[r], big[r], count)
    expect("all_gather", big, n * count, np.concatenate(xs))
    per = 150
    full = ints(n * per)
    fsend = put(full)
    part = empty(per)
    for r in range(n):
        comm.rank(r).reduce_scatter(fsend[r], part[r], per, "float32", "sum")
    total = np.stack(full).astype(np.float64).sum(0).astype(np.float32)
    expect("reduce_scatter sum", part, per, [total[r * per:(r + 1) * per] for r in range(n)])
    root = n - 1
    bc = empty(count)
    for r in range(n):
        comm.rank(r).broadcast(send[r], bc[r], count, "float32", root=root)
    expect(f"broadcast from rank {root}", bc, count, xs[root])
    a2a = empty(n * per)
    for r in range(n):
        comm.rank(r).all_to_all(fsend[r], a2a[r], per)
    expect("all_to_all", a2a, n * per,
           [np.concatenate([full[j][r * per:(r + 1) * per] for j in range(n)]) for r in range(n)])
    if n > 1:
        for src, dst in ((0, n - 1), (n - 1, 0)):
            buf = comm.malloc(dst, count * 4)
            comm.rank(src).send(send[src], count, "float32", peer=dst)
            comm.rank(dst).recv(buf, count, "float32", peer=src)
            got = comm.download(dst, buf, count, "float32")
            require(np.array_equal(got, xs[src]), f"send from rank {src} / recv on rank {dst}: "
                    f"the received data differ from what was sent")
    comm.synchronize()
    if n < 2:
        return
    # rank n-1 skips an all-reduce the others make: the watchdog diagnoses it
    comm = s.communicator(lib, WATCHDOG_S)
    send = put(ints(64))
    works = [comm.rank(r).all_reduce(send[r], send[r], 64, "float32", "sum") for r in range(n - 1)]
    skipper = n - 1
    exc = host_wait(works[0].wait, f"rank {skipper} skipped an all_reduce and rank 0 waited")
    if exc is None:
        raise ContractFailure(f"rank {skipper} never called all_reduce, yet rank 0's wait returned "
                              "without an error")
    if not isinstance(exc, FornaxError):
        raise ContractFailure(f"rank {skipper} skipped an all_reduce: the wait crashed with "
                              f"{type(exc).__name__}: {exc}")
    require(exc.code is not None, f"the watchdog's error carries no vendor code: {exc}")
    text = str(exc)
    require(f"rank {skipper}" in text and "rank 0" in text.replace("ranks 0", "rank 0"),
            f"the watchdog's diagnosis must name the waiting rank 0 and the rank {skipper} that "
            f"skipped the call: {text}")


@clause(SEAM, "L15", "2:4 structured-sparse GEMM: where the family ships it, prune keeps the two "
                     "largest of every four, compress writes the documented format, the matmul "
                     "matches float64 of the pruned matrix and a matrix that is not 2:4 is refused "
                     "with a code; where it does not, every call is refused with a code and a hint")
def sparse_gemm(s: Subject) -> None:
    rt, lib = open_library(s)
    info = routine_of(lib, "sparse_info")()
    if not info.get("supported"):
        for call, run in (("sparse_compressed_size", lambda: lib.sparse_compressed_size(
                              {"m": 32, "k": 32, "dtype": "bfloat16"})),
                          ("sparse_matmul", lambda: lib.sparse_matmul(
                              0, 0, 0, {"m": 32, "n": 32, "k": 32, "dtype": "bfloat16"}))):
            try:
                run()
            except FornaxError as exc:
                require(exc.code is not None and bool(exc.hint), f"{info.get('name')} has no 2:4 "
                        f"GEMM: {call} must say so with the family's code and a hint, got: {exc}")
            else:
                raise ContractFailure(f"{info.get('name')} says it has no 2:4 GEMM, yet {call} "
                                      "returned without an error")
        return
    from ..sim import sparsity
    dtype, align = str(info["dtypes"][0]), int(info["alignment"])
    m, n, k = 2 * align, align, 5 * align             # k: not a whole number of metadata words
    rng = np.random.default_rng(15)
    w = random_operand(rng, (m, k), dtype)
    pw = to_device(rt, w)
    p = {"m": m, "k": k, "dtype": dtype}
    require(not lib.sparse_prune_check(pw, p), "a dense random matrix passed the 2:4 check")
    try:
        lib.sparse_compress(pw, pw, p)
    except FornaxError as exc:
        require(exc.code is not None, f"compress of a matrix that is not 2:4 raised no code: {exc}")
    else:
        raise ContractFailure("compress of a matrix that is not 2:4 returned without an error")
    lib.sparse_prune(pw, pw, p)
    pruned = from_device(rt, pw, (m, k), dtype)
    want = np.where(sparsity.prune_mask(w), w, np.zeros((), w.dtype))
    require(np.array_equal(pruned.astype(np.float64), want.astype(np.float64)),
            "prune did not keep exactly the two largest magnitudes of every four along K")
    require(lib.sparse_prune_check(pw, p), "the pruned matrix failed the 2:4 check")
    size, _ = lib.sparse_compressed_size(p)
    values, words = sparsity.compress(pruned)
    require(size >= values.nbytes + words.nbytes, f"compressed size {size} is below the format's "
            f"{values.nbytes + words.nbytes} bytes")
    pc = rt.malloc(size)
    lib.sparse_compress(pw, pc, p)
    b = random_operand(rng, (k, n), dtype)
    pb, pout = to_device(rt, b), rt.malloc(m * n * 4)
    lib.sparse_matmul(pc, pb, pout, {"m": m, "n": n, "k": k, "dtype": dtype, "out_dtype": "float32"})
    out = from_device(rt, pout, (m, n), "float32")
    a64, b64 = pruned.astype(np.float64), b.astype(np.float64)
    ref = a64 @ b64
    check_close(f"2:4 {dtype} sparse_matmul {m}x{n}x{k}", out, ref,
                gemm_bound(a64, b64, ref, k, "float32"))
