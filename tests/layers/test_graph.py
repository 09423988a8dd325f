"""The graph IR: building, inference, errors, verification, references, decomposition."""

import ml_dtypes
import numpy as np
import pytest

from helpers import expect_graph_error
from fornax.layers.compiler import decompose
from fornax.layers.errors import GraphError
from fornax.layers.graph import OPS, DType, Graph, Node, TensorType, Value

F32 = DType.FLOAT32


def test_build_and_infer():
    g = Graph("mlp")
    x = g.input("x", (8, 16), F32)
    w = g.constant(np.ones((16, 4), np.float32), "w")
    b = g.input("b", (4,), "float32")
    h = g.op("matmul", x, w)
    assert h.type == TensorType((8, 4), F32)
    y = g.op("relu", g.op("add", h, b))
    assert y.shape == (8, 4) and y.dtype is F32
    s = g.op("reduce_sum", y, axis=0, keepdims=False)
    assert s.shape == (4,)
    s2 = g.op("reduce_max", y, axis=-1)
    assert s2.shape == (8, 1)
    c = g.op("lt", y, g.op("neg", y))
    assert c.dtype is DType.BOOL and c.shape == (8, 4)
    wv = g.op("where", c, y, h)
    assert wv.shape == (8, 4)
    cst = g.op("cast", y, dtype="bfloat16")
    assert cst.dtype is DType.BFLOAT16 and cst.type.nbytes == 64
    bm = g.op("matmul", g.input("p", (3, 5, 6), F32), g.input("q", (3, 6, 2), F32))
    assert bm.shape == (3, 5, 2)
    bm2 = g.op("matmul", g.input("p", (3, 5, 6), F32), g.input("r", (6, 7), F32))
    assert bm2.shape == (3, 5, 7)
    g.output(y, s)
    assert g.verify() is g
    assert len(g.nodes) == 11
    assert "matmul" in str(g) and "%x" in str(g)
    # names are unique even when asked twice
    assert len({v.name for v in g.inputs}) == len(g.inputs)


def test_dtype_helpers():
    assert DType.of(np.float16) is DType.FLOAT16
    assert DType.of(np.zeros(2, ml_dtypes.bfloat16)) is DType.BFLOAT16
    assert DType.of("int32") is DType.INT32
    assert DType.BFLOAT16.itemsize == 2 and DType.FLOAT64.itemsize == 8
    with pytest.raises(GraphError, match="unknown dtype 'float7'"):
        DType.of("float7")
    with pytest.raises(GraphError, match="complex128"):
        DType.of(np.complex128)


_err = expect_graph_error


def test_graph_errors():
    g = Graph()
    a = g.input("a", (4, 3), F32)
    b = g.input("b", (5,), F32)
    h = g.input("h", (4, 3), DType.FLOAT16)
    i = g.input("i", (4, 3), DType.INT32)
    e = _err(lambda: g.op("add", a, b), "add", "(4, 3)", "(5,)", "do not broadcast")
    assert e.op == "add"
    assert g.op("mul", a, h).dtype is F32          # promotion: the builder casts h to float32
    assert g.nodes[-2].op == "cast" and g.nodes[-2].inputs[0] is h
    bad = Value(TensorType((4, 3), F32), "bad")
    g.nodes.append(Node("mul", (a, h), (bad,)))     # a hand-built node without the cast
    _err(g.verify, "mul", "float16", "float32", "dtypes differ")
    del g.nodes[-3:]
    _err(lambda: g.op("matmul", a, g.input("w", (4, 2), F32)), "contracting", "3 != 4")
    _err(lambda: g.op("matmul", g.input("p", (2, 4, 3), F32), g.input("q", (5, 3, 2), F32)),
         "batch dims differ")
    _err(lambda: g.op("matmul", b, a), "rank 2 or 3")
    _err(lambda: g.op("matmul", i, i), "floating-point")
    _err(lambda: g.op("exp", i), "exp", "floating-point", "int32")
    _err(lambda: g.op("reduce_sum", a, axis=2), "axis 2", "rank 2")
    _err(lambda: g.op("reduce_sum", a, axis=-3), "axis -3")
    _err(lambda: g.op("softmax", a, axis=5), "axis 5")
    _err(lambda: g.op("reduce_max", a, axis="0"), "axis")
    _err(lambda: g.op("conv9d", a), "unknown op 'conv9d'", "matmul")
    _err(lambda: g.op("relu", a, alpha=0.1), "relu", "unknown attribute", "alpha")
    _err(lambda: g.op("add", a, np.ones((4, 3), np.float32)), "graph values", "ndarray")
    _err(lambda: g.op("add", a), "takes 2 operand(s), got 1")
    _err(lambda: g.op("where", a, a, a), "condition must be bool")
    _err(lambda: g.op("reduce_sum", g.op("lt", a, a)), "bool")
    _err(lambda: g.input("z", (3, 0), F32), "positive")
    assert g.nodes == [n for n in g.nodes if n.op == "lt"]       # failed ops add no nodes


def test_verify_catches_use_before_definition():
    g = Graph("g")
    x = g.input("x", (2,), F32)
    other = Graph("other")
    stray = other.input("stray", (2,), F32)
    y = g.op("add", x, stray)                   # built, but stray is not defined in g
    g.output(y)
    _err(g.verify, "node 0", "add", "%stray", "before it is defined")


def test_verify_catches_non_ssa():
    g = Graph("g")
    x = g.input("x", (2,), F32)
    y = g.op("exp", x)
    g.nodes.append(Node("neg", (x,), (y,)))     # defines %y a second time
    g.output(y)
    _err(g.verify, "node 1", "redefines", f"%{y.name}", "not SSA")


def test_verify_catches_wrong_declared_type_and_missing_outputs():
    g = Graph("g")
    x = g.input("x", (2,), F32)
    bogus = Value(TensorType((3,), F32), "bogus")
    node = Node("exp", (x,), (bogus,))
    bogus.producer = node
    g.nodes.append(node)
    g.output(bogus)
    _err(g.verify, "declares", "inference gives")
    h = Graph("empty")
    h.input("x", (2,), F32)
    _err(h.verify, "no outputs")
    k = Graph("k")
    k.input("x", (2,), F32)
    k.output(Value(TensorType((2,), F32), "ghost"))
    _err(k.verify, "%ghost", "never defined")
    m = Graph("m")
    xm = m.input("x", (2,), F32)
    m.nodes.append(Node("teleport", (xm,), (Value(TensorType((2,), F32), "t"),)))
    _err(m.verify, "unknown op 'teleport'")


# ---- references ----------------------------------------------------------------------
RNG = np.random.default_rng(7)
A = RNG.uniform(0.5, 2.0, (3, 4))
B = RNG.uniform(-2.0, 2.0, (3, 4))
ROW = RNG.uniform(-1.0, 1.0, (4,))

UNARY_REF = {
    "neg": lambda x: -x, "abs": lambda x: np.sqrt(x * x), "exp": lambda x: np.e ** x,
    "log": lambda x: np.log2(x) / np.log2(np.e), "tanh": lambda x: (np.exp(2 * x) - 1) / (np.exp(2 * x) + 1),
    "sqrt": lambda x: x ** 0.5, "rsqrt": lambda x: x ** -0.5, "relu": lambda x: np.where(x > 0, x, 0.0),
    "sigmoid": lambda x: 0.5 * (1 + np.tanh(x / 2)),
}
BINARY_REF = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "maximum": lambda a, b: np.where(a > b, a, b),
    "minimum": lambda a, b: np.where(a < b, a, b), "lt": lambda a, b: a < b,
    "gt": lambda a, b: a > b, "eq": lambda a, b: a == b,
}


def _ref(build, feeds, dtype=np.float32):
    g = Graph()
    vals = [g.input(k, v.shape, DType.of(np.dtype(dtype))) for k, v in feeds.items()]
    g.output(build(g, *vals))
    g.verify()
    (out,) = g.reference({k: v.astype(dtype) for k, v in feeds.items()})
    return out, g


@pytest.mark.parametrize("op", sorted(UNARY_REF))
def test_unary_reference(op):
    x = A if op in ("log", "sqrt", "rsqrt") else B
    out, _ = _ref(lambda g, v: g.op(op, v), {"x": x}, np.float64)
    np.testing.assert_allclose(out, UNARY_REF[op](x), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("op", sorted(BINARY_REF))
def test_binary_reference_with_broadcast(op):
    b = B.copy()
    b[0, :] = A[0, :]                                # make some elements equal
    out, _ = _ref(lambda g, x, y: g.op(op, x, y), {"x": A, "y": b}, np.float64)
    np.testing.assert_allclose(out, BINARY_REF[op](A, b), rtol=1e-12)
    out, _ = _ref(lambda g, x, y: g.op(op, x, y), {"x": A, "y": ROW}, np.float64)
    assert out.shape == (3, 4)
    np.testing.assert_allclose(out, BINARY_REF[op](A, ROW[None, :]), rtol=1e-12)


def test_reference_computes_in_float64():
    x = np.array([1.0, 1e-8], np.float32)
    out, _ = _ref(lambda g, v: g.op("sub", g.op("add", v, v), v), {"x": x})
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, x.astype(np.float64))
    xb = np.array([1.5, 3.0], ml_dtypes.bfloat16)
    out, _ = _ref(lambda g, v: g.op("mul", v, v), {"x": xb}, ml_dtypes.bfloat16)
    np.testing.assert_array_equal(out, [2.25, 9.0])


def test_where_cast_reduce_matmul_references():
    out, _ = _ref(lambda g, a, b: g.op("where", g.op("gt", a, b), a, b), {"a": A, "b": B}, np.float64)
    np.testing.assert_array_equal(out, np.where(A > B, A, B))
    out, _ = _ref(lambda g, a: g.op("cast", a, dtype="int32"), {"a": B * 3}, np.float64)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, np.trunc(B * 3))
    out, _ = _ref(lambda g, a: g.op("cast", a, dtype=DType.FLOAT16), {"a": B}, np.float64)
    assert out.dtype == np.float64
    for axis, keep in [(0, True), (1, False), (-1, True)]:
        out, _ = _ref(lambda g, a: g.op("reduce_sum", a, axis=axis, keepdims=keep), {"a": B}, np.float64)
        exp = np.add.reduce(B, axis=axis, keepdims=keep)
        assert out.shape == exp.shape
        np.testing.assert_allclose(out, exp, rtol=1e-12)
        out, _ = _ref(lambda g, a: g.op("reduce_max", a, axis=axis, keepdims=keep), {"a": B}, np.float64)
        np.testing.assert_array_equal(out, np.maximum.reduce(B, axis=axis, keepdims=keep))
    out, _ = _ref(lambda g, a, b: g.op("matmul", a, b), {"a": A, "b": B.T.copy()}, np.float64)
    exp = np.array([[sum(A[i, k] * B[j, k] for k in range(4)) for j in range(3)] for i in range(3)])
    np.testing.assert_allclose(out, exp, rtol=1e-12)
    p, q = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((2, 4, 5))
    out, _ = _ref(lambda g, a, b: g.op("matmul", a, b), {"a": p, "b": q}, np.float64)
    np.testing.assert_allclose(out, np.einsum("bik,bkj->bij", p, q), rtol=1e-12)


def _softmax64(x, axis):
    m = x.max(axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_reference_and_decomposition(axis):
    x = RNG.standard_normal((5, 6)) * 4
    x[0, 0] = 800.0                                  # overflows a naive exp
    out, g = _ref(lambda g, v: g.op("softmax", v, axis=axis), {"x": x}, np.float64)
    np.testing.assert_allclose(out, _softmax64(x, axis), rtol=1e-12)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out.sum(axis=axis), 1.0, rtol=1e-12)
    d = decompose(g)
    d.verify()
    primitive = {name for name, op in OPS.items() if op.kind != "composite"}
    assert [n.op for n in d.nodes] == ["reduce_max", "sub", "exp", "reduce_sum", "div"]
    assert all(n.op in primitive for n in d.nodes)
    assert d.nodes[0].attrs["axis"] == axis
    (dout,) = d.reference({"x": x})
    np.testing.assert_allclose(dout, out, rtol=1e-12)
    # keep= leaves the composite alone
    assert [n.op for n in decompose(g, keep=frozenset({"softmax"})).nodes] == ["softmax"]


def test_decompose_preserves_other_ops_and_constants():
    g = Graph("g")
    x = g.input("x", (2, 3), F32)
    c = g.constant(np.full((3,), 2.0, np.float32), "two")
    g.output(g.op("softmax", g.op("mul", x, c)), g.op("exp", x))
    d = decompose(g)
    d.verify()
    assert len(d.outputs) == 2 and len(d.constants) == 1
    feeds = {"x": RNG.standard_normal((2, 3)).astype(np.float32)}
    for u, v in zip(g.reference(feeds), d.reference(feeds)):
        np.testing.assert_allclose(u, v, rtol=1e-12)


def test_every_op_has_a_reference_test():
    covered = set(UNARY_REF) | set(BINARY_REF) | {"where", "cast", "reduce_sum", "reduce_max",
                                                   "matmul", "softmax"}
    # layout ops and reduce_mean: tests/layers/test_layout_ops.py; all_reduce: tests/test_meta.py
    covered |= {"transpose", "reshape", "broadcast_to", "reduce_mean", "all_reduce"}
    # tests/layers/test_ops_elementwise.py and tests/layers/test_ops_layout.py
    covered |= {"erf", "sin", "cos", "floor", "ceil", "round", "sign", "reciprocal", "logical_not",
                "isnan", "gelu", "silu", "le", "ge", "ne", "pow", "atan2", "floor_divide", "remainder",
                "logical_and", "logical_or", "bitwise_and", "bitwise_or", "bitwise_xor", "clamp",
                "reduce_min", "argmax", "argmin", "var", "log_softmax", "iota", "slice", "concat", "pad"}
    # tests/layers/test_ops_nn.py and tests/layers/test_rng.py
    covered |= {"dot_general", "convolution", "conv_transpose", "im2col", "gather", "index_select",
                "scatter", "random_bits", "random_uniform", "random_normal", "layer_norm", "rms_norm",
                "attention"}
    assert covered == set(OPS)
