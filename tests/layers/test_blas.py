"""BLAS-like GEMM in the library seam: every variant against a numpy float64 reference.

Tolerances (documented in docs/seams/library.md): the kernel accumulates in
float32 and rounds once to the output dtype, so for each output

    |out - ref| <= eps_out * |ref| + (k + 8) * 2**-24 * (|alpha| |A||B| + |beta| |C| + |bias|)

times 1.2 after an activation (relu, silu and tanh-GELU change a difference
by at most that factor); ``eps_out`` is the output dtype's unit roundoff
(2**-24 fp32, 2**-11 fp16, 2**-8 bf16).  fp8 and TF32 inputs are quantised
first and the reference uses the quantised values, so the bound is the same.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fornax.layers import blas, codegen
from fornax.layers.errors import LibraryError
from fornax.layers.graph import DType, Graph
from fornax.sim.cost import gemm_counters, kernel_cost
from fornax.stack import compose, make_config
from helpers import FAMILIES

VENDORS = FAMILIES
EPS = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float64": 2.0 ** -53}
NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
      "float64": np.float64, "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
      "float8_e5m2": ml_dtypes.float8_e5m2}
_STACKS: dict = {}


def stack(vendor: str, spec: str = "tiny", meta: bool = False):
    key = (vendor, spec, meta)
    if key not in _STACKS:
        _STACKS[key] = compose(make_config(vendor, spec=spec, meta=meta))
    return _STACKS[key]


def act64(x: np.ndarray, act: str) -> np.ndarray:
    if act == "relu":
        return np.maximum(x, 0)
    if act == "gelu":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    if act == "silu":
        return x / (1 + np.exp(-x))
    return x


def tf32_round(x: np.ndarray) -> np.ndarray:
    """float32 -> TF32 by arithmetic (nearest, ties away from zero on the 10-bit mantissa)."""
    x = x.astype(np.float64)
    mant, exp = np.frexp(x)                      # x = mant * 2**exp, 0.5 <= |mant| < 1
    q = np.sign(mant) * np.floor(np.abs(mant) * 2 ** 11 + 0.5) / 2 ** 11
    return (q * 2.0 ** exp).astype(np.float32)


def run(lib, rt, a, b, c0, params, bias=None):
    """Copy operands in, call gemm, read C back."""
    ptrs = [rt.malloc(max(x.nbytes, 4)) for x in (a, b, c0)]
    for p, x in zip(ptrs, (a, b, c0)):
        rt.memcpy_h2d(p, np.ascontiguousarray(x))
    if bias is not None:
        pbias = rt.malloc(bias.nbytes)
        rt.memcpy_h2d(pbias, bias)
        params = {**params, "bias": pbias}
    rec = lib.gemm(ptrs[0], ptrs[1], ptrs[2], params)
    out = np.empty_like(c0)
    rt.memcpy_d2h(out, ptrs[2])
    for p in ptrs:
        rt.free(p)
    if bias is not None:
        rt.free(pbias)
    return rec, out


def reference(a64, b64, c64, m, n, k, batch, ta, tb, sa, sb, sc, alpha, beta, bias64, act):
    """Float64 result from the flat buffers, read with the same strides."""
    out = c64.copy()
    mags = np.zeros_like(c64)
    for i in range(batch):
        A = a64[i * sa:i * sa + m * k].reshape((k, m) if ta else (m, k))
        B = b64[i * sb:i * sb + k * n].reshape((n, k) if tb else (k, n))
        A, B = (A.T if ta else A), (B.T if tb else B)
        C = c64[i * sc:i * sc + m * n].reshape(m, n)
        pre = alpha * (A @ B) + beta * C + (bias64 if bias64 is not None else 0)
        mags[i * sc:i * sc + m * n] = (abs(alpha) * (np.abs(A) @ np.abs(B)) + abs(beta) * np.abs(C)
                                       + (np.abs(bias64) if bias64 is not None else 0)).ravel()
        out[i * sc:i * sc + m * n] = act64(pre, act).ravel()
    return out, mags


def check(out, ref, mags, k, out_dtype, act, what):
    bound = EPS[out_dtype] * np.abs(ref) + (k + 8) * 2.0 ** -24 * mags + 1e-30
    if act != "none":
        bound = bound * 1.2 + EPS[out_dtype] * 1e-3
    err = np.abs(out.astype(np.float64) - ref)
    worst = np.argmax(err - bound)
    assert np.all(err <= bound), (f"{what}: error {err.flat[worst]:.3e} > bound "
                                  f"{bound.flat[worst]:.3e} at {worst}")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vendor=st.sampled_from(VENDORS), m=st.integers(1, 40), n=st.integers(1, 40),
       k=st.integers(1, 70), batch=st.integers(1, 3), ta=st.booleans(), tb=st.booleans(),
       b_mode=st.sampled_from(["shared", "packed", "padded"]),
       alpha=st.sampled_from([1.0, 0.5, -2.0]), beta=st.sampled_from([0.0, 1.0, -0.75]),
       act=st.sampled_from(blas.ACTIVATIONS), with_bias=st.booleans(),
       dtypes=st.sampled_from([("float32", "float32"), ("float16", "float16"),
                               ("bfloat16", "bfloat16"), ("bfloat16", "float32"),
                               ("float16", "float32")]),
       split=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_gemm_variants_match_float64(vendor, m, n, k, batch, ta, tb, b_mode, alpha, beta, act,
                                     with_bias, dtypes, split, seed):
    st_ = stack(vendor)
    rt, lib = st_.runtime, st_.library
    dtype, out_dtype = dtypes
    rng = np.random.default_rng(seed)
    sa = m * k + 3                                    # strided: a gap between batches of A
    sb = {"shared": 0, "packed": k * n, "padded": k * n + 5}[b_mode] if batch > 1 else k * n
    sc = m * n + (2 if batch > 1 else 0)
    a = rng.standard_normal(sa * batch).astype(NP[dtype])
    b = rng.standard_normal(max(sb * (batch - 1), 0) + k * n).astype(NP[dtype])
    c0 = rng.standard_normal(sc * batch).astype(NP[out_dtype])
    bias = rng.standard_normal(n).astype(NP[out_dtype]) if with_bias else None
    params = {"m": m, "n": n, "k": k, "batch": batch, "dtype": dtype, "out_dtype": out_dtype,
              "trans_a": ta, "trans_b": tb, "stride_a": sa, "stride_b": sb, "stride_c": sc,
              "alpha": alpha, "beta": beta, "activation": act}
    if split:
        params["algorithm"] = next(a.name for a in lib.algorithms if a.split_k > 1)
    rec, out = run(lib, rt, a, b, c0, params, bias)
    f = lambda x: None if x is None else x.astype(np.float64)
    ref, mags = reference(f(a), f(b), f(c0), m, n, k, batch, ta, tb, sa, sb, sc, alpha, beta,
                          f(bias), act)
    for i in range(batch):                       # the gaps between C's batches are untouched
        gap = slice(i * sc + m * n, (i + 1) * sc)
        assert np.array_equal(out[gap], c0[gap])
        ref[gap] = c0[gap].astype(np.float64)
    check(out, ref, mags, k, out_dtype, act, f"{vendor} {params}")
    assert rec.options["trans"] == ("T" if ta else "N") + ("T" if tb else "N")
    assert (rec.workspace > 0) == split


@pytest.mark.parametrize("vendor", ["cuda-like", "rocm-like"])
@pytest.mark.parametrize("fp8", blas.FP8)
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16", "float32"])
def test_fp8_gemm_with_scales(vendor, fp8, out_dtype):
    st_ = stack(vendor)
    rt, lib = st_.runtime, st_.library
    rng = np.random.default_rng(5)
    m, n, k = 24, 17, 96
    x, w = rng.standard_normal((m, k)) * 30, rng.standard_normal((k, n)) * 0.01
    a_scale, b_scale = float(np.abs(x).max() / 240), float(np.abs(w).max() / 240)
    a8, b8 = (x / a_scale).astype(NP[fp8]), (w / b_scale).astype(NP[fp8])
    c0 = np.zeros((m, n), NP[out_dtype])
    bias = rng.standard_normal(n).astype(NP[out_dtype])
    rec, out = run(lib, rt, a8, b8, c0, {"m": m, "n": n, "k": k, "dtype": fp8, "out_dtype": out_dtype,
                                         "a_scale": a_scale, "b_scale": b_scale,
                                         "activation": "gelu"}, bias)
    A, B = a8.astype(np.float64), b8.astype(np.float64)
    pre = a_scale * b_scale * (A @ B) + bias.astype(np.float64)
    ref = act64(pre, "gelu")
    mags = a_scale * b_scale * (np.abs(A) @ np.abs(B)) + np.abs(bias.astype(np.float64))
    check(out, ref, mags, k, out_dtype, "gelu", f"{vendor} {fp8} -> {out_dtype}")
    # and the scaled result really approximates the unquantised product (fp8 is coarse)
    assert np.abs(out.astype(np.float64) - act64(x @ w + bias.astype(np.float64), "gelu")).max() \
        < 0.15 * np.abs(x @ w).max()
    assert rec.options["dtype"] == fp8


def test_fp8_is_not_offered_where_the_hardware_has_none():
    st_ = stack("xpu-like")
    p = st_.runtime.malloc(4096)
    with pytest.raises(LibraryError, match="float8_e4m3fn"):
        st_.library.gemm(p, p, p, {"m": 4, "n": 4, "k": 4, "dtype": "float8_e4m3fn"})


@pytest.mark.parametrize("vendor", VENDORS)
def test_tf32_mode_rounds_inputs_before_the_multiply(vendor):
    st_ = stack(vendor)
    rt, lib = st_.runtime, st_.library
    rng = np.random.default_rng(9)
    m, n, k = 20, 24, 64
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c0 = np.zeros((m, n), np.float32)
    rec, out = run(lib, rt, a, b, c0, {"m": m, "n": n, "k": k, "dtype": "float32", "tf32": True})
    ref = tf32_round(a).astype(np.float64) @ tf32_round(b).astype(np.float64)
    mags = np.abs(tf32_round(a)).astype(np.float64) @ np.abs(tf32_round(b)).astype(np.float64)
    check(out, ref, mags, k, "float32", "none", f"{vendor} tf32")
    full = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(out - full).max() > 1e3 * np.abs(ref - full).min() + 1e-4   # really rounded
    assert rec.options["compute"] == lib.tf32_mode
    _, plain = run(lib, rt, a, b, c0, {"m": m, "n": n, "k": k, "dtype": "float32"})
    check(plain, full, np.abs(a).astype(np.float64) @ np.abs(b), k, "float32", "none", "fp32")


def test_tf32_executes_on_the_tf32_matrix_path_and_is_priced_there():
    st_ = stack("cuda-like")
    rt, lib = st_.runtime, st_.library
    a = np.ones((32, 32), np.float32)
    run(lib, rt, a, a, np.zeros((32, 32), np.float32), {"m": 32, "n": 32, "k": 32,
                                                        "dtype": "float32", "tf32": True})
    prog = lib._programs(lib._problem({"m": 32, "n": 32, "k": 32, "dtype": "float32", "tf32": True})
                         .variant(lib.choose(32, 32, 1, 32, "float32")[0]))[0]
    assert prog.meta["estimate"]["dtype"] == "tfloat32"
    assert any(getattr(i, "fn", None) == "tf32" for i in prog.instructions())


def test_tf32_refused_without_a_mode_or_on_other_dtypes():
    st_ = stack("cuda-like")
    lib, p = st_.library, st_.runtime.malloc(4096)
    with pytest.raises(LibraryError, match="tf32 applies to float32"):
        lib.gemm(p, p, p, {"m": 4, "n": 4, "k": 4, "dtype": "bfloat16", "tf32": True})
    mode, lib.tf32_mode = lib.tf32_mode, None
    try:
        with pytest.raises(LibraryError, match="no TF32 mode"):
            lib.gemm(p, p, p, {"m": 4, "n": 4, "k": 4, "dtype": "float32", "tf32": True})
    finally:
        lib.tf32_mode = mode


@pytest.mark.parametrize("vendor", VENDORS)
def test_split_k_deterministic_is_bit_stable_and_fast_is_not(vendor):
    st_ = stack(vendor)
    rt, lib = st_.runtime, st_.library
    rng = np.random.default_rng(1)
    m, n, k = 30, 30, 512
    a = (rng.standard_normal((m, k)) * 10).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c0 = np.zeros((m, n), np.float32)
    algo = next(x.name for x in lib.algorithms if x.split_k > 1)
    params = {"m": m, "n": n, "k": k, "dtype": "float32", "algorithm": algo}
    ref = a.astype(np.float64) @ b.astype(np.float64)
    mags = np.abs(a).astype(np.float64) @ np.abs(b)
    det = [run(lib, rt, a, b, c0, {**params, "deterministic": True})[1] for _ in range(3)]
    for out in det:
        assert out.tobytes() == det[0].tobytes()
        check(out, ref, mags, k, "float32", "none", "deterministic")
    fast = [run(lib, rt, a, b, c0, {**params, "deterministic": False})[1] for _ in range(8)]
    for out in fast:
        check(out, ref, mags, k, "float32", "none", "fast")
    assert len({out.tobytes() for out in fast}) >= 2, "fast split-K never changed its order"


@pytest.mark.parametrize("vendor", VENDORS)
def test_split_k_workspace_is_allocated_and_released(vendor):
    st_ = stack(vendor)
    rt, lib = st_.runtime, st_.library
    algo = next(x for x in lib.algorithms if x.split_k > 1)
    m, n, k, batch = 16, 24, 256, 2
    a = np.ones((batch, m, k), np.float32)
    b = np.ones((k, n), np.float32)
    ptrs = [rt.malloc(x.nbytes) for x in (a, b, np.zeros((batch, m, n), np.float32))]
    rt.memcpy_h2d(ptrs[0], a)
    rt.memcpy_h2d(ptrs[1], b)
    stats = rt.memory_stats()
    allocated, peak0 = stats["allocated_bytes"], stats["peak_allocated_bytes"]
    rec = lib.gemm(*ptrs, {"m": m, "n": n, "k": k, "batch": batch, "dtype": "float32",
                           "algorithm": algo.name})
    expected = blas.order_bytes(algo.split_k) + algo.split_k * batch * m * n * 4
    assert rec.workspace == expected
    after = rt.memory_stats()
    assert after["allocated_bytes"] == allocated                       # released
    assert after["peak_allocated_bytes"] >= max(peak0, allocated + expected)   # it was there
    out = np.empty((batch, m, n), np.float32)
    rt.memcpy_d2h(out, ptrs[2])
    assert np.all(out == k)
    assert lib.report()["algorithms_chosen"][-1]["workspace"] == expected
    # a workspace limit below the need rules the algorithm out
    with pytest.raises(LibraryError, match="workspace"):
        lib.gemm(*ptrs, {"m": m, "n": n, "k": k, "batch": batch, "dtype": "float32",
                         "algorithm": algo.name, "workspace_limit": expected - 1})
    for p in ptrs:
        rt.free(p)


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("shape", [(4096, 4096, 4096, 1, "bfloat16"), (128, 128, 16384, 1, "bfloat16"),
                                   (8, 4096, 4096, 1, "float16"), (512, 512, 512, 8, "float32")])
def test_autotune_is_never_slower_than_the_heuristic_by_the_cost_model(vendor, shape):
    st_ = stack(vendor, "h200-like", meta=True)
    rt, lib = st_.runtime, st_.library
    m, n, k, batch, dtype = shape
    p = rt.malloc(1 << 20)
    params = {"m": m, "n": n, "k": k, "batch": batch, "dtype": dtype}
    heur = lib.gemm(p, p, p, params)
    tuned = lib.gemm(p, p, p, {**params, "autotune": True})
    preds = tuned.predictions
    assert set(preds) == {a.name for a in lib.algorithms if a.split_k == 1 or
                          blas.workspace_bytes(a.split_k, batch, m, n) <= lib.workspace_limit}
    assert preds[tuned.algorithm] == min(preds.values())
    assert preds[tuned.algorithm] <= preds[heur.algorithm]
    assert "autotune" in tuned.reason
    # a one-pass algorithm's prediction is the analytic GEMM model at its effective tile
    # (shape-generic library kernels keep their full tile: no clamping to small sizes)
    spec = rt.driver.device_spec(0)
    plain = next(a for a in lib.algorithms if a.split_k == 1)
    tile = plain.effective(dtype)
    counters = gemm_counters(m, n, k, batch, dtype, tile, clamp=False)
    model = kernel_cost(spec, counters, {"tile": list(tile)}).duration_s
    assert preds[plain.name] == pytest.approx(model, rel=0.05)


def test_heuristic_prefers_split_k_for_few_tiles_and_long_k_and_deeper_k_tiles_for_narrow_types():
    st_ = stack("cuda-like", "h200-like", meta=True)
    lib = st_.library
    algo, why = lib.choose(128, 128, 1, 16384, "bfloat16")
    assert algo.split_k > 1 and "split-K" in why
    algo, why = lib.choose(8192, 8192, 1, 8192, "bfloat16")
    assert algo.split_k == 1 and "largest tile" in why
    assert algo.k_tile("float8_e4m3fn") == 4 * algo.tile[2]
    assert algo.k_tile("bfloat16") == 2 * algo.tile[2]
    assert algo.k_tile("float32") == algo.tile[2]


def test_the_kept_heuristic_choice_is_the_heuristic_s_for_the_device_asked(monkeypatch):
    """``select`` keeps the heuristic's answer per shape, dtype, workspace limit and compute
    units: the same call again gives the same choice, and a device with other units is asked
    afresh (few units: no split-K for 8 output tiles; many: split-K)."""
    st_ = stack("cuda-like", "h200-like", meta=True)
    lib = st_.library
    problem = lib._problem({"m": 128, "n": 256, "k": 16384, "dtype": "bfloat16"})
    first = lib.select(problem)
    assert lib.select(problem) == first
    assert first[:2] == lib.choose(128, 256, 1, 16384, "bfloat16")
    real = type(st_.driver).properties

    def units(n):
        def properties(self, index):
            props = real(self, index)
            return type(props)(**{**props.__dict__, "compute_units": n}) \
                if hasattr(props, "__dict__") else props._replace(compute_units=n)
        return properties
    monkeypatch.setattr(type(st_.driver), "properties", units(4))
    few = lib.select(problem)
    assert few[0].split_k == 1 and few[:2] == lib.choose(128, 256, 1, 16384, "bfloat16")
    assert first[0].split_k > 1


def test_shipped_images_per_target_and_the_virtual_isa_jit():
    # cuda-like on tiny is sm_80: without its cubin the compute_80 PTX is JIT-compiled
    st_ = compose(make_config("cuda-like", spec="tiny"))
    rt, lib = st_.runtime, st_.library
    lib.shipped = [s for s in lib.shipped if s["target"] != "sm_80"]
    a = np.eye(8, dtype=np.float32)
    jit = rt.driver.counts["jit_compiles"]
    rec, out = run(lib, rt, a, a, np.zeros((8, 8), np.float32), {"m": 8, "n": 8, "k": 8,
                                                                  "dtype": "float32"})
    assert rec.image == "ptx-like:compute_80" and np.array_equal(out, a)
    assert rt.driver.counts["jit_compiles"] > jit
    lib.shipped = [s for s in lib.shipped if s["rule"] != "virtual"]
    p = rt.malloc(4096)
    with pytest.raises(LibraryError, match="no kernel image for sm_80"):
        lib.gemm(p, p, p, {"m": 8, "n": 8, "k": 8, "dtype": "float32"})
    # rocm-like has nothing to JIT: a build without gfx90a fails on tiny (gfx90a)
    st_ = compose(make_config("rocm-like", spec="tiny"))
    st_.library.shipped = [s for s in st_.library.shipped if s["target"] != "gfx90a"]
    p = st_.runtime.malloc(4096)
    with pytest.raises(LibraryError, match="no kernel image for gfx90a"):
        st_.library.gemm(p, p, p, {"m": 8, "n": 8, "k": 8, "dtype": "float32"})


@pytest.mark.parametrize("bad, match", [
    ({"batch": 2, "stride_c": 3}, "overlap"),
    ({"dtype": "float8_e4m3fn", "out_dtype": "float8_e4m3fn"}, "cannot write"),
    ({"a_scale": 2.0}, "fp8 inputs"),
    ({"activation": "tanh"}, "activation"),
    ({"algorithm": "no-such"}, "unknown gemm algorithm"),
    ({"alpha": float("nan")}, "finite"),
    ({"trans_a": "yes"}, "true or false"),
    ({"stride_a": -1}, "non-negative"),
    ({"dtype": "float7"}, "float7"),
])
def test_bad_gemm_calls_give_library_errors(bad, match):
    st_ = stack("cuda-like")
    p = st_.runtime.malloc(4096)
    with pytest.raises(LibraryError, match=match):
        st_.library.gemm(p, p, p, {"m": 4, "n": 4, "k": 4, "dtype": "float32", **bad})


@pytest.mark.parametrize("ta, tb", [(True, False), (False, True), (True, True)])
def test_codegen_gemm_kernel_reads_transposed_operands(ta, tb):
    st_ = stack("cuda-like")
    rt, lib = st_.runtime, st_.library
    m, n, k = 12, 10, 20
    prog, grid = codegen.gemm_kernel("tg", DType.FLOAT32, m, n, k, 1, False, (16, 16, 8), 128,
                                     trans_a=ta, trans_b=tb)
    image = lib._image_for(rt.driver.properties(0).target, rt.driver.loadable_formats(0))
    module = rt.load_module(lib.build([prog], image["format"], image["target"]))
    rng = np.random.default_rng(2)
    A, B = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    a_st, b_st = (A.T if ta else A), (B.T if tb else B)
    ptrs = [rt.malloc(x.nbytes) for x in (a_st, b_st, np.zeros((m, n), np.float32))]
    rt.memcpy_h2d(ptrs[0], np.ascontiguousarray(a_st))
    rt.memcpy_h2d(ptrs[1], np.ascontiguousarray(b_st))
    rt.launch(module, "tg", grid, {"a": ptrs[0], "b": ptrs[1], "c": ptrs[2]})
    out = np.empty((m, n), np.float32)
    rt.memcpy_d2h(out, ptrs[2])
    np.testing.assert_allclose(out, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vendor", ["cuda-like", "rocm-like"])
def test_compiler_routes_batched_matmul_to_the_library(vendor):
    st_ = compose(make_config(vendor, spec="tiny"))
    g = Graph("bmm")
    x = g.input("x", (3, 9, 14), DType.FLOAT32)
    w = g.input("w", (14, 11), DType.FLOAT32)
    g.output(g.op("matmul", x, w))
    rng = np.random.default_rng(4)
    xv, wv = rng.standard_normal((3, 9, 14)).astype(np.float32), rng.standard_normal((14, 11)).astype(np.float32)
    before = len(st_.library.calls)
    (out,) = st_.framework.run(g, {"x": xv, "w": wv}).outputs
    np.testing.assert_allclose(out, xv.astype(np.float64) @ wv, rtol=1e-5, atol=1e-5)
    assert len(st_.library.calls) == before + 1
    assert st_.library.calls[-1].shape == (3, 9, 11, 14)
