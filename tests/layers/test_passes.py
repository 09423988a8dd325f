"""Each compiler pass on its own: its effect on a small graph, and the float64
reference result unchanged (``Graph.reference`` before and after)."""

import math

import numpy as np
import pytest

from fornax.layers.compiler import CompileOptions, Target
from fornax.layers.errors import CompileError, ConfigError
from fornax.layers.graph import OPS, DType, Graph, OpDef
from fornax.layers.passes.cse import cse
from fornax.layers.passes.dce import dce
from fornax.layers.passes.decompose import decompose
from fornax.layers.passes.fold import FOLD_LIMIT, fold
from fornax.layers.passes.fuse import fuse
from fornax.layers.passes.layout import layout
from fornax.layers.passes.memplan import plan_memory
from fornax.layers.passes.route import unsupported
from fornax.layers.passes.simplify import simplify
from fornax.stack import compose, make_config

F32 = DType.FLOAT32
RNG = np.random.default_rng(5)


def _ops(g):
    return [n.op for n in g.nodes]


def _same_reference(before, after, feeds, exact=False):
    after.verify()
    for a, b in zip(before.reference(feeds), after.reference(feeds)):
        assert a.shape == b.shape
        if exact:
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_decompose_replaces_composites_by_primitives():
    g = Graph("sm")
    x = g.input("x", (4, 9), F32)
    g.output(g.op("reduce_mean", g.op("softmax", x, axis=-1), axis=0))
    d = decompose(g)
    assert not any(OPS[op].kind == "composite" for op in _ops(d))
    assert sorted(_ops(d)) == sorted(["reduce_max", "sub", "exp", "reduce_sum", "div", "reduce_sum", "mul"])
    assert _ops(decompose(g, keep=frozenset({"softmax"})))[0] == "softmax"
    feeds = {"x": RNG.standard_normal((4, 9)).astype(np.float32)}
    _same_reference(g, d, feeds)
    # independently: the mean over rows of a row softmax
    z = np.exp(feeds["x"].astype(np.float64) - feeds["x"].max(-1, keepdims=True))
    np.testing.assert_allclose(d.reference(feeds)[0], (z / z.sum(-1, keepdims=True)).mean(0, keepdims=True),
                               rtol=1e-12)


def test_fold_evaluates_constant_subgraphs_and_casts():
    g = Graph("fold")
    x = g.input("x", (3,), F32)
    a = g.constant(np.array([1.5, 2.0, -1.0], np.float32), "a")
    b = g.constant(np.array([2.0, 0.25, 4.0], np.float32), "b")
    g.output(g.op("add", x, g.op("exp", g.op("mul", a, b))))
    f = dce(fold(g))
    assert _ops(f) == ["add"]
    (folded,) = [v for v in f.constants]
    assert folded.dtype is F32
    np.testing.assert_array_equal(folded.const, np.exp(np.array([3.0, 0.5, -4.0])).astype(np.float32))
    # the folded value is rounded to float32 once (the reference of the original is all float64)
    a64, b64 = (f.reference({"x": np.ones(3, np.float32)})[0], g.reference({"x": np.ones(3, np.float32)})[0])
    np.testing.assert_allclose(a64, b64, rtol=2 ** -23)


def test_fold_does_not_materialise_huge_constants():
    g = Graph("big")
    x = g.input("x", (FOLD_LIMIT * 2,), F32)
    one = g.constant(np.array(1.0, np.float32), "one")
    g.output(g.op("add", x, g.op("broadcast_to", one, shape=(FOLD_LIMIT * 2,))))
    f = fold(g)
    assert _ops(f) == ["broadcast_to", "add"]
    assert max(v.const.size for v in f.constants) == 1


def test_cse_merges_equal_nodes_and_constants_only():
    g = Graph("cse")
    x = g.input("x", (4, 5), F32)
    c1 = g.constant(np.float32(2.0), "c1")
    c2 = g.constant(np.float32(2.0), "c2")
    e1 = g.op("mul", g.op("exp", x), c1)
    e2 = g.op("mul", g.op("exp", x), c2)
    s0 = g.op("reduce_sum", e1, axis=0)
    s1 = g.op("reduce_sum", e2, axis=1)
    g.output(g.op("add", e1, e2), s0, s1)
    c = cse(g)
    assert _ops(c) == ["exp", "mul", "reduce_sum", "reduce_sum", "add"]
    assert len(c.constants) == 1
    assert c.nodes[4].inputs[0] is c.nodes[4].inputs[1]          # add(e, e)
    _same_reference(g, c, {"x": RNG.standard_normal((4, 5)).astype(np.float32)}, exact=True)


def test_dce_removes_dead_nodes_and_constants_but_keeps_inputs():
    g = Graph("dce")
    x = g.input("x", (4,), F32)
    unused = g.input("unused", (2,), F32)
    dead_c = g.constant(np.ones(4, np.float32), "dead")
    g.op("tanh", g.op("add", x, dead_c))                            # dead
    g.output(g.op("exp", x))
    d = dce(g)
    assert _ops(d) == ["exp"] and d.constants == []
    assert [v.name for v in d.inputs] == ["x", "unused"] and unused.name == "unused"
    _same_reference(g, d, {"x": np.arange(4, dtype=np.float32), "unused": np.zeros(2, np.float32)}, exact=True)


def test_simplify_removes_exact_identities():
    g = Graph("simp")
    x = g.input("x", (2, 3), F32)
    zero, one = g.constant(np.zeros(3, np.float32), "zero"), g.constant(np.float32(1), "one")
    y = g.op("add", x, zero)
    y = g.op("mul", one, y)
    y = g.op("div", g.op("sub", y, zero), one)
    y = g.op("cast", y, dtype="float32")
    y = g.op("neg", g.op("neg", y))
    y = g.op("reshape", g.op("reshape", y, shape=(3, 2)), shape=(6,))
    y = g.op("transpose", g.op("transpose", g.op("reshape", y, shape=(2, 3))))
    g.output(g.op("tanh", y))
    s2 = dce(simplify(g))
    assert _ops(s2) == ["tanh"] and s2.nodes[0].inputs[0] is s2.inputs[0]
    x_val = np.array([[1, -2, np.inf], [np.nan, -0.0, 3]], np.float32)
    _same_reference(g, s2, {"x": x_val})


def test_simplify_keeps_float_times_zero_and_shape_changing_identities():
    g = Graph("keep")
    x = g.input("x", (3,), F32)
    i = g.input("i", (3,), DType.INT32)
    zf = g.constant(np.float32(0), "zf")
    zi = g.constant(np.zeros(3, np.int32), "zi")
    wide = g.constant(np.zeros((2, 3), np.float32), "wide")
    g.output(g.op("mul", x, zf), g.op("mul", i, zi), g.op("add", x, wide))
    s = dce(simplify(g))
    assert _ops(s) == ["mul", "add"]                 # float x*0 kept (inf*0 is NaN); broadcast add kept
    feeds = {"x": np.array([np.inf, np.nan, 2], np.float32), "i": np.array([7, -3, 1], np.int32)}
    out = s.reference(feeds)
    assert np.isnan(out[0][:2]).all() and out[0][2] == 0
    np.testing.assert_array_equal(out[1], [0, 0, 0])
    _same_reference(g, s, feeds)


def test_layout_composes_transposes_and_folds_broadcasts_into_consumers():
    g = Graph("lay")
    x = g.input("x", (2, 3, 4), F32)
    b = g.input("b", (4,), F32)
    t = g.op("transpose", g.op("transpose", x, perm=(1, 0, 2)), perm=(0, 2, 1))   # -> (3, 4, 2)
    u = g.op("transpose", g.op("reshape", b, shape=(1, 4)), perm=(1, 0))          # only a unit dim moves
    bb = g.op("broadcast_to", b, shape=(2, 3, 4))
    g.output(t, g.op("add", x, bb), u)
    lay = dce(layout(g))
    assert _ops(lay) == ["transpose", "reshape", "add"]
    (tr,) = [n for n in lay.nodes if n.op == "transpose"]
    assert tuple(tr.attrs["perm"]) == (1, 2, 0) and tr.inputs[0] is lay.inputs[0]
    assert not any(n.op == "broadcast_to" for n in lay.nodes)
    feeds = {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32),
             "b": RNG.standard_normal(4).astype(np.float32)}
    _same_reference(g, lay, feeds, exact=True)
    np.testing.assert_array_equal(lay.reference(feeds)[0], np.transpose(feeds["x"], (1, 2, 0)))


def test_fuse_switch_gives_one_kernel_per_op():
    g = Graph("chain")
    x = g.input("x", (8, 8), F32)
    g.output(g.op("relu", g.op("exp", g.op("neg", x))))
    assert [len(gr.nodes) for gr in fuse(g, frozenset())] == [3]
    assert [len(gr.nodes) for gr in fuse(g, frozenset(), enabled=False)] == [1, 1, 1]


def test_compile_options_reject_unknown_passes():
    with pytest.raises(ConfigError, match="unknown compiler pass.*bogus"):
        CompileOptions(passes=("bogus",))


def test_memplan_slots_never_overlap_and_peak_is_counted_by_hand():
    # buffers 0 (input) and 9 (output) pinned; temps 1..4 along a chain, each read by the next step
    steps = [[0, 1], [1, 2], [2, 3], [3, 4], [4, 9]]
    sizes = {0: 100, 1: 400, 2: 300, 3: 400, 4: 200, 9: 50}
    mp = plan_memory(steps, sizes, {0, 9})
    span = {b: (min(i for i, s in enumerate(steps) if b in s), max(i for i, s in enumerate(steps) if b in s))
            for b in (1, 2, 3, 4)}
    for a in mp.slots:
        for b in mp.slots:
            if a < b and mp.slots[a] == mp.slots[b]:
                assert span[a][1] < span[b][0] or span[b][1] < span[a][0]
    assert mp.slots[1] == mp.slots[3] and mp.slots[2] == mp.slots[4]
    assert mp.slot_bytes == (400, 300)
    assert mp.peak_bytes == 150 + 700 and mp.total_bytes == 1450
    assert mp.peak_bytes < mp.total_bytes


def _chain(n=6, shape=(128, 128)):
    g = Graph("chain")
    x = g.input("x", shape, F32)
    y = x
    for i in range(n):
        y = g.op("tanh" if i % 2 else "exp", g.op("neg", y) if i == 0 else y)
    g.output(y)
    return g


def test_memory_plan_lowers_the_peak_and_the_run_stays_correct(monkeypatch):
    stack = compose(make_config("rocm-like", fuse=False))
    g = _chain()
    plan = stack.compiler.compile(g, stack.target, stack.library.ops())
    assert plan.stats["kernels"] == len(g.nodes)
    buf_bytes = sum(b.nbytes for b in plan.buffers.values())
    assert plan.stats["planned_bytes"] == buf_bytes
    assert plan.stats["planned_peak_bytes"] < buf_bytes
    # 5 temporaries of 64 KiB along a chain fit in 2 slots; input and output pinned
    assert len(plan.memory.slot_bytes) == 2 and plan.stats["planned_peak_bytes"] == 4 * 128 * 128 * 4
    sizes = []
    real = stack.runtime.malloc
    monkeypatch.setattr(stack.runtime, "malloc", lambda n, *a, **k: (sizes.append(n), real(n, *a, **k))[1])
    feeds = {"x": RNG.standard_normal((128, 128)).astype(np.float32)}
    res = stack.run(g, feeds)
    assert len(sizes) == 2 + 2                     # input, output, and one allocation per slot
    np.testing.assert_allclose(res.outputs[0], g.reference(feeds)[0], rtol=1e-5, atol=1e-6)


def _erf_graph():
    g = Graph("erf")
    x = g.input("x", (16,), F32)
    g.output(g.op("exp", g.op("erf_like", g.op("neg", x))))
    return g


@pytest.fixture
def erf_op(monkeypatch):
    """An op with a reference but no code generator (as a new graph op would be)."""
    ref = np.vectorize(math.erf)
    monkeypatch.setitem(OPS, "erf_like", OpDef("erf_like", "elementwise", 1, lambda t, a: t[0],
                                               lambda x: ref(x)))
    return "erf_like"


def test_unsupported_ops_are_reported_up_front_and_compile_fails_cleanly(erf_op):
    g = _erf_graph()
    assert unsupported(g) == {"erf_like": "no code generator for elementwise op erf_like"}
    stack = compose(make_config("cuda-like"))
    assert stack.compiler.unsupported(g) == unsupported(g)
    with pytest.raises(CompileError, match="cannot lower erf_like") as info:
        stack.compiler.compile(g, stack.target)
    assert info.value.op == "erf_like" and info.value.seam == "compiler"


def test_framework_routes_what_the_compiler_cannot_lower_to_the_cpu(erf_op):
    stack = compose(make_config("xpu-like"))
    stack.framework.native = stack.framework.native | {"erf_like"}     # the face claims it
    g = _erf_graph()
    feeds = {"x": RNG.standard_normal(16).astype(np.float32)}
    res = stack.run(g, feeds)
    assert [f["op"] for f in res.fallbacks] == ["erf_like"]
    assert "compiler cannot lower erf_like" in res.fallbacks[0]["reason"]
    assert len(res.plans) == 2                        # neg on the device, erf on the host, exp on the device
    want = np.exp([math.erf(-v) for v in feeds["x"].astype(np.float64)])
    np.testing.assert_allclose(res.outputs[0], want, rtol=1e-5)


def test_ir_dumps_and_compiler_log(tmp_path, monkeypatch, capsys):
    stack = compose(make_config("cuda-like"))
    g = _chain(3, (4, 4))
    monkeypatch.setenv("FORNAX_LOG", "compiler")
    plan = stack.compiler.compile(g, stack.target, options=CompileOptions(dump_ir=str(tmp_path / "ir")))
    names = sorted(p.name for p in (tmp_path / "ir").iterdir())
    assert names == ["chain.00.input.txt", "chain.01.decompose.txt", "chain.02.fold.txt",
                     "chain.03.simplify.txt", "chain.04.layout.txt", "chain.05.cse.txt",
                     "chain.06.dce.txt", "chain.07.fuse.txt"]
    assert "= tanh(" in (tmp_path / "ir" / "chain.06.dce.txt").read_text()
    assert "kernel 0 pointwise over [4, 4]" in (tmp_path / "ir" / "chain.07.fuse.txt").read_text()
    err = capsys.readouterr().err
    assert "chain after dce" in err and "chain after fuse" in err
    assert [r["pass"] for r in plan.stats["passes"]] == ["decompose", "fold", "simplify", "layout", "cse",
                                                         "dce", "fuse"]
    assert any(line.startswith("memplan:") for line in plan.log)
    assert stack.target.format == plan.target.format and isinstance(stack.target, Target)
