"""Workloads written with the MAX-style graph API (:mod:`fornax.frameworks.max`), the twins of
the torch and jax workloads: the same shapes, and the very weights and inputs (taken from the
torch workload's module built with the same seed, as the jax twins do).

* ``mlp`` — Linear(256, 512) → ReLU → Linear(512, 128) on a batch of 64.
* ``mlp-custom`` — the same MLP with its ReLU a custom op whose kernel is written here in
  fornax's tile-ISA builder (one lane per element, a masked load, ``max(x, 0)``, a masked
  store) and launched through the stack's library seam: the one place vendor-specific
  code enters a MAX-style graph.
* ``transformer-block`` — pre-norm: LayerNorm → Q/K/V projections → 4-head softmax
  attention scaled by 1/sqrt(d_head) → output projection → residual → LayerNorm → Linear →
  exact (erf) GELU → Linear → residual.

A run (:func:`run`) builds the graph, loads it in an
:class:`~fornax.frameworks.max.InferenceSession` on the stack (compiling it whole), executes
it in float32 on the simulated device and checks the outputs against the same graph
evaluated on the host in float64 (:func:`~fornax.frameworks.max.evaluate`).
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..frameworks.max import CustomOp, DType, Graph, InferenceSession, TensorType, TensorValue, evaluate, ops
from ..layers.errors import ConfigError
from ..layers.graph import DType as IRDType
from ..layers.kernel_builder import KernelBuilder
from ..sim import isa
from . import torch_workloads as tw
from .workloads import TOLERANCE

F32 = DType.float32
RELU_BLOCK = 256                       # elements per program instance of the custom ReLU


@dataclass(frozen=True)
class MaxWorkload:
    name: str
    description: str
    build: Callable[..., tuple[Graph, tuple[np.ndarray, ...]]]   # (seed, **shape parameters)


@dataclass
class MaxRun:
    """One workload run by the MAX-style front end against its float64 host reference."""

    workload: str
    stack: str
    outputs: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]
    numerics: list[dict]
    host_wall_s: float = 0.0            # load (compile) + execute
    compile_s: float = 0.0
    boundary: dict[str, Any] = field(default_factory=dict)   # Model.report(): ops, segments, custom ops

    @property
    def ok(self) -> bool:
        return all(n["ok"] for n in self.numerics)


def _params(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.state_dict().items()}


def _linear(x: TensorValue, p: dict[str, np.ndarray], name: str, rows: slice = slice(None)) -> TensorValue:
    """``nn.Linear`` (torch's [out, in] weight, optionally a block of its rows): x @ w.T + b."""
    return x @ ops.constant(np.ascontiguousarray(p[f"{name}.weight"][rows].T)) + ops.constant(p[f"{name}.bias"][rows])


# ---- the custom op ----------------------------------------------------------------------------
def _relu_kernel(types: list[TensorType]) -> tuple[isa.Program, tuple[int, int, int]]:
    """The user's kernel: ``y = max(x, 0)`` over every element, RELU_BLOCK lanes per instance."""
    (t,) = types
    n = math.prod(t.shape)
    kb = KernelBuilder(f"user_relu_{n}")
    px = kb.param("x", "ptr", t.dtype.value)
    py = kb.param("y", "ptr", t.dtype.value)
    offs = kb.iadd(kb.imul(kb.pid(0), RELU_BLOCK), kb.arange(RELU_BLOCK))
    mask = kb.binary("lt", offs, kb.const(n, "int64"))
    x = kb.emit(isa.Load(kb.reg(), px, offs, mask))
    kb.emit(isa.Store(py, offs, kb.binary("max", x, kb.const(0.0, t.dtype.value)), mask))
    return kb.program(group_size=32, kind="elementwise", shared_memory=0, registers=8), \
        (math.ceil(n / RELU_BLOCK), 1, 1)


USER_RELU = CustomOp("user_relu", kernel=_relu_kernel, out_types=lambda types: [types[0]],
                     reference=lambda x: [np.maximum(x, 0.0)])


# ---- the workloads ----------------------------------------------------------------------------
def _mlp_graph(name: str, p: dict[str, np.ndarray], batch: int, d_in: int, custom: bool) -> Graph:
    with Graph(name, input_types=[TensorType(F32, (batch, d_in))]) as g:
        (x,) = g.inputs
        h = _linear(x, p, "0")
        h = ops.custom(USER_RELU, [h])[0] if custom else ops.relu(h)
        g.output(_linear(h, p, "2"))
    return g


def mlp(seed: int, batch: int = 64, d_in: int = 256, hidden: int = 512,
        d_out: int = 128) -> tuple[Graph, tuple[np.ndarray, ...]]:
    """y = Linear(ReLU(Linear(x))): torch_workloads.mlp's weights and input."""
    prog = tw.mlp(seed, batch=batch, d_in=d_in, hidden=hidden, d_out=d_out)
    return (_mlp_graph("mlp", _params(prog.model), batch, d_in, False),
            tuple(x.numpy().astype(np.float32) for x in prog.inputs))


def mlp_custom(seed: int, batch: int = 64, d_in: int = 256, hidden: int = 512,
               d_out: int = 128) -> tuple[Graph, tuple[np.ndarray, ...]]:
    """The MLP with its ReLU the user's custom op."""
    prog = tw.mlp(seed, batch=batch, d_in=d_in, hidden=hidden, d_out=d_out)
    return (_mlp_graph("mlp-custom", _params(prog.model), batch, d_in, True),
            tuple(x.numpy().astype(np.float32) for x in prog.inputs))


def transformer_block(seed: int, batch: int = 1, seq: int = 16, d_model: int = 64, heads: int = 4,
                      d_ff: int = 128) -> tuple[Graph, tuple[np.ndarray, ...]]:
    """torch_workloads.Block's forward pass on its [batch, seq, d_model] input and weights."""
    if batch != 1:
        raise ConfigError("the MAX-style transformer-block twin takes batch 1", hint="run with batch=1")
    prog = tw.transformer_block(seed, batch=batch, seq=seq, d_model=d_model, heads=heads, d_ff=d_ff)
    p = _params(prog.model)
    dh = d_model // heads
    with Graph("transformer-block", input_types=[TensorType(F32, (batch, seq, d_model))]) as g:
        (x3,) = g.inputs
        x = ops.reshape(x3, (seq, d_model))

        def norm(v: TensorValue, name: str) -> TensorValue:
            return ops.layer_norm(v, ops.constant(p[f"{name}.weight"]), ops.constant(p[f"{name}.bias"]))

        def heads_of(v: TensorValue) -> TensorValue:         # [seq, d] -> [heads, seq, dh]
            return ops.permute(ops.reshape(v, (seq, heads, dh)), (1, 0, 2))
        n1 = norm(x, "norm1")
        q, k, v = (heads_of(_linear(n1, p, "qkv", slice(i * d_model, (i + 1) * d_model))) for i in range(3))
        scores = (q @ ops.transpose(k, 1, 2)) * (1.0 / math.sqrt(dh))
        a = ops.softmax(scores) @ v
        h = x + _linear(ops.reshape(ops.permute(a, (1, 0, 2)), (seq, d_model)), p, "proj")
        y = h + _linear(ops.gelu(_linear(norm(h, "norm2"), p, "fc1")), p, "fc2")
        g.output(ops.reshape(y, (batch, seq, d_model)))
    return g, tuple(x.numpy().astype(np.float32) for x in prog.inputs)


WORKLOADS: dict[str, MaxWorkload] = {w.name: w for w in (
    MaxWorkload("mlp", "MAX-style graph MLP 256-512-128, batch 64: the torch mlp's weights and "
                "input, compiled whole", mlp),
    MaxWorkload("mlp-custom", "that MLP with its ReLU a custom op: a tile-ISA kernel written by "
                "the user, launched through the library seam", mlp_custom),
    MaxWorkload("transformer-block", "pre-norm block: LayerNorm, Q/K/V, 4-head softmax attention, "
                "exact GELU MLP, residuals; seq 16, d_model 64", transformer_block),
)}
DEFAULT_WORKLOAD = "mlp"


def get_workload(name: str) -> MaxWorkload:
    if name not in WORKLOADS:
        raise ConfigError(f"unknown max workload {name!r}; available: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]


def run(name: str, stack: Any, seed: int = 0, **params: Any) -> MaxRun:
    """Run workload ``name`` on ``stack`` (a composed Stack) with the MAX-style front end."""
    wl = get_workload(name)
    known = list(inspect.signature(wl.build).parameters)[1:]
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ConfigError(f"max workload {name} has no parameter {', '.join(unknown)}; "
                          f"it takes {', '.join(known)}")
    graph, inputs = wl.build(seed, **params)
    t0 = time.perf_counter()
    model = InferenceSession(stack=stack).load(graph)
    outs = model.execute(*inputs)
    wall = time.perf_counter() - t0
    refs = evaluate(graph, *inputs)
    names = ["y"] if len(outs) == 1 else [f"y{i}" for i in range(len(outs))]
    out_d = {n: torch.from_numpy(o) for n, o in zip(names, outs)}
    ref_d = {n: torch.from_numpy(np.asarray(r)) for n, r in zip(names, refs)}
    return MaxRun(name, stack.describe(), {n: o for n, o in zip(names, outs)},
                  {n: np.asarray(r) for n, r in zip(names, refs)},
                  tw._numerics(out_d, ref_d, TOLERANCE[IRDType.FLOAT32]), wall, model.compile_s,
                  model.report())
