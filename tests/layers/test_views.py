"""Layout work that needs no kernel of its own: a reshape is a view of its operand's buffer,
a transpose feeding a library GEMM is read transposed by the library, a chain of layout ops
is one load, and an elementwise op joins the kernel of an earlier operand.  Every plan is
run on the device and checked against the graph's float64 reference and the plan compiled
without the ``views`` pass."""

from __future__ import annotations

import numpy as np
import pytest

from fornax.layers.compiler import KernelStep, LibraryStep
from fornax.layers.compiler import CompileOptions
from fornax.layers.graph import Graph
from fornax.layers.passes.fuse import fuse
from fornax.stack import compose, make_config

RNG = np.random.default_rng(7)
WITHOUT_VIEWS = CompileOptions(passes=("fold", "simplify", "layout", "cse", "dce", "fuse", "memplan"))


def _plan(stack, g, options=None):
    return stack.compiler.compile(g, stack.target, stack.library.ops(), options)


def _run_both(vendor, g, feeds):
    """The graph's outputs with and without the views pass, and both plans."""
    stack = compose(make_config(vendor))
    options = stack.compiler.options
    with_views = stack.run(g, feeds)
    stack.compiler.options = WITHOUT_VIEWS
    without = stack.run(g, feeds)
    for a, b, ref in zip(with_views.outputs, without.outputs, g.reference(feeds)):
        assert a.shape == ref.shape
        np.testing.assert_array_equal(a, b)          # the same products in the same order
        np.testing.assert_allclose(a, ref, rtol=1e-5, atol=1e-5)
    return _plan(stack, g, options), _plan(stack, g, WITHOUT_VIEWS)


def _linear_graph(batch_rows=8):
    """x[2, 4, 16] reshaped to rows, times w[32, 16] transposed (as nn.Linear lowers)."""
    g = Graph("linear")
    x = g.input("x", (2, batch_rows // 2, 16), "float32")
    w = g.input("w", (32, 16), "float32")
    rows = g.op("reshape", x, shape=(batch_rows, 16))
    y = g.op("matmul", rows, g.op("transpose", w, perm=(1, 0)))
    g.output(g.op("reshape", g.op("relu", y), shape=(2, batch_rows // 2, 32)))
    return g


@pytest.mark.parametrize("vendor", ["cuda-like", "rocm-like", "xpu-like"])
def test_a_linear_layer_launches_only_the_gemm_and_its_epilogue(vendor):
    g = _linear_graph()
    feeds = {"x": RNG.standard_normal((2, 4, 16)).astype(np.float32),
             "w": RNG.standard_normal((32, 16)).astype(np.float32)}
    plan, before = _run_both(vendor, g, feeds)
    kernels = [s for s in plan.steps if isinstance(s, KernelStep)]
    gemm = [s for s in plan.steps if isinstance(s, LibraryStep)]
    assert plan.buffers[plan.outputs[0]].shape == (2, 4, 32)
    if gemm:       # routed to the library: it reads the weight transposed
        assert len(gemm) == 1 and gemm[0].params.get("trans_b") is True
        assert "trans_a" not in gemm[0].params
        # the GEMM reads the input's buffer (the reshape is a view) and the weight's
        assert gemm[0].buffers["a"] == plan.inputs[0] and gemm[0].buffers["b"] == plan.inputs[1]
        # relu is the one kernel left; the output reshape is a view of its result
        assert [s.ops for s in kernels] == [("relu",)]
        assert any("views: 2 reshapes read in place, 1 transposes" in line for line in plan.log)
        assert len([s for s in before.steps if isinstance(s, KernelStep)]) == 4
    else:          # a generated GEMM reads row-major operands: the transpose stays a kernel
        assert [s.ops for s in kernels] == [("transpose",), ("matmul", "relu")]
        assert kernels[1].args["a"] == plan.inputs[0]
        assert len([s for s in before.steps if isinstance(s, KernelStep)]) == 4


def test_a_transposed_lhs_is_read_by_the_library_too():
    g = Graph("xtdy")
    x = g.input("x", (3, 8, 5), "float32")
    dy = g.input("dy", (3, 8, 6), "float32")
    g.output(g.op("matmul", g.op("transpose", x, perm=(0, 2, 1)), dy))
    feeds = {"x": RNG.standard_normal((3, 8, 5)).astype(np.float32),
             "dy": RNG.standard_normal((3, 8, 6)).astype(np.float32)}
    plan, _ = _run_both("rocm-like", g, feeds)
    (gemm,) = [s for s in plan.steps if isinstance(s, LibraryStep)]
    assert gemm.params["trans_a"] is True and gemm.buffers["a"] == plan.inputs[0]
    assert not [s for s in plan.steps if isinstance(s, KernelStep)]


def test_a_transpose_with_another_reader_is_still_a_kernel():
    g = Graph("shared")
    w = g.input("w", (6, 4), "float32")
    x = g.input("x", (5, 4), "float32")
    wt = g.op("transpose", w, perm=(1, 0))
    g.output(g.op("matmul", x, wt))
    g.output(g.op("exp", wt))
    feeds = {"w": RNG.standard_normal((6, 4)).astype(np.float32),
             "x": RNG.standard_normal((5, 4)).astype(np.float32)}
    plan, _ = _run_both("cuda-like", g, feeds)
    (gemm,) = [s for s in plan.steps if isinstance(s, LibraryStep)]
    assert "trans_b" not in gemm.params


def test_a_chain_of_layout_ops_is_one_load():
    g = Graph("heads")
    x = g.input("x", (1, 16, 24), "float32")
    q = g.op("slice", x, start=(0, 0, 8), stop=(1, 16, 16), step=(1, 1, 1))
    h = g.op("transpose", g.op("reshape", q, shape=(1, 16, 2, 4)), perm=(0, 2, 1, 3))
    g.output(g.op("mul", g.op("reshape", h, shape=(2, 16, 4)), g.constant(np.float32(0.5), "s")))
    groups = fuse(g, frozenset())
    assert [tuple(n.op for n in gr.nodes) for gr in groups] == [
        ("slice", "reshape", "transpose", "reshape", "mul")]
    feeds = {"x": RNG.standard_normal((1, 16, 24)).astype(np.float32)}
    plan, before = _run_both("xpu-like", g, feeds)
    assert plan.stats["kernels"] == 1
    assert before.stats["kernels"] == 1            # the chain is fusion's, not the views pass's


def test_an_operand_shared_by_two_layout_ops_is_read_by_both_kernels():
    g = Graph("split")
    x = g.input("x", (4, 6), "float32")
    a = g.op("slice", x, start=(0, 0), stop=(4, 3), step=(1, 1))
    b = g.op("slice", x, start=(0, 3), stop=(4, 6), step=(1, 1))
    g.output(g.op("transpose", g.op("add", g.op("exp", a), g.op("exp", b)), perm=(1, 0)))
    feeds = {"x": RNG.standard_normal((4, 6)).astype(np.float32)}
    _run_both("rocm-like", g, feeds)


def test_an_elementwise_op_joins_the_kernel_of_an_earlier_operand():
    g = Graph("late")
    x = g.input("x", (8, 8), "float32")
    y = g.input("y", (8, 8), "float32")
    a = g.op("exp", x)              # kernel over x
    b = g.op("tanh", y)             # another kernel, started after it
    g.output(g.op("neg", a))        # joins exp's kernel, which moves after tanh's
    g.output(b)
    groups = fuse(g, frozenset())
    assert [tuple(n.op for n in gr.nodes) for gr in groups] == [("tanh",), ("exp", "neg")]
    feeds = {"x": RNG.standard_normal((8, 8)).astype(np.float32),
             "y": RNG.standard_normal((8, 8)).astype(np.float32)}
    _run_both("cuda-like", g, feeds)


def test_a_kernel_read_by_a_later_one_does_not_move():
    g = Graph("pinned")
    x = g.input("x", (8, 8), "float32")
    a = g.op("exp", x)
    b = g.op("tanh", g.op("sqrt", g.op("abs", a)))     # a later kernel reads exp's value ...
    c = g.op("matmul", b, b)                             # (closes it)
    g.output(g.op("neg", a))                             # ... so neg cannot pull exp after it
    g.output(c)
    groups = fuse(g, frozenset({"matmul"}))
    assert [tuple(n.op for n in gr.nodes) for gr in groups][0] == ("exp", "abs", "sqrt", "tanh")
    order = [tuple(n.op for n in gr.nodes) for gr in groups]
    assert order.index(("neg",)) > order.index(("exp", "abs", "sqrt", "tanh"))
    feeds = {"x": RNG.standard_normal((8, 8)).astype(np.float32)}
    _run_both("rocm-like", g, feeds)
