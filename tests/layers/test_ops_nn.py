"""dot_general, convolution / conv_transpose, gather / index_select / scatter, layer_norm,
rms_norm and attention: inference, verifier messages, float64 references checked against
torch and jax, and real device runs on all three vendor stacks."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fornax.layers.errors import GraphError
from fornax.layers.graph import DType, Graph
from fornax.layers.passes.decompose import decompose
from fornax.stack import compose, make_config
from helpers import FAMILIES

torch = pytest.importorskip("torch")
F = torch.nn.functional
VENDORS = list(FAMILIES)
R = np.random.default_rng(7)


def _t(a):
    return torch.from_numpy(np.asarray(a))


def _all_ops_graph():
    g = Graph("nn")
    x = g.input("x", (2, 4, 6, 5), DType.FLOAT32)
    w = g.input("w", (6, 2, 3, 2), DType.FLOAT32)
    wt = g.input("wt", (4, 3, 3, 2), DType.FLOAT32)
    a = g.input("a", (3, 4, 5), DType.FLOAT32)
    b = g.input("b", (5, 3, 2), DType.FLOAT32)
    idx = g.input("idx", (3, 2, 5), DType.INT32)
    upd = g.input("upd", (3, 2, 5), DType.FLOAT32)
    lw, lb = g.input("lw", (5,), DType.FLOAT32), g.input("lb", (5,), DType.FLOAT32)
    q = g.input("q", (2, 2, 4, 8), DType.FLOAT32)
    kv = g.input("kv", (2, 2, 6, 8), DType.FLOAT32)
    sel = g.constant(np.array([3, 0, 9, -2, 1], dtype=np.int64), "sel")
    g.output(g.op("convolution", x, w, stride=(2, 1), padding=((1, 0), (1, 1)), dilation=(1, 2), groups=2),
             g.op("conv_transpose", x, wt, stride=(2, 1), padding=1, output_padding=(1, 0), groups=2),
             g.op("dot_general", a, b, lhs_contracting=(2,), rhs_contracting=(0,), lhs_batch=(0,),
                  rhs_batch=(1,)),
             g.op("gather", a, idx, axis=1),
             g.op("relu", g.op("index_select", a, sel, axis=1)),        # an epilogue fuses after it
             g.op("scatter", a, idx, upd, axis=1, mode="add"),
             g.op("scatter", a, idx, upd, axis=1, mode="set"),
             g.op("layer_norm", a, lw, lb, eps=1e-5), g.op("rms_norm", a, lw),
             g.op("attention", q, kv, kv, causal=True), g.op("attention", q, kv, kv, scale=0.5))
    feeds = {"x": R.standard_normal((2, 4, 6, 5)), "w": R.standard_normal((6, 2, 3, 2)),
             "wt": R.standard_normal((4, 3, 3, 2)), "a": R.standard_normal((3, 4, 5)),
             "b": R.standard_normal((5, 3, 2)), "idx": R.integers(-2, 6, (3, 2, 5)).astype(np.int32),
             "upd": R.standard_normal((3, 2, 5)), "lw": R.standard_normal(5), "lb": R.standard_normal(5),
             "q": R.standard_normal((2, 2, 4, 8)), "kv": R.standard_normal((2, 2, 6, 8))}
    feeds = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in feeds.items()}
    return g, feeds


def _independent(f):
    """The expected outputs, from torch (float64) and numpy written without the op references."""
    d = {k: _t(v.astype(np.float64)) if v.dtype == np.float32 else _t(v) for k, v in f.items()}
    a = f["a"].astype(np.float64)
    idx = f["idx"].astype(np.int64)
    conv = F.conv2d(F.pad(d["x"], (1, 1, 1, 0)), d["w"], stride=(2, 1), dilation=(1, 2), groups=2)
    convt = F.conv_transpose2d(d["x"], d["wt"], stride=(2, 1), padding=1, output_padding=(1, 0), groups=2)
    dot = np.einsum("bmk,kbn->bmn", a, f["b"].astype(np.float64))
    gat = torch.gather(d["a"], 1, _t(np.clip(idx, 0, 3))).numpy()
    isel = np.maximum(torch.index_select(d["a"], 1, _t(np.array([3, 0, 3, 0, 1]))).numpy(), 0)
    keep = (idx >= 0) & (idx < 4)
    sadd = torch.scatter_add(d["a"], 1, _t(np.where(keep, idx, 0)),
                             _t(np.where(keep, f["upd"].astype(np.float64), 0))).numpy()
    sset = a.copy()
    for i, j, k in np.ndindex(*idx.shape):           # row-major: the last update wins
        if keep[i, j, k]:
            sset[i, idx[i, j, k], k] = f["upd"][i, j, k]
    ln = F.layer_norm(d["a"], (5,), d["lw"], d["lb"], eps=1e-5).numpy()
    rms = F.rms_norm(d["a"], (5,), d["lw"], eps=1e-5).numpy()
    att_c = F.scaled_dot_product_attention(d["q"], d["kv"], d["kv"], is_causal=True).numpy()
    att_s = F.scaled_dot_product_attention(d["q"], d["kv"], d["kv"], scale=0.5).numpy()
    return [conv.numpy(), convt.numpy(), dot, gat, isel, sadd, sset, ln, rms, att_c, att_s]


def test_references_match_torch():
    g, feeds = _all_ops_graph()
    for got, want in zip(g.reference(feeds), _independent(feeds)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("vendor", VENDORS)
def test_device_runs_match_references(vendor):
    g, feeds = _all_ops_graph()
    res = compose(make_config(vendor, spec="tiny")).run(g, feeds)
    assert res.fallbacks == []                                  # every op ran on the device
    for v, got, want in zip(g.outputs, res.outputs, _independent(feeds)):
        assert got.shape == want.shape, v
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(v))


def test_references_match_jax():
    jax = pytest.importorskip("jax")
    with jax.enable_x64(True):           # scoped: the flag must not leak into later tests
        _references_match_jax(jax)


def _references_match_jax(jax):
    lax = jax.lax
    a, b = R.standard_normal((2, 3, 4, 5)), R.standard_normal((5, 2, 6, 3))
    dims = (((3, 1), (0, 3)), ((0,), (1,)))
    g = Graph("dg")
    va, vb = g.input("a", a.shape, DType.FLOAT64), g.input("b", b.shape, DType.FLOAT64)
    g.output(g.op("dot_general", va, vb, lhs_contracting=(3, 1), rhs_contracting=(0, 3),
                  lhs_batch=(0,), rhs_batch=(1,)))
    (got,) = g.reference({"a": a, "b": b})
    np.testing.assert_allclose(got, np.asarray(lax.dot_general(a, b, dims)), rtol=1e-12)
    # 1-D convolution with groups, dilation and asymmetric padding
    x, w = R.standard_normal((2, 6, 11)), R.standard_normal((4, 3, 3))
    g = Graph("c1")
    vx, vw = g.input("x", x.shape, DType.FLOAT64), g.input("w", w.shape, DType.FLOAT64)
    g.output(g.op("convolution", vx, vw, stride=2, padding=((2, 1),), dilation=2, groups=2))
    (got,) = g.reference({"x": x, "w": w})
    want = lax.conv_general_dilated(x, w, (2,), [(2, 1)], rhs_dilation=(2,), feature_group_count=2)
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-12, atol=1e-12)


def test_decompositions_are_primitive():
    g, _ = _all_ops_graph()
    ops = {n.op for n in decompose(g).nodes}
    assert not ops & {"dot_general", "convolution", "conv_transpose", "layer_norm", "rms_norm",
                      "attention", "softmax"}
    assert {"im2col", "matmul", "index_select"} <= ops        # conv_transpose flips its kernel


def test_gather_clamps_and_scatter_drops_out_of_range():
    g = Graph("oob")
    x = g.input("x", (5, 3), DType.FLOAT32)
    i = g.input("i", (4, 3), DType.INT64)
    u = g.input("u", (4, 3), DType.FLOAT32)
    g.output(g.op("gather", x, i, axis=0), g.op("scatter", x, i, u, axis=0))
    xv = np.arange(15, dtype=np.float32).reshape(5, 3)
    iv = np.array([[-7, 0, 4], [5, 99, 2], [1, 1, 1], [4, -1, 0]])
    uv = np.full((4, 3), 100, np.float32)
    res = compose(make_config("rocm-like", spec="tiny")).run(g, {"x": xv, "i": iv, "u": uv})
    np.testing.assert_array_equal(res.outputs[0], xv[np.clip(iv, 0, 4), np.arange(3)])
    want = xv.copy()
    for (r, c), t in np.ndenumerate(iv):
        if 0 <= t < 5:
            want[t, c] += 100
    np.testing.assert_array_equal(res.outputs[1], want)


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 2), cg=st.integers(1, 3), og=st.integers(1, 3), groups=st.integers(1, 2),
       size=st.tuples(st.integers(3, 7), st.integers(3, 7)), k=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 2)), pad=st.tuples(st.integers(0, 2), st.integers(0, 1)),
       dil=st.tuples(st.integers(1, 2), st.integers(1, 2)))
def test_conv_hypothesis_device_vs_torch(n, cg, og, groups, size, k, stride, pad, dil):
    geo = list(zip(size, pad, dil, k, stride))
    if any(s + 2 * p - d * (kk - 1) - 1 < 0 or (s - 1) * t - 2 * p + d * (kk - 1) < 0
           for s, p, d, kk, t in geo):
        return                       # an empty output: the verifier rejects it (as torch does)
    x = R.standard_normal((n, cg * groups) + size).astype(np.float32)
    w = R.standard_normal((og * groups, cg) + k).astype(np.float32)
    wt = R.standard_normal((cg * groups, og) + k).astype(np.float32)
    g = Graph("hc")
    vx, vw, vt = (g.input(nm, a.shape, DType.FLOAT32) for nm, a in (("x", x), ("w", w), ("wt", wt)))
    g.output(g.op("convolution", vx, vw, stride=stride, padding=pad, dilation=dil, groups=groups),
             g.op("conv_transpose", vx, vt, stride=stride, padding=pad, dilation=dil, groups=groups))
    res = _STACK.run(g, {"x": x, "w": w, "wt": wt})
    xd, wd, td = (_t(a.astype(np.float64)) for a in (x, w, wt))
    want = [F.conv2d(xd, wd, stride=stride, padding=pad, dilation=dil, groups=groups).numpy(),
            F.conv_transpose2d(xd, td, stride=stride, padding=pad, dilation=dil, groups=groups).numpy()]
    for got, ref in zip(res.outputs, want):
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


_STACK = compose(make_config("xpu-like", spec="tiny"))


def _bad(op, shapes, dtypes=None, **attrs):
    g = Graph("bad")
    dtypes = dtypes or [DType.FLOAT32] * len(shapes)
    vals = [g.input(f"i{k}", s, d) for k, (s, d) in enumerate(zip(shapes, dtypes))]
    g.op(op, *vals, **attrs)


@pytest.mark.parametrize("args,msg", [
    (("dot_general", [(2, 3), (4, 5)], None, dict(lhs_contracting=(1,), rhs_contracting=(0,))),
     "contracting dims differ"),
    (("dot_general", [(2, 3), (3, 5)], None, dict(lhs_contracting=(1, 1), rhs_contracting=(0, 0))),
     "repeat a dim"),
    (("dot_general", [(2, 3), (3, 5)], None, dict(lhs_contracting=(2,), rhs_contracting=(0,))),
     "out of range"),
    (("convolution", [(1, 4, 5, 5), (2, 3, 3, 3)], None, dict(groups=1)), "must divide by groups"),
    (("convolution", [(1, 4, 2, 2), (2, 4, 3, 3)], None, {}), "is empty"),
    (("convolution", [(1, 4, 5, 5), (2, 4, 3, 3)], None, dict(stride=0)), "stride"),
    (("convolution", [(1, 4, 5, 5), (2, 4, 3, 3)], None, dict(padding=-1)), "padding"),
    (("conv_transpose", [(1, 4, 5, 5), (3, 2, 3, 3)], None, {}), "C_in"),
    (("conv_transpose", [(1, 4, 5, 5), (4, 2, 3, 3)], None, dict(stride=2, output_padding=2)),
     "output_padding"),
    (("gather", [(3, 4), (3, 4)], [DType.FLOAT32, DType.FLOAT32], {}), "int32 or int64"),
    (("gather", [(3, 4), (3, 5)], [DType.FLOAT32, DType.INT64], dict(axis=0)), "no\nlarger|larger"),
    (("index_select", [(3, 4), (2, 2)], [DType.FLOAT32, DType.INT64], {}), "1-D"),
    (("scatter", [(3, 4), (2, 4), (2, 4)], [DType.FLOAT32, DType.INT64, DType.FLOAT32],
      dict(mode="mul")), "mode"),
    (("scatter", [(3, 4), (2, 4), (2, 3)], [DType.FLOAT32, DType.INT64, DType.FLOAT32], {}), "one shape"),
    (("layer_norm", [(3, 4), (3,), (4,)], None, {}), "shape \\(4,\\)"),
    (("rms_norm", [(3, 4), (4,)], None, dict(eps=-1.0)), "eps"),
    (("attention", [(2, 4, 8), (2, 5, 7), (2, 5, 8)], None, {}), "attention: needs"),
])
def test_verifier_messages(args, msg):
    op, shapes, dtypes, attrs = args
    with pytest.raises(GraphError, match=msg):
        _bad(op, shapes, dtypes, **attrs)
