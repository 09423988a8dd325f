"""slice, pad, concat and iota: inference, verifier messages, and device kernels (loads through
remapped indices with masks) on every family against numpy."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import FAMILIES, expect_graph_error
from fornax.layers.graph import DType, Graph
from fornax.stack import compose, make_config

VENDORS = list(FAMILIES)
F32 = DType.FLOAT32
RNG = np.random.default_rng(5)
STACKS = {v: compose(make_config(v, spec="tiny")) for v in VENDORS}


def _run(vendor, g, feeds):
    res = STACKS[vendor].run(g, feeds)
    assert res.fallbacks == []
    return res.outputs


@pytest.mark.parametrize("vendor", VENDORS)
def test_layout_ops_match_numpy(vendor):
    xv = RNG.standard_normal((4, 6, 5)).astype(np.float32)
    yv = RNG.standard_normal((4, 2, 5)).astype(np.float32)
    iv = RNG.integers(-9, 9, (4, 3, 5)).astype(np.int32)
    g = Graph("layout")
    x, y, i = g.input("x", xv.shape, F32), g.input("y", yv.shape, F32), g.input("i", iv.shape, DType.INT32)
    s1 = g.op("slice", x, start=(1, 0, -4), stop=(4, 6, 5), step=(2, 3, 1))
    s2 = g.op("exp", g.op("slice", x, start=(0, 2, 0), stop=(-1, 3, 5)))        # fused consumer
    p1 = g.op("pad", x, pads=((1, 0), (0, 2), (3, 1)), value=-7.25)
    p2 = g.op("pad", i, pads=((0, 0), (2, 2), (0, 0)), value=4)
    c1 = g.op("concat", x, y, i, axis=1)                 # int32 operand promoted to float32
    c2 = g.op("concat", y, y, axis=-1)
    io = g.op("iota", shape=(3, 7), axis=1)
    io2 = g.op("add", g.op("iota", shape=(4, 6, 5), axis=0, dtype="float32"), x)
    g.output(s1, s2, p1, p2, c1, c2, io, io2)
    assert c1.dtype is F32 and p2.dtype is DType.INT32 and io.dtype is DType.INT64
    got = _run(vendor, g, {"x": xv, "y": yv, "i": iv})
    expect = [xv[1:4:2, 0:6:3, -4:5], np.exp(xv[0:-1, 2:3, :].astype(np.float64)),
              np.pad(xv, ((1, 0), (0, 2), (3, 1)), constant_values=-7.25),
              np.pad(iv, ((0, 0), (2, 2), (0, 0)), constant_values=4),
              np.concatenate([xv, yv, iv.astype(np.float32)], axis=1), np.concatenate([yv, yv], axis=2),
              np.broadcast_to(np.arange(7), (3, 7)), np.arange(4)[:, None, None] + xv.astype(np.float64)]
    for k, (out, ref, gref) in enumerate(zip(got, expect, g.reference({"x": xv, "y": yv, "i": iv}))):
        assert out.shape == ref.shape, k
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=1e-6, err_msg=str(k))
        np.testing.assert_allclose(gref, ref, rtol=1e-6, err_msg=str(k))
    assert got[3].dtype == np.int32 and got[6].dtype == np.int64


def test_pad_and_concat_move_only_their_bytes():
    """A masked load reads only the source lanes: the kernel's counted reads are the inputs' bytes."""
    g = Graph("bytes")
    x = g.input("x", (8, 8), F32)
    g.output(g.op("pad", x, pads=((4, 4), (0, 8))))
    res = STACKS["rocm-like"].run(g, {"x": np.ones((8, 8), np.float32)})
    est = next(iter(res.plans[0].programs.values())).meta["estimate"]
    assert est["bytes_read"] == 8 * 8 * 4 and est["bytes_written"] == 16 * 16 * 4
    assert res.outputs[0].sum() == 64.0


@settings(max_examples=15, deadline=None)
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=3), data=st.data())
def test_slice_pad_concat_random(shape, data):
    rank = len(shape)
    start, stop, step, pads = [], [], [], []
    for n in shape:
        a = data.draw(st.integers(0, n - 1))
        start.append(a)
        stop.append(data.draw(st.integers(a + 1, n)))
        step.append(data.draw(st.integers(1, 3)))
        pads.append((data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3))))
    axis = data.draw(st.integers(-rank, rank - 1))
    other = list(shape)
    other[axis] = data.draw(st.integers(1, 4))
    vendor = data.draw(st.sampled_from(VENDORS))
    xv = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    ov = np.random.default_rng(rank).standard_normal(other).astype(np.float32)
    g = Graph("h")
    x, o = g.input("x", tuple(shape), F32), g.input("o", tuple(other), F32)
    g.output(g.op("slice", x, start=tuple(start), stop=tuple(stop), step=tuple(step)),
             g.op("pad", x, pads=tuple(pads), value=2.5), g.op("concat", o, x, o, axis=axis))
    got = _run(vendor, g, {"x": xv, "o": ov})
    expect = [xv[tuple(slice(a, b, s) for a, b, s in zip(start, stop, step))],
              np.pad(xv, pads, constant_values=2.5), np.concatenate([ov, xv, ov], axis=axis)]
    for out, ref in zip(got, expect):
        np.testing.assert_array_equal(out, ref)


_err = expect_graph_error


def test_verifier_messages():
    g = Graph("bad")
    x = g.input("x", (4, 6), F32)
    _err(lambda: g.op("slice", x, start=(0, 2), stop=(5, 6)), "slice", "[0:5] in dim 0", "size 4")
    _err(lambda: g.op("slice", x, start=(3, 0), stop=(3, 6)), "out of range or empty")
    _err(lambda: g.op("slice", x, start=(0, -7), stop=(4, 6)), "dim 1")
    _err(lambda: g.op("slice", x, start=(0, 0), stop=(4, 6), step=(1, 0)), "step 0", "positive")
    _err(lambda: g.op("slice", x, start=(0,)), "start must be a tuple of 2 ints")
    _err(lambda: g.op("concat", x, g.input("y", (4, 5), F32), axis=0), "concat", "operand 1", "(4, 5)",
         "but axis 0")
    _err(lambda: g.op("concat", x, g.input("z", (4,), F32), axis=1), "concat", "operand 1")
    _err(lambda: g.op("concat", x, axis=2), "concat", "axis 2", "rank 2")
    _err(lambda: g.op("concat"), "one or more operands")
    _err(lambda: g.op("pad", x, pads=((0, 1), (-1, 0))), "pad", "negative", "dim 1")
    _err(lambda: g.op("pad", x, pads=((0, 1),)), "2 pairs")
    _err(lambda: g.op("pad", g.input("i", (3,), DType.INT32), pads=((1, 1),), value=0.5), "not representable")
    _err(lambda: g.op("iota", shape=(3, 0)), "iota", "positive ints")
    _err(lambda: g.op("iota", shape=(3, 4), axis=2), "iota", "axis 2")
    _err(lambda: g.op("iota", shape=(3,), dtype="bool"), "numeric")
    _err(lambda: g.op("iota", shape=(300,), dtype="float16"), "float16", "300")


def test_static_estimates_match_execution(monkeypatch):
    """Shape-only runs price kernels from their static estimate: it must count what executing does."""
    from fornax.sim import device
    seen = []
    real = device.execute

    def spy(program, grid, args, space, replays=None):
        c = real(program, grid, args, space, replays)
        seen.append((program.meta["estimate"], c))
        return c
    monkeypatch.setattr(device, "execute", spy)
    g = Graph("est")
    x = g.input("x", (5, 7), F32)
    i = g.input("i", (5, 3), DType.INT32)
    g.output(g.op("pad", x, pads=((1, 2), (3, 0)), value=1.0),
             g.op("concat", x, i, x, axis=1), g.op("slice", x, start=(1, 1), stop=(5, 7), step=(2, 2)),
             g.op("argmax", x, axis=0), g.op("var", x), g.op("gelu", g.op("iota", shape=(5, 7), dtype="float32")))
    STACKS["xpu-like"].run(g, {"x": np.ones((5, 7), np.float32), "i": np.ones((5, 3), np.int32)})
    assert len(seen) >= 6
    for est, c in seen:
        assert (est["bytes_read"], est["bytes_written"]) == (c.bytes_read, c.bytes_written)
        assert est["vector_flops"] == c.vector_flops
