"""DNN-like library routines (layers/dnn.py) on every family, against float64 references.

References are numpy in float64 and torch CPU in float64 (``torch.nn.functional`` for the
forward passes, ``torch.autograd`` for every backward pass), computed from the very inputs
the device sees (rounded to the storage dtype first), so the error measured is the
device's own.  Tolerances (max |error| / max |reference|), consistent with float32
accumulation and one rounding of each stored result (plus, in attention, the rounding of
the probabilities to the storage dtype before the second matrix product, as flash kernels do):

    float32: 2e-5     float16: 4e-3     bfloat16: 3e-2

(a reference whose largest magnitude is under 1e-3, e.g. the zero gradients of a one-element
norm, is compared on an absolute 1e-3 scale instead)
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fornax.layers.errors import LibraryError
from fornax.stack import get_vendor
from helpers import FAMILIES
from helpers import LibraryDevice as Dev
from helpers import library_device as dev

VENDORS = FAMILIES
NP = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
      "bfloat16": np.dtype(ml_dtypes.bfloat16)}
TOL = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}
API = {  # routine -> the family's API name, by hand
    "cuda-like": {"conv2d_fwd": "cudnnConvolutionForward", "conv2d_bwd_weights": "cudnnConvolutionBackwardFilter",
                  "rms_norm_fwd": "cudnn_frontend rmsnorm"},
    "rocm-like": {"conv2d_fwd": "miopenConvolutionForward", "conv2d_bwd_weights": "miopenConvolutionBackwardWeights",
                  "rms_norm_fwd": "miopenT5LayerNormForward"},
    "xpu-like": {"conv2d_fwd": "dnnl::convolution_forward",
                 "conv2d_bwd_weights": "dnnl::convolution_backward_weights",
                 "rms_norm_fwd": "dnnl::layer_normalization_forward (rms_norm flag)"},
}
SETTINGS = settings(max_examples=5, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])




def rand(rng, shape, dtype: str, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(NP[dtype])


def t64(a: np.ndarray, grad: bool = False) -> torch.Tensor:
    return torch.tensor(a.astype(np.float64), requires_grad=grad)


def check(got: np.ndarray, ref, dtype: str, what: str, scale: float = 0.0) -> None:
    """``scale``: the magnitude the error is relative to when it exceeds the result's own (a
    norm's dx cancels to near zero for short rows; its natural size is |dy * gamma * rstd|)."""
    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    err = np.abs(got.astype(np.float64) - ref).max() / max(np.abs(ref).max(), scale, 1e-3)
    assert err <= TOL[dtype], f"{what} ({dtype}): relative error {err:.2e} > {TOL[dtype]:.0e}"


# == convolution ===================================================================================
def conv_case(vendor, dtype, n, cg, kg, groups, h, w, r, s, stride, pad, dil, seed=0):
    d, rng = dev(vendor), np.random.default_rng(seed)
    c, k = cg * groups, kg * groups
    x, wt = rand(rng, (n, c, h, w), dtype), rand(rng, (k, cg, r, s), dtype)
    p = dict(n=n, c=c, h=h, w=w, k=k, r=r, s=s, stride=stride, padding=pad, dilation=dil,
             groups=groups, dtype=dtype)
    xt, wtt = t64(x, True), t64(wt, True)
    yt = F.conv2d(xt, wtt, stride=stride, padding=pad, dilation=dil, groups=groups)
    dy = rand(rng, tuple(yt.shape), dtype)
    yt.backward(t64(dy))
    px, pw, pdy = d.put(x), d.put(wt), d.put(dy)
    py, pdx, pdw = d.empty(yt.shape, NP[dtype]), d.empty(x.shape, NP[dtype]), d.empty(wt.shape, NP[dtype])
    recs = [d.lib.conv2d_fwd(px, pw, py, p), d.lib.conv2d_bwd_data(pdy, pw, pdx, p),
            d.lib.conv2d_bwd_weights(px, pdy, pdw, p)]
    check(d.get(py, tuple(yt.shape), NP[dtype]), yt, dtype, "conv2d_fwd")
    check(d.get(pdx, x.shape, NP[dtype]), xt.grad, dtype, "conv2d_bwd_data")
    check(d.get(pdw, wt.shape, NP[dtype]), wtt.grad, dtype, "conv2d_bwd_weights")
    return recs


@pytest.mark.parametrize("vendor", VENDORS)
@SETTINGS
@given(n=st.integers(1, 2), cg=st.integers(1, 3), kg=st.integers(1, 3), groups=st.integers(1, 2),
       h=st.integers(3, 7), w=st.integers(3, 7), r=st.integers(1, 3), s=st.integers(1, 3),
       stride=st.integers(1, 2), pad=st.integers(0, 1), dil=st.integers(1, 2))
def test_conv2d_three_passes_match_torch(vendor, n, cg, kg, groups, h, w, r, s, stride, pad, dil):
    if (h + 2 * pad - dil * (r - 1) - 1) < 0 or (w + 2 * pad - dil * (s - 1) - 1) < 0:
        return                                              # the filter does not fit: see below
    conv_case(vendor, "float32", n, cg, kg, groups, h, w, r, s, stride, pad, dil)


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_conv2d_low_precision_and_records(vendor, dtype):
    recs = conv_case(vendor, dtype, 2, 3, 4, 2, 9, 8, 3, 3, (2, 1), (1, 0), (1, 2), seed=1)
    facts = get_vendor(vendor).facts["library"]["dnn"]
    for rec, pass_ in zip(recs, ("fwd", "bwd_data", "bwd_weights")):
        assert rec.algorithm in {a["name"] for a in facts["conv"][pass_]}
        assert "implicit GEMM" in rec.reason and "tile" in rec.reason
    assert recs[0].reason.startswith(API[vendor]["conv2d_fwd"])
    assert recs[2].reason.startswith(API[vendor]["conv2d_bwd_weights"])
    rep = dev(vendor).lib.report()
    assert {"conv2d_fwd", "conv2d_bwd_data", "conv2d_bwd_weights"} <= \
        {c["routine"] for c in rep["algorithms_chosen"]}


@pytest.mark.parametrize("vendor", VENDORS)
def test_conv2d_large_problem_takes_a_large_tile(vendor):
    """A problem with many output pixels fills the 4-unit device with the largest fwd tile."""
    d, rng = dev(vendor), np.random.default_rng(2)
    n, c, h, w, k = 2, 8, 32, 32, 64
    x, wt = rand(rng, (n, c, h, w), "float32"), rand(rng, (k, c, 3, 3), "float32")
    py = d.empty((n, k, h, w), np.float32)
    rec = d.lib.conv2d_fwd(d.put(x), d.put(wt), py, dict(n=n, c=c, h=h, w=w, k=k, r=3, s=3, padding=1))
    algos = get_vendor(vendor).facts["library"]["dnn"]["conv"]["fwd"]
    biggest = max(algos, key=lambda a: a["tile"][0] * a["tile"][1])
    assert rec.algorithm == biggest["name"], rec.reason
    check(d.get(py, (n, k, h, w), np.float32), F.conv2d(t64(x), t64(wt), padding=1), "float32", "conv")


@pytest.mark.parametrize("vendor", VENDORS)
def test_conv2d_bad_input(vendor):
    d = dev(vendor)
    p = d.rt.malloc(4096)
    base = dict(n=1, c=4, h=4, w=4, k=4, r=3, s=3)
    with pytest.raises(LibraryError, match="groups=3 must divide"):
        d.lib.conv2d_fwd(p, p, p, base | {"groups": 3})
    with pytest.raises(LibraryError, match="does not fit"):
        d.lib.conv2d_fwd(p, p, p, base | {"r": 7})
    with pytest.raises(LibraryError, match="does not support dtype"):
        d.lib.conv2d_fwd(p, p, p, base | {"dtype": "int32"})
    with pytest.raises(LibraryError, match="missing size"):
        d.lib.conv2d_fwd(p, p, p, {"n": 1})


# == attention =====================================================================================
def attention_case(vendor, dtype, b, h, sq, sk, dh, causal, seed=0):
    d, rng = dev(vendor), np.random.default_rng(seed)
    q, k, v = (rand(rng, (b, h, s_, dh), dtype) for s_ in (sq, sk, sk))
    qt, kt, vt = t64(q, True), t64(k, True), t64(v, True)
    ot = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    do = rand(rng, (b, h, sq, dh), dtype)
    ot.backward(t64(do))
    # log-sum-exp of the scaled scores, in float64
    scores = q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2) / np.sqrt(dh)
    if causal:
        scores = np.where(np.tril(np.ones((sq, sk), bool)), scores, -np.inf)
    mx = scores.max(-1, keepdims=True)
    lse_ref = (mx + np.log(np.exp(scores - mx).sum(-1, keepdims=True)))[..., 0]
    pq, pk, pv, pdo = d.put(q), d.put(k), d.put(v), d.put(do)
    po, plse = d.empty(q.shape, NP[dtype]), d.empty((b, h, sq), np.float32)
    pdq, pdk, pdv = d.empty(q.shape, NP[dtype]), d.empty(k.shape, NP[dtype]), d.empty(v.shape, NP[dtype])
    params = dict(batch=b, heads=h, seq_q=sq, seq_k=sk, head_dim=dh, causal=causal, dtype=dtype)
    fwd = d.lib.attention_fwd(pq, pk, pv, po, plse, params)
    bwd = d.lib.attention_bwd(pq, pk, pv, po, pdo, plse, pdq, pdk, pdv, params)
    check(d.get(po, q.shape, NP[dtype]), ot, dtype, "attention o")
    lse = d.get(plse, (b, h, sq), np.float32)
    assert np.abs(lse - lse_ref).max() <= 1e-4 * max(1.0, np.abs(lse_ref).max()), "attention lse"
    check(d.get(pdq, q.shape, NP[dtype]), qt.grad, dtype, "attention dq")
    check(d.get(pdk, k.shape, NP[dtype]), kt.grad, dtype, "attention dk")
    check(d.get(pdv, v.shape, NP[dtype]), vt.grad, dtype, "attention dv")
    return fwd, bwd


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_fwd_bwd_match_autograd(vendor, head_dim, causal):
    fwd, bwd = attention_case(vendor, "float32", 1, 2, 40, 70, head_dim, causal)
    tiles = {t["name"]: tuple(t["tile"]) for t in get_vendor(vendor).facts["library"]["dnn"]["attention"]["tiles"]}
    assert fwd.algorithm in tiles and bwd.algorithm in tiles
    # 70 keys are more than one K/V tile: the online softmax really ran over several tiles
    assert tiles[fwd.algorithm][1] < 70 and "K/V tile(s)" in fwd.reason
    # every tile chosen fits the tiny chip's 64 KiB of shared memory
    item = 4
    bm, bn = tiles[fwd.algorithm]
    assert (bm + 2 * bn) * head_dim * item <= 65536
    bm, bn = tiles[bwd.algorithm]
    assert (2 * bm + 2 * bn) * head_dim * item <= 65536
    assert ("causal" in fwd.reason) == causal


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("dtype,head_dim", [("bfloat16", 64), ("float16", 128)])
def test_flash_attention_low_precision(vendor, dtype, head_dim):
    attention_case(vendor, dtype, 2, 1, 33, 65, head_dim, True, seed=3)


@pytest.mark.parametrize("vendor", VENDORS)
def test_attention_bad_input(vendor):
    d = dev(vendor)
    p = d.rt.malloc(4096)
    with pytest.raises(LibraryError, match="head dim 96 is not supported"):
        d.lib.attention_fwd(p, p, p, p, p, dict(seq_q=4, head_dim=96))
    with pytest.raises(LibraryError, match="positive"):
        d.lib.attention_fwd(p, p, p, p, p, dict(seq_q=0, head_dim=64))


# == norms and softmax =============================================================================
@pytest.mark.parametrize("vendor", VENDORS)
@SETTINGS
@given(rows=st.integers(1, 9), cols=st.integers(1, 300), dtype=st.sampled_from(["float32", "bfloat16"]))
def test_layer_norm_fwd_bwd(vendor, rows, cols, dtype):
    d, rng = dev(vendor), np.random.default_rng(rows * 1000 + cols)
    x = (rand(rng, (rows, cols), "float32") * 2 + 0.5).astype(NP[dtype])
    g, b, dy = rand(rng, (cols,), dtype), rand(rng, (cols,), dtype), rand(rng, (rows, cols), dtype)
    eps = 1e-5
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(x64.var(-1, keepdims=True) + eps)
    xt, gt, bt = t64(x, True), t64(g, True), t64(b, True)
    yt = F.layer_norm(xt, (cols,), gt, bt, eps)
    yt.backward(t64(dy))
    np.testing.assert_allclose(yt.detach().numpy(), (x64 - mean) * rstd * g.astype(np.float64) + b.astype(np.float64),
                               atol=1e-9)
    px, pg, pb, pdy = d.put(x), d.put(g), d.put(b), d.put(dy)
    py, pm, pr = d.empty(x.shape, NP[dtype]), d.empty((rows,), np.float32), d.empty((rows,), np.float32)
    pdx, pdg, pdb = d.empty(x.shape, NP[dtype]), d.empty((cols,), NP[dtype]), d.empty((cols,), NP[dtype])
    params = dict(rows=rows, cols=cols, eps=eps, dtype=dtype)
    d.lib.layer_norm_fwd(px, pg, pb, py, pm, pr, params)
    d.lib.layer_norm_bwd(pdy, px, pg, pm, pr, pdx, pdg, pdb, params)
    check(d.get(py, x.shape, NP[dtype]), yt, dtype, "layer_norm y")
    np.testing.assert_allclose(d.get(pm, (rows,), np.float32), mean[:, 0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d.get(pr, (rows,), np.float32), rstd[:, 0], rtol=1e-4)
    natural = np.abs(dy.astype(np.float64) * g.astype(np.float64) * rstd).max()
    check(d.get(pdx, x.shape, NP[dtype]), xt.grad, dtype, "layer_norm dx", natural)
    check(d.get(pdg, (cols,), NP[dtype]), gt.grad, dtype, "layer_norm dgamma")
    check(d.get(pdb, (cols,), NP[dtype]), bt.grad, dtype, "layer_norm dbeta")


@pytest.mark.parametrize("vendor", VENDORS)
@SETTINGS
@given(rows=st.integers(1, 9), cols=st.integers(1, 300), dtype=st.sampled_from(["float32", "float16"]))
def test_rms_norm_fwd_bwd(vendor, rows, cols, dtype):
    d, rng = dev(vendor), np.random.default_rng(rows * 7 + cols)
    x, g, dy = rand(rng, (rows, cols), dtype), rand(rng, (cols,), dtype), rand(rng, (rows, cols), dtype)
    eps = 1e-6
    x64 = x.astype(np.float64)
    rstd = 1 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + eps)
    xt, gt = t64(x, True), t64(g, True)
    yt = F.rms_norm(xt, (cols,), gt, eps)
    yt.backward(t64(dy))
    px, pg, pdy = d.put(x), d.put(g), d.put(dy)
    py, pr = d.empty(x.shape, NP[dtype]), d.empty((rows,), np.float32)
    pdx, pdg = d.empty(x.shape, NP[dtype]), d.empty((cols,), NP[dtype])
    params = dict(rows=rows, cols=cols, eps=eps, dtype=dtype)
    rec = d.lib.rms_norm_fwd(px, pg, py, pr, params)
    d.lib.rms_norm_bwd(pdy, px, pg, pr, pdx, pdg, params)
    assert rec.reason.startswith(API[vendor]["rms_norm_fwd"])
    check(d.get(py, x.shape, NP[dtype]), x64 * rstd * g.astype(np.float64), dtype, "rms_norm y (numpy)")
    check(d.get(py, x.shape, NP[dtype]), yt, dtype, "rms_norm y")
    np.testing.assert_allclose(d.get(pr, (rows,), np.float32), rstd[:, 0], rtol=1e-4)
    natural = np.abs(dy.astype(np.float64) * g.astype(np.float64) * rstd).max()
    check(d.get(pdx, x.shape, NP[dtype]), xt.grad, dtype, "rms_norm dx", natural)
    check(d.get(pdg, (cols,), NP[dtype]), gt.grad, dtype, "rms_norm dgamma")


@pytest.mark.parametrize("vendor", VENDORS)
@SETTINGS
@given(rows=st.integers(1, 8), cols=st.integers(1, 200), log=st.booleans(),
       dtype=st.sampled_from(["float32", "bfloat16"]))
def test_softmax_fwd_bwd(vendor, rows, cols, log, dtype):
    d, rng = dev(vendor), np.random.default_rng(rows + 31 * cols)
    x, dy = rand(rng, (rows, cols), dtype, 3.0), rand(rng, (rows, cols), dtype)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    ref = e / e.sum(-1, keepdims=True)
    ref = np.log(ref) if log else ref
    xt = t64(x, True)
    yt = (F.log_softmax if log else F.softmax)(xt, -1)
    yt.backward(t64(dy))
    px, py, pdy, pdx = d.put(x), d.empty(x.shape, NP[dtype]), d.put(dy), d.empty(x.shape, NP[dtype])
    params = dict(rows=rows, cols=cols, log=log, dtype=dtype)
    d.lib.softmax_fwd(px, py, params)
    y = d.get(py, x.shape, NP[dtype])
    check(y, ref, dtype, "softmax y (numpy)")
    check(y, yt, dtype, "softmax y")
    # the backward takes the device's saved output y, as a framework passes it
    d.lib.softmax_bwd(py, pdy, pdx, params)
    check(d.get(pdx, x.shape, NP[dtype]), xt.grad, dtype, "softmax dx")


@pytest.mark.parametrize("vendor", VENDORS)
def test_row_routines_bad_input(vendor):
    d = dev(vendor)
    p = d.rt.malloc(4096)
    with pytest.raises(LibraryError, match="one-tile limit"):
        d.lib.softmax_fwd(p, p, dict(rows=1, cols=1 << 20))
    with pytest.raises(LibraryError, match="positive"):
        d.lib.layer_norm_fwd(p, p, p, p, p, p, dict(rows=0, cols=4))


# == pooling =======================================================================================
@pytest.mark.parametrize("vendor", VENDORS)
@SETTINGS
@given(mode=st.sampled_from(["max", "avg"]), n=st.integers(1, 2), c=st.integers(1, 3),
       h=st.integers(2, 9), w=st.integers(2, 9), kh=st.integers(1, 3), kw=st.integers(1, 3),
       stride=st.integers(1, 3), pad=st.integers(0, 1))
def test_pool2d_fwd_bwd(vendor, mode, n, c, h, w, kh, kw, stride, pad):
    if 2 * pad > min(kh, kw) or h + 2 * pad < kh or w + 2 * pad < kw:
        return
    d, rng = dev(vendor), np.random.default_rng(h * 13 + w)
    x = rand(rng, (n, c, h, w), "float32")
    xt = t64(x, True)
    pool = F.max_pool2d if mode == "max" else F.avg_pool2d
    yt = pool(xt, (kh, kw), stride, pad)
    dy = rand(rng, tuple(yt.shape), "float32")
    yt.backward(t64(dy))
    params = dict(n=n, c=c, h=h, w=w, kernel=(kh, kw), stride=stride, padding=pad, mode=mode)
    px, py = d.put(x), d.empty(yt.shape, np.float32)
    pidx = d.empty(yt.shape, np.int64) if mode == "max" else None
    pdy, pdx = d.put(dy), d.empty(x.shape, np.float32)
    d.lib.pool2d_fwd(px, py, params, indices=pidx)
    d.lib.pool2d_bwd(pdy, pdx, params, indices=pidx)
    check(d.get(py, tuple(yt.shape), np.float32), yt, "float32", f"{mode} pool y")
    check(d.get(pdx, x.shape, np.float32), xt.grad, "float32", f"{mode} pool dx")
    if mode == "max":
        _, idx = F.max_pool2d(xt, (kh, kw), stride, pad, return_indices=True)
        np.testing.assert_array_equal(d.get(pidx, tuple(yt.shape), np.int64), idx.numpy())


@pytest.mark.parametrize("vendor", VENDORS)
def test_pool2d_bad_input(vendor):
    d = dev(vendor)
    p = d.rt.malloc(4096)
    with pytest.raises(LibraryError, match="needs an indices buffer"):
        d.lib.pool2d_fwd(p, p, dict(n=1, c=1, h=4, w=4, kernel=2, mode="max"))
    with pytest.raises(LibraryError, match="mode must be"):
        d.lib.pool2d_fwd(p, p, dict(n=1, c=1, h=4, w=4, kernel=2, mode="median"))
    with pytest.raises(LibraryError, match="padding"):
        d.lib.pool2d_fwd(p, p, dict(n=1, c=1, h=4, w=4, kernel=2, padding=2, mode="avg"))


def test_library_without_dnn_table_says_so():
    d = Dev("cuda-like")
    d.lib.facts = {"library": {k: v for k, v in d.lib.facts["library"].items() if k != "dnn"}}
    with pytest.raises(LibraryError, match="no DNN routines"):
        d.lib.softmax_fwd(0, 0, dict(rows=1, cols=1))
