"""Whole convolution and attention nodes routed to the library's DNN routines (cuDNN / MIOpen
style) where the family's policy asks for it; generated kernels on xpu-like; decomposition for
the cases the routines do not cover."""

import math

import numpy as np
import pytest

from fornax.layers.compiler import KernelStep, LibraryStep
from fornax.layers.graph import Graph
from fornax.stack import compose, make_config

ROUTING = ("cuda-like", "rocm-like")
TOL = 2e-3                                     # float32 against a float64 reference (relative)


def _conv_graph():
    rng = np.random.default_rng(1)
    g = Graph("conv")
    x = g.input("x", (2, 3, 9, 9), "float32")
    w = g.input("w", (8, 3, 3, 3), "float32")
    g.output(g.op("convolution", x, w, stride=2, padding=1))
    feeds = {"x": rng.standard_normal((2, 3, 9, 9)).astype(np.float32),
             "w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32)}
    return g, feeds


def _conv_ref(x, w, stride, pad):
    """Direct NCHW / OIHW convolution in float64, loop over output pixels."""
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    w = w.astype(np.float64)
    k, _, r, s = w.shape
    p = (x.shape[2] - r) // stride + 1
    q = (x.shape[3] - s) // stride + 1
    y = np.zeros((x.shape[0], k, p, q))
    for i in range(p):
        for j in range(q):
            patch = x[:, :, i * stride:i * stride + r, j * stride:j * stride + s]
            y[:, :, i, j] = np.einsum("ncrs,kcrs->nk", patch, w)
    return y


def _attention_graph(d=64, causal=True):
    rng = np.random.default_rng(2)
    g = Graph("attn")
    shape = (2, 2, 24, d)
    q, k, v = (g.input(n, shape, "float32") for n in ("q", "k", "v"))
    g.output(g.op("attention", q, k, v, causal=causal))
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in ("q", "k", "v")}
    return g, feeds


def _attention_ref(q, k, v, causal):
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        sq, sk = s.shape[-2:]
        s = np.where(np.tril(np.ones((sq, sk), dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _close(out, ref):
    assert out.shape == ref.shape
    assert np.abs(out.astype(np.float64) - ref).max() / np.abs(ref).max() <= TOL


def _run(vendor, graph, feeds, meta=False):
    stack = compose(make_config(vendor, meta=meta))
    result = stack.run(graph, feeds)
    steps = [s for p in result.plans for s in p.steps]
    routines = [c["routine"] for c in stack.library.report()["algorithms_chosen"]]
    return result, steps, routines


CASES = {"conv": (_conv_graph, lambda f: _conv_ref(f["x"], f["w"], 2, 1), "conv2d_fwd"),
         "attention": (_attention_graph, lambda f: _attention_ref(f["q"], f["k"], f["v"], True),
                       "attention_fwd")}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("vendor", ROUTING)
def test_whole_node_goes_to_the_library(vendor, case):
    build, ref, routine = CASES[case]
    graph, feeds = build()
    result, steps, routines = _run(vendor, graph, feeds)
    assert not result.fallbacks
    lib = [s for s in steps if isinstance(s, LibraryStep)]
    assert [s.routine for s in lib] == [routine]
    assert not any(isinstance(s, KernelStep) for s in steps)     # nothing decomposed around it
    assert routines == [routine]
    _close(result.outputs[0], ref(feeds))


def test_library_step_parameters_describe_the_node():
    graph, feeds = _conv_graph()
    _, steps, _ = _run("cuda-like", graph, feeds)
    (step,) = steps
    assert {k: step.params[k] for k in ("n", "c", "h", "w", "k", "r", "s")} == \
        {"n": 2, "c": 3, "h": 9, "w": 9, "k": 8, "r": 3, "s": 3}
    assert step.params["stride"] == (2, 2) and step.params["padding"] == (1, 1)
    graph, feeds = _attention_graph()
    _, steps, _ = _run("rocm-like", graph, feeds)
    (step,) = steps
    assert step.params["batch"] == 4 and step.params["seq_q"] == 24 and step.params["head_dim"] == 64
    assert step.params["causal"] is True
    assert set(step.buffers) == {"q", "k", "v", "o", "lse"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_xpu_like_generates_its_own_kernels(case):
    build, ref, _ = CASES[case]
    graph, feeds = build()
    result, steps, routines = _run("xpu-like", graph, feeds)
    assert routines == [] and not any(isinstance(s, LibraryStep) for s in steps)
    assert any(isinstance(s, KernelStep) for s in steps)
    _close(result.outputs[0], ref(feeds))


def test_unsupported_head_dim_decomposes():
    graph, feeds = _attention_graph(d=96, causal=False)
    result, steps, routines = _run("cuda-like", graph, feeds)
    assert "attention_fwd" not in routines
    assert not any(isinstance(s, LibraryStep) and s.routine == "attention_fwd" for s in steps)
    assert any(isinstance(s, KernelStep) for s in steps) and not result.fallbacks
    _close(result.outputs[0], _attention_ref(feeds["q"], feeds["k"], feeds["v"], False))


def test_3d_and_asymmetric_convolutions_decompose():
    rng = np.random.default_rng(3)
    g = Graph("conv3d")
    x = g.input("x", (1, 2, 4, 5, 5), "float32")
    w = g.input("w", (3, 2, 2, 2, 2), "float32")
    g.output(g.op("convolution", x, w))
    feeds = {"x": rng.standard_normal((1, 2, 4, 5, 5)).astype(np.float32),
             "w": rng.standard_normal((3, 2, 2, 2, 2)).astype(np.float32)}
    result, steps, routines = _run("cuda-like", g, feeds)
    assert "conv2d_fwd" not in routines and not result.fallbacks
    ref = np.zeros((1, 3, 3, 4, 4))
    xd, wd = feeds["x"].astype(np.float64), feeds["w"].astype(np.float64)
    for a in range(3):
        for b in range(4):
            for c in range(4):
                ref[:, :, a, b, c] = np.einsum("ncdef,kcdef->nk", xd[:, :, a:a + 2, b:b + 2, c:c + 2], wd)
    _close(result.outputs[0], ref)

    g = Graph("conv_asym")
    x = g.input("x", (1, 3, 6, 6), "float32")
    w = g.input("w", (4, 3, 3, 3), "float32")
    g.output(g.op("convolution", x, w, padding=((0, 1), (1, 0))))
    result, steps, routines = _run("rocm-like", g, {"x": np.ones((1, 3, 6, 6), np.float32),
                                                    "w": np.ones((4, 3, 3, 3), np.float32)})
    assert "conv2d_fwd" not in routines
    out = result.outputs[0]
    assert out.shape == (1, 4, 5, 5)
    assert out[0, 0, 0, 0] == 18.0 and out[0, 0, 2, 2] == 27.0     # window counts: edge vs interior


@pytest.mark.parametrize("case", sorted(CASES))
def test_meta_mode_routes_too(case):
    build, _, routine = CASES[case]
    graph, feeds = build()
    result, steps, routines = _run("cuda-like", graph, feeds, meta=True)
    assert routines == [routine]
    assert result.outputs[0].shape == graph.outputs[0].shape
