"""Fusion, group I/O and generated kernels executed on the simulated device."""

import math

import ml_dtypes
import numpy as np
import pytest

from fornax.layers import codegen
from fornax.layers.compiler import decompose, fuse, group_io
from fornax.layers.graph import DType, Graph
from fornax.sim.device import Device
from fornax.sim.spec import load_spec

F32 = DType.FLOAT32
RNG = np.random.default_rng(11)


def mlp_graph(m=6, k=5, n=7):
    g = Graph("mlp")
    x = g.input("x", (m, k), F32)
    w = g.input("w", (k, n), F32)
    b = g.input("b", (n,), F32)
    h = g.op("matmul", x, w)
    y = g.op("relu", g.op("add", h, b))
    g.output(y)
    return g, (x, w, b, h, y)


def test_bias_relu_after_library_matmul_fuse_into_one_pointwise_group():
    g, (x, w, b, h, y) = mlp_graph()
    groups = fuse(g, frozenset({"matmul"}))
    assert [grp.kind for grp in groups] == ["library", "pointwise"]
    assert [n.op for n in groups[1].nodes] == ["add", "relu"]
    assert groups[1].space == (6, 7)
    io = group_io(g, groups)
    assert io[0] == ([x, w], [h])
    ins, outs = io[1]
    assert ins == [h, b] and outs == [y]


def test_bias_relu_fuse_into_gemm_epilogue_without_library():
    g, (x, w, b, h, y) = mlp_graph()
    groups = fuse(g, frozenset())
    assert len(groups) == 1 and groups[0].kind == "gemm"
    assert [n.op for n in groups[0].nodes] == ["matmul", "add", "relu"]
    assert group_io(g, groups) == [([x, w, b], [y])]


def test_softmax_decomposes_into_one_reduction_group():
    g = Graph("sm")
    x = g.input("x", (4, 9), F32)
    g.output(g.op("softmax", x, axis=-1))
    d = decompose(g)
    groups = fuse(d, frozenset())
    assert len(groups) == 1
    assert groups[0].kind == "reduction" and groups[0].axis == 1 and groups[0].space == (4, 9)
    assert [n.op for n in groups[0].nodes] == ["reduce_max", "sub", "exp", "reduce_sum", "div"]
    ((ins, outs),) = group_io(d, groups)
    assert ins == [d.inputs[0]] and outs == d.outputs


def test_intermediate_used_outside_group_is_live_out():
    g = Graph("g")
    x = g.input("x", (3, 4), F32)
    e = g.op("exp", x)
    s = g.op("reduce_sum", e, axis=-1, keepdims=False)   # closes the group
    t = g.op("add", e, x)                                # a new group that reads e
    g.output(s, t)
    groups = fuse(g, frozenset())
    assert [grp.kind for grp in groups] == ["reduction", "pointwise"]
    io = group_io(g, groups)
    assert io[0] == ([x], [e, s])
    assert io[1][0] == [e, x] and io[1][1] == [t]


def test_different_shapes_start_new_groups():
    g = Graph("g")
    x = g.input("x", (3, 4), F32)
    y = g.input("y", (2,), F32)
    a = g.op("exp", x)
    b = g.op("neg", y)
    g.output(a, b)
    assert [len(grp.nodes) for grp in fuse(g, frozenset())] == [1, 1]


# ---- generated kernels on the device -------------------------------------------------
@pytest.fixture
def dev():
    return Device(load_spec("tiny"))


def run_group(dev, graph, group, ins, outs, feeds, block=64):
    """Generate the group's kernel, run it on the device, return the outputs' arrays."""
    space = dev.memory.create_space()
    if group.kind == "pointwise":
        prog, grid = codegen.pointwise_kernel("k", group.nodes, ins, outs, group.space, block, 128)
    else:
        assert group.kind == "reduction"
        prog, grid = codegen.reduction_kernel("k", group.nodes, ins, outs, group.space,
                                              group.axis, 128)
    args = {}
    for i, v in enumerate(ins):
        arr = np.ascontiguousarray(feeds[v.name]).astype(v.dtype.numpy)
        m = space.map(arr.nbytes)
        space.write(m.va, arr.tobytes())
        args[f"in{i}"] = m.va
    for i, v in enumerate(outs):
        args[f"out{i}"] = space.map(v.type.nbytes).va
    dev.run_kernel(space, prog, grid, args)
    return [np.frombuffer(space.read(args[f"out{i}"], v.type.nbytes), dtype=v.dtype.numpy)
            .reshape(v.shape) for i, v in enumerate(outs)]


def compile_and_run(dev, g, feeds, block=64, rtol=1e-5, atol=1e-6):
    d = decompose(g)
    groups = fuse(d, frozenset())
    assert len(groups) == 1, [grp.kind for grp in groups]
    ((ins, outs),) = group_io(d, groups)
    got = run_group(dev, d, groups[0], ins, outs, feeds, block)
    refs = g.reference(feeds)
    for out, ref in zip(got, refs):
        assert out.shape == ref.shape
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=rtol, atol=atol)
    return got


@pytest.mark.parametrize("other_shape", [(7,), (5, 1), (1,), (5, 7), (1, 7)],
                         ids=["row", "column", "scalar", "full", "row2d"])
def test_pointwise_broadcasting_inputs(dev, other_shape):
    g = Graph("pw")
    x = g.input("x", (5, 7), F32)
    o = g.input("o", other_shape, F32)
    y = g.op("sigmoid", g.op("mul", g.op("add", x, o), o))
    g.output(y)
    feeds = {"x": RNG.standard_normal((5, 7)).astype(np.float32),
             "o": RNG.standard_normal(other_shape).astype(np.float32)}
    compile_and_run(dev, g, feeds, block=16)              # 35 elements: a ragged last block


def test_pointwise_broadcast_into_3d_and_where(dev):
    g = Graph("pw3")
    x = g.input("x", (3, 4, 5), F32)
    col = g.input("col", (4, 1), F32)
    b = g.input("b", (5,), F32)
    t = g.op("add", x, col)
    y = g.op("where", g.op("gt", t, b), t, g.op("neg", t))
    g.output(y, g.op("maximum", y, col))
    feeds = {"x": RNG.standard_normal((3, 4, 5)).astype(np.float32),
             "col": RNG.standard_normal((4, 1)).astype(np.float32),
             "b": RNG.standard_normal((5,)).astype(np.float32)}
    compile_and_run(dev, g, feeds, block=32)


def test_pointwise_low_precision_and_cast(dev):
    g = Graph("pwbf")
    x = g.input("x", (50,), DType.BFLOAT16)
    y = g.op("cast", g.op("exp", x), dtype="float32")
    g.output(y)
    xb = RNG.uniform(-2, 2, 50).astype(ml_dtypes.bfloat16)
    (out,) = compile_and_run(dev, g, {"x": xb}, rtol=2 ** -7)
    assert out.dtype == np.float32


@pytest.mark.parametrize("shape, axis", [((6, 10), 0), ((6, 10), 1), ((3, 5, 4), 1),
                                         ((3, 5, 4), 0), ((9, 16), 1)])
@pytest.mark.parametrize("keepdims", [True, False])
def test_reduction_over_any_axis(dev, shape, axis, keepdims):
    g = Graph("red")
    x = g.input("x", shape, F32)
    s = g.op("reduce_sum", g.op("exp", x), axis=axis, keepdims=keepdims)
    g.output(s)
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    (out,) = compile_and_run(dev, g, feeds)
    exp = np.exp(feeds["x"].astype(np.float64)).sum(axis=axis, keepdims=keepdims)
    np.testing.assert_allclose(out, exp, rtol=1e-5)


@pytest.mark.parametrize("shape, axis", [((4, 9), -1), ((7, 5), 0), ((2, 3, 6), 1), ((3, 32), 1)])
def test_softmax_kernel(dev, shape, axis):
    g = Graph("sm")
    x = g.input("x", shape, F32)
    g.output(g.op("softmax", x, axis=axis))
    xv = (RNG.standard_normal(shape) * 5).astype(np.float32)
    xv.flat[0] = 90.0                                     # exp overflows fp32 without the max shift
    (out,) = compile_and_run(dev, g, {"x": xv})
    x64 = xv.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=axis, keepdims=True), rtol=1e-5, atol=1e-7)


def test_reduce_max_with_negative_inputs_masks_padding(dev):
    # 5 is not a power of two: padded lanes must not contribute 0 to a max of negatives
    g = Graph("mx")
    x = g.input("x", (4, 5), F32)
    g.output(g.op("reduce_max", x, axis=1))
    xv = -RNG.uniform(1, 2, (4, 5)).astype(np.float32)
    (out,) = compile_and_run(dev, g, {"x": xv})
    np.testing.assert_array_equal(out, xv.max(axis=1, keepdims=True))


def test_row_norm_with_broadcast_input(dev):
    # x / sum(x, axis=-1) * gamma  (gamma is a per-column [N] vector)
    g = Graph("norm")
    x = g.input("x", (5, 6), F32)
    gamma = g.input("gamma", (6,), F32)
    s = g.op("reduce_sum", g.op("mul", x, x), axis=-1)
    y = g.op("mul", g.op("mul", x, g.op("rsqrt", s)), gamma)
    g.output(y)
    feeds = {"x": RNG.standard_normal((5, 6)).astype(np.float32),
             "gamma": RNG.standard_normal(6).astype(np.float32)}
    compile_and_run(dev, g, feeds)


def test_gemm_epilogue_kernel(dev):
    g, (x, w, b, h, y) = mlp_graph(m=19, k=13, n=11)
    ((ins, outs),) = group_io(g, fuse(g, frozenset()))
    group = fuse(g, frozenset())[0]
    extra = [v for v in ins if v is not x and v is not w]
    prog, grid = codegen.gemm_kernel("mlp", F32, 19, 11, 13, 1, False, (16, 16, 16), 128,
                                     epilogue=group.nodes[1:], product=h, extra_inputs=extra,
                                     outputs=outs)
    space = dev.memory.create_space()
    feeds = {"x": RNG.standard_normal((19, 13)).astype(np.float32),
             "w": RNG.standard_normal((13, 11)).astype(np.float32),
             "b": RNG.standard_normal(11).astype(np.float32)}
    args = {}
    for name, arr in (("a", feeds["x"]), ("b", feeds["w"]), ("in0", feeds["b"])):
        m = space.map(arr.nbytes)
        space.write(m.va, arr.tobytes())
        args[name] = m.va
    args["out0"] = space.map(19 * 11 * 4).va
    counters, _ = dev.run_kernel(space, prog, grid, args)
    out = np.frombuffer(space.read(args["out0"], 19 * 11 * 4), np.float32).reshape(19, 11)
    x64, w64 = feeds["x"].astype(np.float64), feeds["w"].astype(np.float64)
    ref = np.maximum(x64 @ w64 + feeds["b"].astype(np.float64), 0)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    assert grid == (1, 2, 1)
    assert counters.bytes_written == 19 * 11 * 4


def test_helpers():
    assert codegen.strides((2, 3, 4)) == (12, 4, 1)
    assert codegen.strides(()) == ()
    assert [codegen.next_pow2(n) for n in (1, 2, 3, 5, 64, 65)] == [1, 2, 4, 8, 64, 128]
    assert math.prod((2, 3)) == 6


def test_gemm_tile_must_be_a_multiple_of_the_matrix_instruction_shape():
    import copy

    from fornax.layers.errors import ConfigError
    from fornax.vendors.rocm_like import FACTS, RocmLikeCompiler

    facts = copy.deepcopy(FACTS)
    facts["compiler"]["gemm_tiles"] = [[64, 64, 32], [48, 64, 32]]   # 48 is not a multiple of MFMA's 32
    bad = type("BadTile", (RocmLikeCompiler,), {"facts": facts})
    with pytest.raises(ConfigError, match=r"not a multiple of the matrix instruction shape \(32, 32, 8\)"):
        bad()
    RocmLikeCompiler()                                      # the shipped tiles are consistent
