"""The reference solution of lab 6.4 (for the tests; fornax lab never prints it): a bias add,
a ReLU and a scale over one shape, a pointwise chain every family fuses into one kernel."""

import numpy as np

from fornax.layers.graph import DType, Graph


def build() -> tuple[Graph, dict[str, np.ndarray]]:
    rng = np.random.default_rng(6)
    g = Graph("fusion")
    x = g.input("x", (64, 128), DType.FLOAT32)
    b = g.constant(rng.standard_normal(128).astype(np.float32), "b")
    s = g.constant(np.array(0.5, np.float32), "s")
    g.output(g.op("mul", g.op("relu", g.op("add", x, b)), s), names=["y"])
    return g, {"x": rng.standard_normal((64, 128)).astype(np.float32)}
