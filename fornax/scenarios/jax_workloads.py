"""Workloads written as plain JAX functions, compiled and run by fornax's JAX front end.

Each workload is the JAX twin of a torch workload of
:mod:`fornax.scenarios.torch_workloads`: the same shapes, and the very weights and
inputs, because they are taken from the torch workload's program built with the
same seed (its module's ``state_dict`` and its inputs, as float32 numpy arrays).
The computation is then written with ``jax.numpy`` / ``lax`` / ``jax.nn`` on those
arrays, with the weights kept in torch's layout (``nn.Linear`` holds ``[out, in]``,
so a layer is ``x @ w.T + b``).  So the jax and torch runs of one workload compute
the same function of the same numbers and can be compared value for value.

A run (:func:`run`) compiles the whole function with
:func:`fornax.frameworks.jax.jit` on a client of the given stack and runs it in
float32 on the simulated device; the reference is the same function under
``jax.jit`` on the CPU in float64 (x64 enabled for that call only).  The result
(:class:`JaxRun`) holds the outputs, their normwise error against the reference
(the torch workloads' numerics rows), the losses per step for training, the host
wall times and the front end's accounting for this run only: equations per
primitive and route (native, fallback with its reason, control), and the
executions, segments, host fallback runs, host-driven loop iterations and
branches, and transfer bytes.

* ``mlp`` — Linear(256, 512) → ReLU → Linear(512, 128) on a batch of 64.
* ``mlp-train`` — that MLP trained for 5 steps of SGD with momentum 0.9 (lr 0.2,
  torch's update: ``buf = 0.9 * buf + g; w -= lr * buf``) on the MSE against the
  torch workload's teacher targets, gradients by ``jax.value_and_grad``.  The
  steps are one ``lax.scan`` whose carry is (weights, momentum) and whose per-step
  output is the loss: fornax drives the loop from the host around the compiled
  body, as XLA's GPU runtime drives a while loop.
* ``transformer-block`` — pre-norm: LayerNorm (eps 1e-5) → fused QKV projection →
  4-head softmax attention scaled by 1/sqrt(d_head) → output projection →
  residual → LayerNorm → Linear → exact (erf) GELU → Linear → residual.

Honest limits: the torch workloads' ``adamw`` optimiser and ``conv-net`` have no
JAX twin here; the weights come from torch's initialisation, so torch must be
installed.
"""

from __future__ import annotations

import inspect
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..layers.errors import ConfigError, NotSupportedError
from ..layers.graph import DType
from ..report import JAX_COUNTS, JAX_ROUTES, route_totals, rows_delta
from . import torch_workloads as tw
from .workloads import TOLERANCE

LN_EPS = 1e-5                              # nn.LayerNorm's default eps
SGD_MOMENTUM = 0.9                         # torch_workloads' SGD


@dataclass
class JaxProgram:
    """What a workload runs: ``fn(params, *inputs) -> {output name: array}``, its float32
    parameters (torch ``state_dict`` names) and inputs, and which output (if any) holds
    the loss per training step."""

    fn: Callable
    params: dict[str, np.ndarray]
    inputs: tuple[np.ndarray, ...]
    losses: str | None = None
    tol: float = TOLERANCE[DType.FLOAT32]


@dataclass(frozen=True)
class JaxWorkload:
    name: str
    description: str
    build: Callable[..., JaxProgram]       # (seed, **shape parameters) -> JaxProgram


@dataclass
class JaxRun:
    """One workload run by fornax's JAX front end against its float64 CPU reference."""

    workload: str
    stack: str                             # the client's stack, in words
    platform: str                          # the platform name JAX would report (cuda, rocm, xpu)
    plugin: str                            # the PJRT plugin that serves it in the family
    platform_version: str
    outputs: dict[str, np.ndarray]         # fornax results (float32)
    reference: dict[str, np.ndarray]       # jax.jit on the CPU in float64
    numerics: list[dict]                   # as fornax.scenarios.workloads.numerics
    losses: list[float] = field(default_factory=list)
    reference_losses: list[float] = field(default_factory=list)
    host_wall_s: float = 0.0               # fornax run: trace, compile, upload, run, download
    reference_wall_s: float = 0.0          # the float64 jax.jit run on the CPU (host clock)
    routes: dict = field(default_factory=dict)   # {"totals", "primitives", "fallbacks", "counts"}
    #: the program the stack was handed at JAX's boundary: ``{"ir": "jaxpr", "equations"}``
    #: through the front end, ``{"ir": "stablehlo", "ops", "kinds", "bytes", "compile_s"}``
    #: through the PJRT plugin
    received: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(n["ok"] for n in self.numerics)


# ---- from the torch twins ---------------------------------------------------------------------
def _numpy_params(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.state_dict().items()}


def _numpy_inputs(inputs: tuple) -> tuple[np.ndarray, ...]:
    return tuple(x.detach().cpu().numpy().astype(np.float32) for x in inputs)


# ---- the computations -------------------------------------------------------------------------
def _linear(x, p: dict, name: str):
    """``nn.Linear`` with torch's ``[out, in]`` weight: x @ w.T + b."""
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def _mlp_forward(p: dict, x):
    return _linear(jax.nn.relu(_linear(x, p, "0")), p, "2")


def _layer_norm(x, p: dict, name: str):
    """``nn.LayerNorm`` over the last axis: biased variance, eps inside the square root."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + LN_EPS) * p[f"{name}.weight"] + p[f"{name}.bias"]


def _block_forward(p: dict, x, heads: int):
    """torch_workloads.Block: h = x + proj(attn(ln1(x))); y = h + fc2(gelu(fc1(ln2(h))))."""
    b, t, d = x.shape
    dh = d // heads
    q, k, v = jnp.split(_linear(_layer_norm(x, p, "norm1"), p, "qkv"), 3, axis=-1)
    q, k, v = (z.reshape(b, t, heads, dh).transpose(0, 2, 1, 3) for z in (q, k, v))
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) * (1.0 / math.sqrt(dh))
    a = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
    h = x + _linear(a.transpose(0, 2, 1, 3).reshape(b, t, d), p, "proj")
    ff = jax.nn.gelu(_linear(_layer_norm(h, p, "norm2"), p, "fc1"), approximate=False)
    return h + _linear(ff, p, "fc2")


# ---- the workloads ----------------------------------------------------------------------------
def mlp(seed: int, batch: int = 64, d_in: int = 256, hidden: int = 512, d_out: int = 128) -> JaxProgram:
    """y = Linear(ReLU(Linear(x))): torch_workloads.mlp's weights and input, in JAX."""
    prog = tw.mlp(seed, batch=batch, d_in=d_in, hidden=hidden, d_out=d_out)

    def fn(p, x):
        return {"y": _mlp_forward(p, x)}
    return JaxProgram(fn, _numpy_params(prog.model), _numpy_inputs(prog.inputs))


def mlp_train(seed: int, batch: int = 64, d_in: int = 256, hidden: int = 512, d_out: int = 128,
              steps: int = 5, lr: float = 0.2) -> JaxProgram:
    """``steps`` SGD steps (momentum 0.9) of the MLP on torch_workloads.mlp_train's batch and
    teacher targets, minimising the mean squared error.  Outputs as the torch twin's: the
    loss per step (before each update), the trained model's output and first-layer weight."""
    prog = tw.mlp_train(seed, batch=batch, d_in=d_in, hidden=hidden, d_out=d_out, steps=steps,
                        optimizer="sgd", lr=lr)

    def fn(p, x, target):
        def loss_fn(w):
            return jnp.mean(jnp.square(_mlp_forward(w, x) - target))

        def step(carry, _):
            w, buf = carry
            loss, g = jax.value_and_grad(loss_fn)(w)
            buf = jax.tree_util.tree_map(lambda b_, g_: SGD_MOMENTUM * b_ + g_, buf, g)
            w = jax.tree_util.tree_map(lambda w_, b_: w_ - lr * b_, w, buf)
            return (w, buf), loss
        # torch starts the momentum buffer at the first gradient: 0.9 * 0 + g is the same
        (w, _), losses = lax.scan(step, (p, jax.tree_util.tree_map(jnp.zeros_like, p)), None,
                                  length=steps)
        return {"loss": losses, "y": _mlp_forward(w, x), "w1": w["0.weight"]}
    return JaxProgram(fn, _numpy_params(prog.model), _numpy_inputs(prog.inputs), losses="loss")


def transformer_block(seed: int, batch: int = 1, seq: int = 16, d_model: int = 64, heads: int = 4,
                      d_ff: int = 128) -> JaxProgram:
    """The pre-norm block's forward pass: torch_workloads.transformer_block's weights and
    [batch, seq, d_model] input, in JAX."""
    prog = tw.transformer_block(seed, batch=batch, seq=seq, d_model=d_model, heads=heads, d_ff=d_ff)

    def fn(p, x):
        return {"y": _block_forward(p, x, heads)}
    return JaxProgram(fn, _numpy_params(prog.model), _numpy_inputs(prog.inputs))


WORKLOADS: dict[str, JaxWorkload] = {w.name: w for w in (
    JaxWorkload("mlp", "jax.numpy MLP 256-512-128, batch 64: the torch mlp's weights and input "
                "(float32 on fornax, float64 jax.jit CPU reference)", mlp),
    JaxWorkload("mlp-train", "that MLP trained 5 SGD steps (momentum 0.9) in one lax.scan: "
                "value_and_grad of the MSE, the update, losses per step", mlp_train),
    JaxWorkload("transformer-block", "pre-norm block: LayerNorm, fused QKV, 4-head softmax "
                "attention, exact GELU MLP, residuals; seq 16, d_model 64", transformer_block),
)}
DEFAULT_WORKLOAD = "mlp"


def get_workload(name: str) -> JaxWorkload:
    if name not in WORKLOADS:
        raise ConfigError(f"unknown jax workload {name!r}; available: {', '.join(WORKLOADS)}",
                          hint="see `fornax workloads`")
    return WORKLOADS[name]


# ---- running ------------------------------------------------------------------------------------
def route_delta(before: dict, after: dict) -> dict:
    """What a client recorded between two of its ``report()`` s (``before`` may be ``{}``):
    ``{"totals", "primitives", "fallbacks", "counts"}``, rows as the report's ``{primitive,
    route, count, reason}``, totals per route and the counters of
    :data:`fornax.report.JAX_COUNTS` (0 when unused).  Routes count equations as compiled
    (a scan body's once per program); the counters count what ran (every iteration)."""
    rows = rows_delta(before.get("primitives", []), after.get("primitives", []), "primitive")
    counts = {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in JAX_COUNTS}
    return {"totals": route_totals(rows, JAX_ROUTES), "primitives": rows,
            "fallbacks": [r for r in rows if r["route"] == "fallback"], "counts": counts}


def _client(stack):
    """The client a run uses: a composed Stack gets a client of its own; None, a vendor name
    or a Client go through :func:`fornax.frameworks.jax.resolve`."""
    import fornax.frameworks.jax as fj
    from ..stack import Stack

    if isinstance(stack, Stack):
        return fj.Client(stack, "fornax.scenarios.jax_workloads.run")
    return fj.resolve(stack)


def _tensors(arrays: dict) -> dict:
    return {k: torch.from_numpy(np.array(v)) for k, v in arrays.items()}


def _program(name: str, seed: int, params: dict) -> tuple[JaxProgram, dict, float]:
    """The workload's program, its float64 ``jax.jit`` CPU reference and that run's wall time."""
    wl = get_workload(name)
    known = list(inspect.signature(wl.build).parameters)[1:]
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ConfigError(f"jax workload {name} has no parameter {', '.join(unknown)}; "
                          f"it takes {', '.join(known)}")
    prog = wl.build(seed, **params)
    t0 = time.perf_counter()
    with jax.enable_x64(True):
        p64 = {k: v.astype(np.float64) for k, v in prog.params.items()}
        ref = jax.jit(prog.fn)(p64, *(x.astype(np.float64) for x in prog.inputs))
        ref = {k: np.asarray(v) for k, v in ref.items()}
    return prog, ref, time.perf_counter() - t0


def _finish(name: str, client, prog: JaxProgram, ref: dict, call: Callable, ref_wall: float,
            platform: tuple[str, str, str] | None = None) -> JaxRun:
    """Run ``call()`` (the program on fornax) and compare with the reference; the routes are
    the client's report after minus before."""
    before = client.report()
    t0 = time.perf_counter()
    try:
        out = call()
    except (RuntimeError, NotImplementedError) as exc:      # a jax error, not a fornax one
        raise NotSupportedError(
            f"jax workload {name} failed on fornax: {' '.join(str(exc).split())[:300]}",
            seam="framework", vendor=client.framework.vendor,
            hint="run with --debug for the traceback; report the primitive to the front end") from exc
    wall = time.perf_counter() - t0
    after = client.report()
    out = {k: np.asarray(v) for k, v in out.items()}
    losses = [float(v) for v in out[prog.losses]] if prog.losses else []
    ref_losses = [float(v) for v in ref[prog.losses]] if prog.losses else []
    platform = platform or (after["platform"], after["plugin"], after["platform_version"])
    delta = route_delta(before, after)
    return JaxRun(name, client.describe(), *platform, out, ref,
                  tw._numerics(_tensors(out), _tensors(ref), prog.tol), losses, ref_losses,
                  wall, ref_wall, delta)


def run(name: str, stack=None, seed: int = 0, **params) -> JaxRun:
    """Run workload ``name`` (shape parameters in ``params``) with fornax's JAX front end and
    in float64 with ``jax.jit`` on the CPU.  ``stack``: a composed Stack (a client of its own),
    a Client, a vendor name, or None (the default client).  The route accounting is the
    client's report after the run minus before it."""
    import fornax.frameworks.jax as fj

    prog, ref, ref_wall = _program(name, seed, params)
    client = _client(stack)
    jitted = fj.jit(prog.fn, stack=client, numpy=True)
    run_ = _finish(name, client, prog, ref, lambda: jitted(prog.params, *prog.inputs), ref_wall)
    run_.received = {"ir": "jaxpr", "equations": int(sum(run_.routes["totals"].values()))}
    return run_


def run_pjrt(name: str, seed: int = 0, **params) -> JaxRun:
    """Run workload ``name`` through plain ``jax.jit`` on the ``fornax`` platform of the PJRT
    plugin registered in this process (:mod:`fornax.frameworks.jax.plugin`): the arguments
    are put on its device 0, JAX lowers the function to StableHLO and hands it to the
    plugin's ``PJRT_Client_Compile``.  ``received`` counts the StableHLO the plugin was handed."""
    from ..frameworks.jax import plugin as fp

    prog, ref, ref_wall = _program(name, seed, params)
    p = fp.registered()
    pclient = p.clients[0]
    client = pclient.fornax
    device = jax.devices(fp.PLATFORM)[0]
    first = len(pclient.executables)
    jitted = jax.jit(prog.fn)
    run_ = _finish(name, client, prog, ref,
                   lambda: {k: np.asarray(v) for k, v in
                            jitted(*jax.device_put((prog.params, *prog.inputs), device)).items()}, ref_wall,
                   (fp.PLATFORM, "fornax PJRT plugin (C API from Python)", pclient.platform_version))
    kinds: Counter[str] = Counter()
    size = compile_s = 0.0
    for exe in pclient.executables[first:]:
        kinds.update(exe.compiled.ops)
        size += exe.code_bytes
        compile_s += exe.compiled.compile_s
    run_.received = {"ir": "stablehlo", "ops": int(sum(kinds.values())), "kinds": dict(sorted(kinds.items())),
                     "bytes": int(size), "compile_s": compile_s}
    return run_
