"""Elementwise, comparison, ternary and reduction ops: inference, type promotion (against
torch's rules), verifier messages, and device runs on every family against numpy float64."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import erf as sp_erf

from helpers import FAMILIES, expect_graph_error
from fornax.layers.graph import DType, Graph, promote_types
from fornax.stack import compose, make_config

VENDORS = list(FAMILIES)
F32 = DType.FLOAT32
RNG = np.random.default_rng(11)


@pytest.fixture(scope="module", params=VENDORS)
def stack(request):
    return compose(make_config(request.param, spec="tiny"))


def _run(stack, g, feeds):
    res = stack.run(g, feeds)
    assert res.fallbacks == []                    # every op ran as a device kernel
    return res.outputs


# ---- unary ------------------------------------------------------------------------------------
X = RNG.uniform(-3.0, 3.0, (6, 9)).astype(np.float32)
X[0, :4] = [-2.5, -0.5, 0.5, 1.5]                # round half to even
XD = X.astype(np.float64)

UNARY_EXPECT = {                                  # independently written float64 formulas
    "erf": sp_erf(XD),
    "sin": np.sin(XD), "cos": np.cos(XD),
    "floor": np.floor(XD), "ceil": np.ceil(XD), "round": np.array([[float(round(v)) for v in r] for r in XD]),
    "sign": np.sign(XD), "reciprocal": 1.0 / XD,
    "gelu": XD * 0.5 * (1 + sp_erf(XD / math.sqrt(2))),
    "silu": XD / (1 + np.exp(-XD)),
}


def test_unary_ops_match_float64(stack):
    g = Graph("unary")
    x = g.input("x", X.shape, F32)
    names = list(UNARY_EXPECT)
    outs = [g.op(n, x) for n in names]
    tanh_gelu = g.op("gelu", x, approximate="tanh")
    isnan = g.op("isnan", g.op("log", x))
    lnot = g.op("logical_not", g.op("gt", x, g.constant(np.float32(0.0), "zero")))
    g.output(*outs, tanh_gelu, isnan, lnot)
    got = _run(stack, g, {"x": X})
    for name, out, ref in zip(names, got, g.reference({"x": X})):
        np.testing.assert_allclose(out.astype(np.float64), UNARY_EXPECT[name], rtol=2e-6, atol=2e-6,
                                   err_msg=name)
        np.testing.assert_allclose(ref, UNARY_EXPECT[name], rtol=1e-12, atol=1e-12, err_msg=name)
    t = 0.5 * XD * (1 + np.tanh(math.sqrt(2 / math.pi) * (XD + 0.044715 * XD ** 3)))
    np.testing.assert_allclose(got[len(names)], t, rtol=2e-6, atol=2e-6)
    assert got[-2].dtype == np.bool_ and (got[-2] == (XD < 0)).all()
    assert got[-1].dtype == np.bool_ and (got[-1] == (XD <= 0)).all()


def test_unary_on_integers(stack):
    g = Graph("iunary")
    i = g.input("i", (4, 5), DType.INT32)
    g.output(g.op("sign", i), g.op("floor", i), g.op("isnan", i), g.op("logical_not", i))
    iv = RNG.integers(-3, 4, (4, 5)).astype(np.int32)
    sgn, flo, nan, lnot = _run(stack, g, {"i": iv})
    assert sgn.dtype == np.int32 and (sgn == np.sign(iv)).all()
    assert (flo == iv).all() and not nan.any() and (lnot == (iv == 0)).all()


# ---- binary and ternary ------------------------------------------------------------------------
A = RNG.uniform(-4.0, 4.0, (5, 8)).astype(np.float32)
B = RNG.uniform(0.5, 3.0, (8,)).astype(np.float32) * np.where(RNG.random(8) < 0.5, -1, 1).astype(np.float32)
AD, BD = A.astype(np.float64), B.astype(np.float64)

BINARY_EXPECT = {
    "atan2": np.arctan2(AD, BD),
    "floor_divide": np.floor(AD / BD),
    "remainder": AD - np.floor(AD / BD) * BD,      # sign of the divisor
    "pow": np.abs(AD) ** BD,
}


def test_float_binary_ops_match_float64(stack):
    g = Graph("binary")
    a, b = g.input("a", A.shape, F32), g.input("b", B.shape, F32)
    outs = []
    for name in BINARY_EXPECT:
        outs.append(g.op(name, g.op("abs", a) if name == "pow" else a, b))
    cmp = [g.op(n, a, b) for n in ("lt", "le", "gt", "ge", "eq", "ne")]
    g.output(*outs, *cmp)
    got = _run(stack, g, {"a": A, "b": B})
    for name, out in zip(BINARY_EXPECT, got):
        np.testing.assert_allclose(out.astype(np.float64), BINARY_EXPECT[name], rtol=1e-5, atol=1e-5,
                                   err_msg=name)
    for out, fn in zip(got[len(BINARY_EXPECT):], (np.less, np.less_equal, np.greater,
                                                   np.greater_equal, np.equal, np.not_equal)):
        assert out.dtype == np.bool_ and (out == fn(AD, BD)).all()


def test_integer_and_bool_binary_ops(stack):
    iv = RNG.integers(-20, 20, (4, 6)).astype(np.int32)
    jv = RNG.integers(1, 7, (4, 6)).astype(np.int32) * np.where(RNG.random((4, 6)) < 0.5, -1, 1).astype(np.int32)
    pv = RNG.random((4, 6)) < 0.5
    qv = RNG.random((4, 6)) < 0.5
    g = Graph("ints")
    i, j = g.input("i", iv.shape, DType.INT32), g.input("j", jv.shape, DType.INT32)
    p, q = g.input("p", pv.shape, DType.BOOL), g.input("q", qv.shape, DType.BOOL)
    g.output(g.op("bitwise_and", i, j), g.op("bitwise_or", i, j), g.op("bitwise_xor", i, j),
             g.op("bitwise_and", p, q), g.op("bitwise_or", p, q), g.op("bitwise_xor", p, q),
             g.op("logical_and", i, p), g.op("logical_or", p, q),
             g.op("floor_divide", i, j), g.op("remainder", i, j), g.op("pow", g.op("abs", j), g.op("abs", j)))
    got = _run(stack, g, {"i": iv, "j": jv, "p": pv, "q": qv})
    ti, tj = torch.from_numpy(iv), torch.from_numpy(jv)
    tp, tq = torch.from_numpy(pv), torch.from_numpy(qv)
    expect = [ti & tj, ti | tj, ti ^ tj, tp & tq, tp | tq, tp ^ tq,
              torch.logical_and(ti, tp), torch.logical_or(tp, tq),
              torch.floor_divide(ti, tj), torch.remainder(ti, tj), tj.abs() ** tj.abs()]
    for k, (out, ref) in enumerate(zip(got, expect)):
        assert out.dtype == ref.numpy().dtype, k
        np.testing.assert_array_equal(out, ref.numpy(), err_msg=str(k))


def test_clamp_and_where_promote(stack):
    g = Graph("tern")
    x = g.input("x", (4, 6), F32)
    lo = g.input("lo", (6,), DType.INT32)
    hi = g.input("hi", (1,), DType.FLOAT16)
    c = g.op("clamp", x, lo, hi)
    w = g.op("where", g.op("gt", x, lo), lo, hi)   # int32 / float16 branches -> float16
    g.output(c, w)
    assert c.dtype is F32 and w.dtype is DType.FLOAT16
    xv = RNG.uniform(-4, 4, (4, 6)).astype(np.float32)
    lov = RNG.integers(-3, 1, (6,)).astype(np.int32)
    hiv = np.array([1.5], np.float16)
    cg, wg = _run(stack, g, {"x": xv, "lo": lov, "hi": hiv})
    tc = torch.clamp(torch.from_numpy(xv), torch.from_numpy(lov), torch.from_numpy(hiv))
    np.testing.assert_array_equal(cg, tc.numpy())
    tw = torch.where(torch.from_numpy(xv) > torch.from_numpy(lov), torch.from_numpy(lov), torch.from_numpy(hiv))
    assert wg.dtype == tw.numpy().dtype
    np.testing.assert_array_equal(wg, tw.numpy())


# ---- type promotion ------------------------------------------------------------------------------
TORCH = {DType.BOOL: torch.bool, DType.INT32: torch.int32, DType.INT64: torch.int64,
         DType.FLOAT16: torch.float16, DType.BFLOAT16: torch.bfloat16, DType.FLOAT32: torch.float32,
         DType.FLOAT64: torch.float64}
PAIRS = [(a, b) for a in TORCH for b in TORCH]


@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a.value}-{b.value}" for a, b in PAIRS])
def test_promotion_table_matches_torch(a, b):
    expect = torch.result_type(torch.ones(2, dtype=TORCH[a]), torch.ones(2, dtype=TORCH[b]))
    assert TORCH[promote_types(a, b)] == expect
    g = Graph("p")
    x, y = g.input("x", (2,), a), g.input("y", (2,), b)
    s = g.op("maximum", x, y)
    assert TORCH[s.dtype] == expect
    d = g.op("div", x, y)                          # true division: integers give float32
    assert TORCH[d.dtype] == torch.div(torch.ones(2, dtype=TORCH[a]), torch.ones(2, dtype=TORCH[b])).dtype
    assert TORCH[g.op("eq", x, y).dtype] == torch.bool
    # the kernels see one dtype: the builder inserted the casts
    for node in g.nodes:
        if node.op != "cast":
            assert len({v.dtype for v in node.inputs}) == 1


def test_promoted_values_match_torch(stack):
    iv = RNG.integers(-50, 50, (3, 4)).astype(np.int64)
    hv = RNG.uniform(-4, 4, (3, 4)).astype(np.float16)
    fv = RNG.uniform(1, 4, (4,)).astype(np.float32)
    pv = RNG.random((3, 4)) < 0.5
    g = Graph("promo")
    i, h = g.input("i", iv.shape, DType.INT64), g.input("h", hv.shape, DType.FLOAT16)
    f, p = g.input("f", fv.shape, F32), g.input("p", pv.shape, DType.BOOL)
    g.output(g.op("add", i, h), g.op("mul", h, f), g.op("div", i, p), g.op("sub", i, p),
             g.op("lt", i, h), g.op("add", p, p))
    got = _run(stack, g, {"i": iv, "h": hv, "f": fv, "p": pv})
    ti, th, tf, tp = (torch.from_numpy(v) for v in (iv, hv, fv, pv))
    with np.errstate(divide="ignore", invalid="ignore"):
        expect = [ti + th, th * tf, ti / tp, ti - tp.to(torch.int64), ti < th, tp + tp]
    for k, (out, ref) in enumerate(zip(got, expect)):
        ref = ref.numpy()
        assert out.dtype == ref.dtype, k
        np.testing.assert_allclose(out.astype(np.float64), ref.astype(np.float64), rtol=1e-3, err_msg=str(k))


# ---- reductions -----------------------------------------------------------------------------------
R = RNG.standard_normal((5, 11)).astype(np.float32)
R[2, 3] = R[2, 7] = R[2].max() + 1.0              # a tie: the first index wins
RD = R.astype(np.float64)


def test_reductions_match_float64(stack):
    g = Graph("red")
    x = g.input("x", R.shape, F32)
    i = g.input("i", R.shape, DType.INT32)
    g.output(g.op("reduce_min", x, axis=1), g.op("reduce_min", i, axis=0, keepdims=False),
             g.op("argmax", x, axis=1, keepdims=False), g.op("argmin", x, axis=0),
             g.op("argmax", i, axis=-1), g.op("var", x, axis=1), g.op("var", x, axis=0, correction=0,
                                                                    keepdims=False),
             g.op("reduce_mean", x, axis=1, keepdims=False), g.op("log_softmax", x, axis=-1),
             g.op("log_softmax", x, axis=0))
    iv = RNG.integers(-100, 100, R.shape).astype(np.int32)
    got = _run(stack, g, {"x": R, "i": iv})
    t = torch.from_numpy(RD)
    expect = [RD.min(axis=1, keepdims=True), iv.min(axis=0), np.argmax(RD, axis=1),
              np.argmin(RD, axis=0)[None], np.argmax(iv, axis=-1)[:, None],
              torch.var(t, dim=1, keepdim=True).numpy(), torch.var(t, dim=0, correction=0).numpy(),
              RD.mean(axis=1), torch.log_softmax(t, -1).numpy(), torch.log_softmax(t, 0).numpy()]
    assert got[2][2] == 3
    for k, (out, ref) in enumerate(zip(got, expect)):
        assert out.shape == ref.shape, k
        if ref.dtype.kind in "iu":
            assert out.dtype == (np.int64 if k in (2, 3, 4) else np.int32)
            np.testing.assert_array_equal(out, ref, err_msg=str(k))
        else:
            np.testing.assert_allclose(out.astype(np.float64), ref, rtol=1e-5, atol=1e-5, err_msg=str(k))


@settings(max_examples=12, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3), data=st.data())
def test_reductions_random_shapes(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    vendor = data.draw(st.sampled_from(VENDORS))
    xv = np.random.default_rng(len(shape) * 7 + axis).standard_normal(shape).astype(np.float32)
    g = Graph("hred")
    x = g.input("x", tuple(shape), F32)
    outs = [g.op("argmax", x, axis=axis), g.op("reduce_min", x, axis=axis, keepdims=False),
            g.op("log_softmax", x, axis=axis), g.op("gelu", x), g.op("clamp", x, x, x)]
    if shape[axis] > 1:
        outs.append(g.op("var", x, axis=axis))
    g.output(*outs)
    got = _STACKS[vendor].run(g, {"x": xv}).outputs
    for out, ref in zip(got, g.reference({"x": xv})):
        assert out.shape == ref.shape
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=1e-5, atol=1e-5)


_STACKS = {v: compose(make_config(v, spec="tiny")) for v in VENDORS}


# ---- verifier messages --------------------------------------------------------------------------
_err = expect_graph_error


def test_verifier_messages():
    g = Graph("bad")
    x = g.input("x", (4, 6), F32)
    i = g.input("i", (4, 6), DType.INT32)
    p = g.input("p", (4, 6), DType.BOOL)
    _err(lambda: g.op("bitwise_and", x, i), "bitwise_and", "integer or bool", "float32")
    _err(lambda: g.op("sub", p, p), "sub", "numeric", "bool")
    _err(lambda: g.op("erf", i), "erf", "floating-point", "int32")
    _err(lambda: g.op("floor", p), "floor", "numeric", "bool")
    _err(lambda: g.op("gelu", x, approximate="fast"), "gelu", "'none' or 'tanh'", "'fast'")
    _err(lambda: g.op("argmax", x, axis=2), "argmax", "axis 2", "rank 2")
    _err(lambda: g.op("argmin", p), "cannot reduce a bool")
    _err(lambda: g.op("var", x, axis=0, correction=4), "var", "correction 4", "size 4")
    _err(lambda: g.op("var", x, correction=-1), "non-negative int")
    _err(lambda: g.op("var", i), "var", "floating-point")
    _err(lambda: g.op("log_softmax", x, axis=3), "log_softmax", "axis 3")
    _err(lambda: g.op("clamp", x, g.input("lo", (5, 4, 6), F32), x), "clamp", "must broadcast to")
    _err(lambda: g.op("add", x, g.input("y", (5,), DType.INT32)), "do not broadcast")
    n = len(g.nodes)
    _err(lambda: g.op("add", i, g.input("z", (3,), F32)), "do not broadcast")
    assert len(g.nodes) == n                       # a failed op leaves no promotion casts behind


def test_isa_arg_reductions_encode_assemble_and_verify():
    from fornax.sim import isa
    from fornax.sim.faults import InvalidProgram
    body = (isa.Arange("%a", 8), isa.Convert("%f", "%a", "float32"),
            isa.Reduce("%m", "argmax", "%f", -1), isa.Reduce("%n", "argmin", "%f", -1),
            isa.Unary("%e", "erf", "%f"), isa.Unary("%q", "isnan", "%f"),
            isa.Binary("%t", "atan2", "%f", "%f"),
            isa.Load("%l", "x", "%a", "%q", 2))
    prog = isa.verify(isa.Program("k", (isa.Param("x", "ptr", "int32"),), body))
    assert isa.decode(isa.encode(prog)).body == body
    assert isa.assemble(isa.disassemble(prog)).body == body
    with pytest.raises(InvalidProgram, match="unknown reduction 'argfoo'"):
        isa.verify(isa.Program("k", (), (isa.Arange("%a", 4), isa.Reduce("%m", "argfoo", "%a", -1))))
    with pytest.raises(InvalidProgram, match="unknown reduction 'argmax'"):      # not a store_reduce
        isa.verify(isa.Program("k", (isa.Param("x", "ptr", "int64"),),
                               (isa.Arange("%a", 4), isa.StoreReduce("x", "%a", "%a", "argmax"))))
