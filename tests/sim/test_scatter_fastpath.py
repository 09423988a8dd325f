"""The scatter-add fast path (fornax.sim.fastpath) against the interpreter, bit for bit.

A compiled scatter-add kernel (pull form: each output element walks the update axis in
order) runs four times on fresh data with replay on (the third and fourth launches take the
fast path) and through the interpreter alone; every output byte must agree, with repeated
indices (the order of the sums matters in floating point), out-of-range ones (they name no
element), update tiles smaller than the input, and every supported dtype."""

from __future__ import annotations

import numpy as np
import pytest

from fornax.layers.graph import Graph
from fornax.stack import compose, make_config

CASES = [  # x shape, update shape, axis
    ((6, 5), (9, 5), 0),
    ((4, 7), (3, 5), 1),
    ((3, 4, 6), (3, 4, 10), 2),
]


def _graph(xs, us, axis, dtype):
    g = Graph("scatter")
    x = g.input("x", xs, dtype)
    idx = g.input("idx", us, "int64")
    upd = g.input("upd", us, dtype)
    g.output(g.op("scatter", x, idx, upd, axis=axis, mode="add"))
    return g


def _feeds(xs, us, axis, dtype, seed):
    rng = np.random.default_rng(seed)
    if dtype.startswith("float"):
        x = (rng.standard_normal(xs) * 1e3).astype(dtype)
        upd = (rng.standard_normal(us) * 10.0 ** rng.integers(-3, 4, us)).astype(dtype)
    else:
        x = rng.integers(-100, 100, xs).astype(dtype)
        upd = rng.integers(-100, 100, us).astype(dtype)
    idx = rng.integers(-2, xs[axis] + 2, us)            # repeats, and some out of range
    return {"x": x, "idx": idx, "upd": upd}


def _reference(f, axis):
    out = f["x"].copy()
    for q in np.ndindex(f["upd"].shape):
        t = int(f["idx"][q])
        if 0 <= t < out.shape[axis]:
            p = list(q)
            p[axis] = t
            out[tuple(p)] = out[tuple(p)] + f["upd"][q]     # in the update axis' order
    return out


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("xs, us, axis", CASES)
def test_the_fast_path_gives_the_interpreters_bits(xs, us, axis, dtype):
    g = _graph(xs, us, axis, dtype)
    fast = compose(make_config("cuda-like"))
    plain = compose(make_config("cuda-like", replay=False))
    for seed in range(4):
        f = _feeds(xs, us, axis, dtype, seed)
        a = fast.run(g, f).outputs[0]
        b = plain.run(g, f).outputs[0]
        assert a.tobytes() == b.tobytes()
        assert a.tobytes() == _reference(f, axis).tobytes()
    assert fast.devices[0].replays.fast_launches == 2
    assert plain.devices[0].replays.fast_launches == 0


def test_a_scatter_with_a_fused_consumer_keeps_its_tape():
    g = Graph("scatter_relu")
    x = g.input("x", (6, 5), "float32")
    idx = g.input("idx", (9, 5), "int64")
    upd = g.input("upd", (9, 5), "float32")
    g.output(g.op("relu", g.op("scatter", x, idx, upd, axis=0, mode="add")))
    stack = compose(make_config("rocm-like"))
    for seed in range(4):
        f = _feeds((6, 5), (9, 5), 0, "float32", seed)
        out = stack.run(g, f).outputs[0]
        assert out.tobytes() == np.maximum(_reference(f, 0), 0).tobytes()
    assert stack.devices[0].replays.fast_launches == 0


def test_a_scatter_too_large_to_record_takes_the_fast_path_from_its_counts():
    g = _graph((6, 5), (9, 5), 0, "float32")
    stack = compose(make_config("xpu-like"))
    replays = stack.devices[0].replays
    replays.limit = 8 << 10                       # a recording may hold 1 KiB: too little
    for seed in range(4):
        f = _feeds((6, 5), (9, 5), 0, "float32", seed)
        assert stack.run(g, f).outputs[0].tobytes() == _reference(f, 0).tobytes()
    assert replays.fast_launches == 2 and replays.nbytes == 0 and len(replays) == 1
