"""Layout ops (transpose, reshape, broadcast_to) and reduce_mean: IR checks and device runs vs numpy."""

import numpy as np
import pytest

from fornax.layers.errors import GraphError
from fornax.layers.graph import DType, Graph
from fornax.stack import compose, make_config
from helpers import FAMILIES

VENDORS = list(FAMILIES)


def _graph():
    g = Graph("layout")
    x = g.input("x", (3, 5, 7), DType.FLOAT32)
    t = g.op("transpose", x, perm=(2, 0, 1))                 # (7, 3, 5)
    r = g.op("reshape", g.op("exp", t), shape=(7, -1))       # (7, 15), fused after exp? no: own kernel
    s = g.op("reduce_sum", g.op("transpose", r), axis=-1)    # (15, 1)
    b = g.op("broadcast_to", s, shape=(4, 15, 1))
    m = g.op("reduce_mean", x, axis=1, keepdims=False)       # (3, 7)
    g.output(t, r, s, b, m)
    return g, x


def test_inference_and_reference():
    g, _ = _graph()
    assert [v.shape for v in g.outputs] == [(7, 3, 5), (7, 15), (15, 1), (4, 15, 1), (3, 7)]
    x = np.random.default_rng(1).standard_normal((3, 5, 7))
    t, r, s, b, m = g.reference({"x": x})
    np.testing.assert_array_equal(t, x.transpose(2, 0, 1))
    np.testing.assert_allclose(r, np.exp(x.transpose(2, 0, 1)).reshape(7, 15))
    np.testing.assert_allclose(s[:, 0], np.exp(x.transpose(2, 0, 1)).reshape(7, 15).sum(axis=0))
    np.testing.assert_allclose(m, x.mean(axis=1))


@pytest.mark.parametrize("op,attrs,msg", [
    ("transpose", {"perm": (0, 0, 1)}, "not a permutation"),
    ("reshape", {"shape": (4, 4)}, "cannot reshape"),
    ("reshape", {"shape": (-1, -1)}, "at most one -1"),
    ("broadcast_to", {"shape": (2, 5, 7)}, "does not broadcast"),
])
def test_verifier_messages(op, attrs, msg):
    g = Graph("bad")
    x = g.input("x", (3, 5, 7), DType.FLOAT32)
    with pytest.raises(GraphError, match=msg):
        g.op(op, x, **attrs)


@pytest.mark.parametrize("vendor", VENDORS)
def test_layout_kernels_match_numpy(vendor):
    g, _ = _graph()
    x = np.random.default_rng(2).standard_normal((3, 5, 7)).astype(np.float32)
    stack = compose(make_config(vendor))
    res = stack.run(g, {"x": x})
    assert res.fallbacks == []                                # every layout op ran on the device
    e = np.exp(x.astype(np.float64).transpose(2, 0, 1))
    expect = [x.transpose(2, 0, 1), e.reshape(7, 15), e.reshape(7, 15).sum(axis=0)[:, None],
              np.broadcast_to(e.reshape(7, 15).sum(axis=0)[:, None], (4, 15, 1)), x.mean(axis=1)]
    for got, ref in zip(res.outputs, expect):
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vendor", VENDORS)
def test_transposed_matmul_operand(vendor):
    """The weight-gradient pattern: dW = X^T @ dY, with the transpose as its own kernel."""
    rng = np.random.default_rng(3)
    g = Graph("dw")
    x = g.input("x", (48, 32), DType.FLOAT32)
    dy = g.input("dy", (48, 24), DType.FLOAT32)
    g.output(g.op("matmul", g.op("transpose", x, perm=(1, 0)), dy))
    feeds = {"x": rng.standard_normal((48, 32)).astype(np.float32),
             "dy": rng.standard_normal((48, 24)).astype(np.float32)}
    (got,) = compose(make_config(vendor)).run(g, feeds).outputs
    ref = feeds["x"].astype(np.float64).T @ feeds["dy"]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
