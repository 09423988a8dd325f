"""The MAX-style front end: graphs built from typed values, compiled whole by the stack,
custom ops whose kernels the user writes, the same workloads as torch and jax (the same
weights, so the same function), and the three boundaries side by side in ``compare``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.compare import columns, compare
from fornax.frameworks.max import CustomOp, DType, Graph, InferenceSession, TensorType, evaluate, ops
from fornax.layers.errors import ConfigError, GraphError
from fornax.layers.kernel_builder import KernelBuilder
from fornax.scenarios import max_workloads as mw
from fornax.scenarios import torch_workloads as tw
from fornax.schemas import validate
from fornax.sim import isa
from fornax.stack import compose, make_config
from helpers import FAMILIES

F32 = DType.float32


def test_types_are_inferred_at_the_op_that_makes_them():
    with Graph("g", input_types=[TensorType(F32, (4, 8))]) as g:
        (x,) = g.inputs
        y = x @ ops.constant(np.ones((8, 3), np.float32))
        assert y.shape == (4, 3) and y.dtype is F32
        assert ops.reshape(y, (-1,)).shape == (12,)
        assert ops.transpose(y, 0, 1).shape == (3, 4)
        with pytest.raises(GraphError):
            x @ ops.constant(np.ones((7, 3), np.float32))          # 8 != 7
        with pytest.raises(GraphError, match="reshape"):
            ops.reshape(y, (5, -1))
    with pytest.raises(GraphError, match="outside a graph"):
        ops.constant(np.ones(3))
    with pytest.raises(GraphError, match="positive"):
        TensorType(F32, (0, 3))
    other = Graph("h", input_types=[TensorType(F32, (2,))])
    with Graph("g2", input_types=[TensorType(F32, (2,))]) as g2:
        with pytest.raises(GraphError, match="not a value of this graph"):
            g2.output(other.inputs[0])


def test_forward_style_and_execute_errors():
    g = Graph("f", forward=lambda x: ops.relu(x) * 2.0, input_types=[TensorType(F32, (3, 5))])
    model = InferenceSession(vendor="rocm-like").load(g)
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    (y,) = model.execute(x)
    assert np.array_equal(y, np.maximum(x, 0) * 2)
    with pytest.raises(ConfigError, match="takes 1 input"):
        model.execute(x, x)
    with pytest.raises(ConfigError, match="shape"):
        model.execute(np.ones((5, 3), np.float32))
    with pytest.raises(ConfigError, match="vendor or a stack"):
        InferenceSession()
    with pytest.raises(ConfigError, match="shape-only"):
        InferenceSession(stack=compose(make_config("cuda-like", meta=True)))


@pytest.mark.parametrize("vendor", FAMILIES)
@pytest.mark.parametrize("name", list(mw.WORKLOADS))
def test_workloads_match_float64_and_their_torch_twin(vendor, name):
    stack = compose(make_config(vendor))
    run = mw.run(name, stack, seed=3)
    assert run.ok, run.numerics
    # the same weights and input as the torch workload: the same function, value for value
    twin = getattr(tw, name.replace("-custom", "").replace("-", "_"))(3)
    with torch.no_grad():
        expect = twin.model(*twin.inputs).numpy()
    np.testing.assert_allclose(run.outputs["y"], expect, rtol=1e-4, atol=1e-5)
    assert run.boundary["custom_ops"] == (["user_relu"] if name == "mlp-custom" else [])
    assert run.boundary["segments"] == (2 if name == "mlp-custom" else 1)


@pytest.mark.parametrize("vendor", FAMILIES)
def test_a_custom_op_is_the_users_kernel_through_the_library(vendor):
    stack = compose(make_config(vendor))
    run = mw.run("mlp-custom", stack)
    custom = [c for c in stack.library.calls if c.routine == "custom_kernel"]
    assert len(custom) == 1 and custom[0].algorithm.startswith("user_relu")
    api = stack.library.facts["library"]["dnn"]["routines"]["custom_kernel"]
    assert custom[0].reason.startswith(api)
    assert run.ok


def _bad_kernel(types):
    """A user's kernel with a bug: max(x, 1) where the op means max(x, 0)."""
    (t,) = types
    n = math.prod(t.shape)
    kb = KernelBuilder(f"buggy_{n}")
    px, py = kb.param("x", "ptr", "float32"), kb.param("y", "ptr", "float32")
    offs = kb.arange(n)
    x = kb.emit(isa.Load(kb.reg(), px, offs))
    kb.emit(isa.Store(py, offs, kb.binary("max", x, kb.const(1.0, "float32"))))
    return kb.program(group_size=32, kind="elementwise", shared_memory=0, registers=8), (1, 1, 1)


def test_a_buggy_custom_kernel_is_caught_by_the_reference():
    op = CustomOp("relu", kernel=_bad_kernel, out_types=lambda ts: [ts[0]], reference=lambda x: [np.maximum(x, 0)])
    with Graph("bug", input_types=[TensorType(F32, (64,))]) as g:
        g.output(ops.custom(op, [g.inputs[0] * 1.0])[0] + 0.0)
    x = np.linspace(-2, 2, 64, dtype=np.float32)
    (y,) = InferenceSession(vendor="cuda-like").load(g).execute(x)
    (ref,) = evaluate(g, x)
    assert np.array_equal(y, np.maximum(x, 1))
    assert not np.allclose(y, ref)
    # a kernel whose pointer parameters do not match the op's inputs and outputs
    wrong = CustomOp("wrong", kernel=lambda ts: (KernelBuilder("w").program(group_size=32), (1, 1, 1)),
                     out_types=lambda ts: [ts[0]], reference=lambda x: [x])
    with Graph("w", input_types=[TensorType(F32, (4,))]) as g2:
        g2.output(ops.custom(wrong, [g2.inputs[0]])[0])
    with pytest.raises(GraphError, match="pointer"):
        InferenceSession(vendor="cuda-like").load(g2).execute(np.ones(4, np.float32))


def test_compose_and_compare_place_the_three_boundaries():
    res = CliRunner().invoke(main, ["compose", "--vendor", "rocm-like", "--framework", "max",
                                    "--workload", "transformer-block", "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    validate(rep)
    assert rep["manifest"]["framework"] == "max" and rep["max"]["segments"] == 1
    assert all(n["ok"] for n in rep["numerics"])
    doc = compare(columns("mlp", frameworks=["torch", "jax", "max"], vendors=["cuda-like"]))
    validate(json.loads(json.dumps(doc)))
    assert set(doc["boundaries"]) == {"torch", "jax", "max"}
    by_fw = {c["framework"]: c["metrics"] for c in doc["columns"]}
    # the eager ATen boundary launches a kernel per op; the whole-graph boundaries fewer
    assert by_fw["max"]["kernels"] < by_fw["torch"]["kernels"]
    assert by_fw["max"]["kernels"] == by_fw["jax"]["kernels"]
    bad = CliRunner().invoke(main, ["compose", "--vendor", "rocm-like", "--framework", "max",
                                    "--workload", "conv-net"])
    assert bad.exit_code == 2 and "max workload" in bad.output
