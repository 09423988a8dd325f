"""2:4 structured-sparse GEMM: the format, the libraries' calls against float64 masked dense
references, the cost model's speed-up and where it vanishes, and the families' error codes."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from benchmarks.sparse_sweep import sweep
from fornax.contracts.base import Subject
from fornax.layers.errors import InvalidArgumentError, NotSupportedError
from fornax.sim import sparsity
from fornax.sim.faults import SpecError
from fornax.sim.spec import load_spec
from fornax.stack import compose, get_vendor, make_config

BF16 = ml_dtypes.bfloat16


def _library(vendor: str):
    s = Subject(get_vendor(vendor))
    rt = s.runtime()
    return rt, s.vendor.library(rt)


def _upload(rt, arr: np.ndarray) -> int:
    p = rt.malloc(arr.nbytes)
    rt.memcpy_h2d(p, np.ascontiguousarray(arr))
    return p


def test_compress_expand_roundtrip_keeps_every_2to4_matrix():
    rng = np.random.default_rng(1)
    dense = rng.standard_normal((8, 96)).astype(np.float32)
    dense = np.where(sparsity.prune_mask(dense), dense, 0)
    dense[0, :4] = 0                     # a group with no nonzeros
    dense[1, 4:8] = [0, 0, 3, 0]         # ... and one with a single nonzero
    assert sparsity.violations(dense) == 0
    values, words = sparsity.compress(dense)
    assert values.shape == (8, 48) and words.shape == (8, 3) and words.dtype == np.int32
    np.testing.assert_array_equal(sparsity.expand(values, words, 96), dense)
    assert sparsity.compressed_bytes(8, 96, 2) == (8 * 48 * 2, 8 * 3 * 4)
    # the prune keeps the two largest magnitudes of each four
    x = np.array([[1.0, -4.0, 3.0, 2.0]])
    np.testing.assert_array_equal(sparsity.prune_mask(x), [[False, True, True, False]])
    assert sparsity.violations(x) == 1


@pytest.mark.parametrize("vendor", ["cuda-like", "rocm-like"])
def test_sparse_matmul_matches_the_float64_masked_dense_product(vendor):
    rt, lib = _library(vendor)
    rng = np.random.default_rng(7)
    m, n, k = 48, 32, 80                                      # K ends in half a metadata word
    w = rng.standard_normal((m, k)).astype(BF16)
    w[0, :4] = 0                                              # groups with no nonzero ...
    w[1, 4:8] = [0, 0, 5, 0]                                  # ... and with one
    bias = rng.standard_normal(m).astype(np.float32)          # the output dtype's
    pw, pbias = _upload(rt, w), _upload(rt, bias)
    p = {"m": m, "k": k, "dtype": "bfloat16"}
    assert not lib.sparse_prune_check(pw, p)
    lib.sparse_prune(pw, pw, p)
    assert lib.sparse_prune_check(pw, p)
    pruned = np.empty((m, k), BF16)
    rt.memcpy_d2h(pruned, pw)
    masked = np.where(sparsity.prune_mask(w), w.astype(np.float64), 0.0)
    np.testing.assert_array_equal(pruned.astype(np.float64), masked)
    size, _ = lib.sparse_compressed_size(p)
    pc = rt.malloc(size)
    lib.sparse_compress(pw, pc, p)
    # the device's compressed values and metadata are the host reference's, bit for bit
    ref_values, ref_words = sparsity.compress(pruned)
    got = np.empty(size, np.uint8)
    rt.memcpy_d2h(got, pc)
    assert got[:ref_values.nbytes].tobytes() == ref_values.tobytes()
    meta_at = -(-ref_values.nbytes // 256) * 256
    assert got[meta_at:meta_at + ref_words.nbytes].tobytes() == ref_words.tobytes()
    assert size == meta_at + ref_words.nbytes
    # B as x [n, k] (trans_b) and C written column-major (F.linear's [n, m]), with a bias
    x = rng.standard_normal((n, k)).astype(BF16)
    px, py = _upload(rt, x), rt.malloc(n * m * 4)
    rec = lib.sparse_matmul(pc, px, py, {"m": m, "n": n, "k": k, "dtype": "bfloat16", "trans_b": True,
                                         "c_col": True, "bias": pbias, "out_dtype": "float32"})
    y = np.empty((n, m), np.float32)
    rt.memcpy_d2h(y, py)
    ref = x.astype(np.float64) @ masked.T + bias.astype(np.float64)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-4)      # float32 accumulation of exact products
    assert rec.algorithm.startswith(lib.sparse_facts["calls"]["matmul"])
    # B as [k, n] and C row-major [m, n], alpha, bfloat16 out
    b = rng.standard_normal((k, n)).astype(BF16)
    pb, pz = _upload(rt, b), rt.malloc(m * n * 2)
    lib.sparse_matmul(pc, pb, pz, {"m": m, "n": n, "k": k, "dtype": "bfloat16", "alpha": 0.5})
    z = np.empty((m, n), BF16)
    rt.memcpy_d2h(z, pz)
    ref = 0.5 * masked @ b.astype(np.float64)
    np.testing.assert_allclose(z.astype(np.float64), ref, rtol=2 ** -8, atol=1e-2)


def test_speedup_on_a_large_square_and_none_on_small_or_skinny_shapes():
    rows = {r["shape"]: r for r in sweep("cuda-like", [("8192^3", 8192, 8192, 8192),
                                                       ("small", 64, 64, 64),
                                                       ("skinny k=64", 8192, 8192, 64),
                                                       ("long k", 128, 128, 16384)])}
    assert rows["8192^3"]["speedup"] > 1.15                     # half the matrix work, same B traffic
    for shape in ("small", "skinny k=64"):                      # launch latency / memory bound
        assert 0.95 < rows[shape]["speedup"] < 1.05
    # few output tiles and a long K: split-K for both, and 2:4 still halves the slices' work
    assert "splitk" in rows["long k"]["algorithm"] and rows["long k"]["speedup"] > 1.1
    # the library's prediction is the launch's price: a 2:4 kernel's energy is that of the
    # multiplies it performs, so running at twice the rate does not throttle its clock
    lib = compose(make_config("cuda-like", spec="h200-like", meta=True)).library
    predicted = lib.sparse_predict({"m": 8192, "n": 8192, "k": 8192, "dtype": "bfloat16"})
    assert abs(predicted / rows["8192^3"]["sparse_s"] - 1) < 1e-9
    mi = {r["shape"]: r for r in sweep("rocm-like", [("4096^3", 4096, 4096, 4096)])}
    assert mi["4096^3"]["speedup"] > 1.5
    xpu = sweep("xpu-like", [("4096^3", 4096, 4096, 4096)])[0]
    assert "dnnl_unimplemented" in xpu["refused"] and "sparse_s" not in xpu


def test_each_family_refuses_bad_calls_with_its_own_codes():
    rt, lib = _library("cuda-like")
    p = rt.malloc(1 << 16)
    with pytest.raises(InvalidArgumentError) as e:                # K off the 16-element alignment
        lib.sparse_matmul(p, p, p, {"m": 32, "n": 32, "k": 40, "dtype": "bfloat16"})
    assert (e.value.code.name, e.value.code.value) == ("CUSPARSE_STATUS_INVALID_VALUE", 3)
    assert "k=40 is not a multiple of 16" in str(e.value) and "cusparseLtMatmul" in str(e.value)
    with pytest.raises(NotSupportedError) as e:                   # a dtype the sparse path lacks
        lib.sparse_compressed_size({"m": 32, "k": 32, "dtype": "float32"})
    assert (e.value.code.name, e.value.code.value) == ("CUSPARSE_STATUS_NOT_SUPPORTED", 10)
    dense = _upload(rt, np.ones((32, 32), BF16))
    with pytest.raises(InvalidArgumentError) as e:                # compress of a matrix not 2:4
        lib.sparse_compress(dense, p, {"m": 32, "k": 32, "dtype": "bfloat16"})
    assert "256 group(s)" in str(e.value) and "cusparseLtSpMMAPrune" in e.value.hint
    rt2, rocm = _library("rocm-like")
    with pytest.raises(InvalidArgumentError) as e:
        rocm.sparse_prune_check(0, {"m": 0, "k": 32, "dtype": "bfloat16"})
    assert e.value.code.name == "HIPSPARSE_STATUS_INVALID_VALUE" and "hipsparseLtSpMMAPruneCheck" in str(e.value)
    rt3, xpu = _library("xpu-like")
    with pytest.raises(NotSupportedError) as e:
        xpu.sparse_matmul(0, 0, 0, {"m": 32, "n": 32, "k": 32, "dtype": "bfloat16"})
    assert (e.value.code.api, e.value.code.name, e.value.code.value) == ("dnnl_status_t", "dnnl_unimplemented", 3)
    assert "no 2:4 structured-sparse instruction" in str(e.value) and "dense GEMM" in e.value.hint
    # a chip without a sparse matrix instruction
    stack = compose(make_config("cuda-like", spec="max1550-like", meta=True))
    with pytest.raises(NotSupportedError) as e:
        stack.library.sparse_matmul(0, 0, 0, {"m": 32, "n": 32, "k": 32, "dtype": "bfloat16"})
    assert e.value.code.name == "CUSPARSE_STATUS_ARCH_MISMATCH" and "max1550-like" in str(e.value)


def test_the_sparse_peak_is_validated_spec_data(tmp_path: Path):
    assert load_spec("h200-like").sparse_peak("bfloat16") == 1979e12
    assert load_spec("mi300x-like").sparse_peak("bfloat16") == 2614.9e12
    assert load_spec("max1550-like").sparse_peak("bfloat16") is None
    text = (Path(__file__).parents[2] / "fornax/sim/specs/tiny.toml").read_text()
    for bad, words in (("bfloat16 = 8.0e12", "at least the dense"), ("int8 = 32.0e12", "no dense peak")):
        path = tmp_path / "bad.toml"
        path.write_text(text.replace("[sparse_matrix_peak]", f"[sparse_matrix_peak]\n{bad}", 1)
                        .replace("bfloat16 = 32.0e12\n", "", 1 if bad.startswith("bfloat16") else 0))
        with pytest.raises(SpecError, match=words):
            load_spec(path)


def test_split_k_sparse_matmul_matches_float64_and_frees_its_workspace():
    rt, lib = _library("cuda-like")
    rng = np.random.default_rng(11)
    m, n, k = 32, 32, 1024                                   # one output tile on 4 units, long K
    w = rng.standard_normal((m, k)).astype(BF16)
    w = np.where(sparsity.prune_mask(w), w, np.zeros((), BF16))
    x = rng.standard_normal((n, k)).astype(BF16)
    bias = rng.standard_normal(m).astype(BF16)
    p = {"m": m, "k": k, "dtype": "bfloat16"}
    pw, px, pbias = _upload(rt, w), _upload(rt, x), _upload(rt, bias)
    size, _ = lib.sparse_compressed_size(p)
    pc, py = rt.malloc(size), rt.malloc(m * n * 2)
    lib.sparse_compress(pw, pc, p)
    used = rt.memory_stats()["allocated_bytes"]
    rec = lib.sparse_matmul(pc, px, py, {"m": m, "n": n, "k": k, "dtype": "bfloat16", "trans_b": True,
                                         "c_col": True, "bias": pbias})
    assert rec.options["split_k"] > 1 and rec.workspace == rec.options["split_k"] * m * n * 4
    assert rt.memory_stats()["allocated_bytes"] == used          # the partials were freed
    y = np.empty((n, m), BF16)
    rt.memcpy_d2h(y, py)
    ref = x.astype(np.float64) @ w.astype(np.float64).T + bias.astype(np.float64)
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=2 ** -8, atol=2 ** -5)
    # the split is the heuristic's, within the workspace limit: none left, no split
    rec = lib.sparse_matmul(pc, px, py, {"m": m, "n": n, "k": k, "dtype": "bfloat16", "trans_b": True,
                                         "c_col": True, "workspace_limit": 0})
    assert rec.options["split_k"] == 1 and rec.workspace == 0


def test_replayed_sparse_kernels_agree_with_the_interpreter_bit_for_bit():
    rng = np.random.default_rng(3)
    m, n, k = 32, 48, 64
    w = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    outs = []
    for replay in (False, True):
        stack = compose(make_config("rocm-like", spec="tiny", replay=replay))
        rt, lib = stack.runtime, stack.library
        pw, pb = _upload(rt, w), _upload(rt, b)
        p = {"m": m, "k": k, "dtype": "bfloat16"}
        size, _ = lib.sparse_compressed_size(p)
        pc, py = rt.malloc(size), rt.malloc(m * n * 4)
        for _ in range(2):                     # the second launch of each kernel replays its tape
            lib.sparse_prune(pw, pw, p)
            lib.sparse_compress(pw, pc, p)
            lib.sparse_matmul(pc, pb, py, {**p, "n": n, "out_dtype": "float32"})
        y, c = np.empty((m, n), np.float32), np.empty(size, np.uint8)
        rt.memcpy_d2h(y, py)
        rt.memcpy_d2h(c, pc)
        outs.append((y.tobytes(), c.tobytes()))
    assert outs[0] == outs[1]


def test_a_marshalled_library_forwards_the_sparse_calls():
    # cuBLAS-like calls over the rocm-like driver run on the rocm-like library (hipSPARSELt-like)
    stack = compose(make_config("rocm-like", seams={"library": "cuda-like"}, spec="tiny"))
    rt, lib = stack.runtime, stack.library
    assert lib.sparse_info()["name"] == "hipsparselt-like"
    m = n = k = 32
    x = (np.arange(m * k).reshape(m, k) % 7 - 3).astype(np.float32)
    w = np.where(sparsity.prune_mask(x), x, 0).astype(BF16)
    b = (np.arange(k * n).reshape(k, n) % 5 - 2).astype(BF16)
    pw, pb = _upload(rt, w), _upload(rt, b)
    p = {"m": m, "k": k, "dtype": "bfloat16"}
    pc, py = rt.malloc(lib.sparse_compressed_size(p)[0]), rt.malloc(m * n * 4)
    before = lib.forwarded
    lib.sparse_compress(pw, pc, p)
    lib.sparse_matmul(pc, pb, py, {**p, "n": n, "out_dtype": "float32"})
    assert lib.forwarded == before + 2
    y = np.empty((m, n), np.float32)
    rt.memcpy_d2h(y, py)
    np.testing.assert_array_equal(y, w.astype(np.float64) @ b.astype(np.float64))   # small integers: exact
