"""Real JAX ecosystem programs (``equinox`` models, ``optax`` optimisers) through
:func:`fornax.frameworks.jax.jit`, each checked against ``jax.jit`` on the CPU.

Every program is written once against a ``jit`` argument: :func:`run_program` runs it with
``jax.jit`` (the CPU reference) and with ``fornax.frameworks.jax.jit`` on a fresh client of
the chosen vendor family, then compares every output leaf and collects the client's route
accounting (which primitives ran on the device, which fell back to the host and why).

Equinox modules are pytrees whose leaves include non-arrays (activation functions, static
sizes): a program splits a model with ``eqx.partition(model, eqx.is_array)`` and closes
its jitted function over the static half, so only arrays cross ``jit``.  Models are built
from small configurations with random weights from ``jax.random.key(seed)``; nothing is
downloaded.

* ``cnn`` — Conv2d → ReLU → MaxPool2d → Conv2d → ReLU → MaxPool2d (padded, overlapping
  windows) → Linear on a batch of 4 one-channel 12x12 images (``jax.vmap`` over the
  per-example model): the logits, and the cross-entropy loss and its gradient with
  ``eqx.filter_value_and_grad`` (max-pooling forward is ``reduce_window_max``, its
  gradient ``select_and_scatter_add``).
* ``attention`` — a pre-norm block: LayerNorm → ``eqx.nn.MultiheadAttention`` (2 heads) →
  residual → LayerNorm → ``eqx.nn.MLP`` (GELU) → residual over 2 sequences of 8 tokens of
  width 16: the output, and the loss and gradient.
* ``gru-scan`` — ``eqx.nn.GRUCell`` (8 → 16) run over 10 time steps by ``lax.scan``, a
  Linear read-out of the last state: the outputs, and the loss and gradient (the scan's
  body and its transpose are driven from the host around compiled segments).
* ``adamw-cosine`` — the ``cnn`` model trained 4 steps by ``optax.adamw`` (weight decay
  1e-2) under ``optax.warmup_cosine_decay_schedule`` (warm-up 2 steps to 1e-2, cosine
  decay over 6): the loss of every step and the final parameters.
* ``sgd-momentum-schedule`` — an ``eqx.nn.MLP`` regression trained 5 steps by
  ``optax.sgd`` (momentum 0.9, Nesterov off) under a piecewise schedule
  (``optax.join_schedules``: constant 0.05 for 2 steps, then ``optax.exponential_decay``
  by 0.5 per step, staircase): the losses and the final parameters.

A training program jits one step ``(params, opt_state, batch) -> (params, opt_state, loss)``
and calls it from a Python loop, as a training script does; the optimiser state
(including its int32 step counter) stays a pytree of arrays.

:func:`run_program` returns a :class:`ZooResult`: per output its largest absolute error
and its error scaled by the reference's largest magnitude (the normwise error of
:mod:`fornax.scenarios.workloads`), the tolerance, the host fallbacks with their reasons,
and ``ok`` (every output within tolerance and no host fallback).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from ..layers.errors import ConfigError, FornaxError
from ..report import rows_delta
from ..stack import BUILTIN_FAMILIES

#: the vendor families the zoo runs on
FAMILIES = BUILTIN_FAMILIES


# ---- programs ------------------------------------------------------------------------------------
def _cross_entropy(logits, labels):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), labels[:, None], axis=-1))


class CNN(eqx.Module):
    """Two conv + max-pool stages and a linear classifier, for one (C, H, W) image."""

    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    pool1: eqx.nn.MaxPool2d
    pool2: eqx.nn.MaxPool2d
    head: eqx.nn.Linear

    def __init__(self, key, channels: int = 1, size: int = 12, classes: int = 5):
        k1, k2, k3 = jax.random.split(key, 3)
        self.conv1 = eqx.nn.Conv2d(channels, 4, 3, padding=1, key=k1)
        self.pool1 = eqx.nn.MaxPool2d(2, 2)                       # 12 -> 6
        self.conv2 = eqx.nn.Conv2d(4, 6, 3, padding=1, key=k2)
        self.pool2 = eqx.nn.MaxPool2d(3, 2, padding=1)            # 6 -> 3, overlapping windows
        self.head = eqx.nn.Linear(6 * (size // 4) ** 2, classes, key=k3)

    def __call__(self, x):
        x = self.pool1(jax.nn.relu(self.conv1(x)))
        x = self.pool2(jax.nn.relu(self.conv2(x)))
        return self.head(jnp.ravel(x))


def _cnn_data(seed: int, batch: int = 4, size: int = 12, classes: int = 5):
    kx, ky = jax.random.split(jax.random.key(seed + 1))
    return (jax.random.normal(kx, (batch, 1, size, size), jnp.float32),
            jax.random.randint(ky, (batch,), 0, classes, jnp.int32))


def _classifier_loss(model, x, y):
    return _cross_entropy(jax.vmap(model)(x), y)


def cnn(jit: Callable, seed: int) -> dict:
    params, static = eqx.partition(CNN(jax.random.key(seed)), eqx.is_array)
    x, y = _cnn_data(seed)

    def forward(p, x):
        return jax.vmap(eqx.combine(p, static))(x)

    def loss_and_grad(p, x, y):
        return eqx.filter_value_and_grad(_classifier_loss)(eqx.combine(p, static), x, y)

    loss, grads = jit(loss_and_grad)(params, x, y)
    return {"logits": jit(forward)(params, x), "loss": loss, "grads": grads}


class Block(eqx.Module):
    """Pre-norm transformer block over one (seq, d) sequence."""

    norm1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP

    def __init__(self, key, d: int = 16, heads: int = 2):
        k1, k2 = jax.random.split(key)
        self.norm1 = eqx.nn.LayerNorm(d)
        self.attn = eqx.nn.MultiheadAttention(heads, d, key=k1)
        self.norm2 = eqx.nn.LayerNorm(d)
        self.mlp = eqx.nn.MLP(d, d, 2 * d, 1, activation=jax.nn.gelu, key=k2)

    def __call__(self, x):
        h = jax.vmap(self.norm1)(x)
        x = x + self.attn(h, h, h)
        return x + jax.vmap(self.mlp)(jax.vmap(self.norm2)(x))


def attention(jit: Callable, seed: int) -> dict:
    params, static = eqx.partition(Block(jax.random.key(seed)), eqx.is_array)
    kx, kt = jax.random.split(jax.random.key(seed + 1))
    x = jax.random.normal(kx, (2, 8, 16), jnp.float32)
    target = jax.random.normal(kt, (2, 8, 16), jnp.float32)

    def forward(p, x):
        return jax.vmap(eqx.combine(p, static))(x)

    def loss_and_grad(p, x, t):
        return eqx.filter_value_and_grad(lambda m: jnp.mean((jax.vmap(m)(x) - t) ** 2))(eqx.combine(p, static))

    loss, grads = jit(loss_and_grad)(params, x, target)
    return {"out": jit(forward)(params, x), "loss": loss, "grads": grads}


class GRU(eqx.Module):
    """A GRU cell unrolled by ``lax.scan`` over a (time, features) sequence, a linear read-out."""

    cell: eqx.nn.GRUCell
    head: eqx.nn.Linear

    def __init__(self, key, d_in: int = 8, hidden: int = 16, d_out: int = 3):
        k1, k2 = jax.random.split(key)
        self.cell = eqx.nn.GRUCell(d_in, hidden, key=k1)
        self.head = eqx.nn.Linear(hidden, d_out, key=k2)

    def __call__(self, xs):
        def step(h, x):
            h = self.cell(x, h)
            return h, h
        h, hs = lax.scan(step, jnp.zeros(self.cell.hidden_size, xs.dtype), xs)
        return self.head(h), hs


def gru_scan(jit: Callable, seed: int) -> dict:
    params, static = eqx.partition(GRU(jax.random.key(seed)), eqx.is_array)
    kx, kt = jax.random.split(jax.random.key(seed + 1))
    xs = jax.random.normal(kx, (10, 8), jnp.float32)
    target = jax.random.normal(kt, (3,), jnp.float32)

    def forward(p, xs):
        return eqx.combine(p, static)(xs)

    def loss_and_grad(p, xs, t):
        return eqx.filter_value_and_grad(lambda m: jnp.sum((m(xs)[0] - t) ** 2))(eqx.combine(p, static))

    out, states = jit(forward)(params, xs)
    loss, grads = jit(loss_and_grad)(params, xs, target)
    return {"out": out, "states": states, "loss": loss, "grads": grads}


def _train(jit: Callable, params, static, optimiser, loss_fn, batch, steps: int) -> dict:
    """``steps`` optimiser steps, each one jitted call from a Python loop."""
    def step(p, state, *batch):
        loss, grads = jax.value_and_grad(lambda q: loss_fn(eqx.combine(q, static), *batch))(p)
        updates, state = optimiser.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    jitted = jit(step)
    state = optimiser.init(params)
    losses = []
    for _ in range(steps):
        params, state, loss = jitted(params, state, *batch)
        losses.append(loss)
    return {"losses": jnp.stack(losses), "params": params, "opt_state": state}


def adamw_cosine(jit: Callable, seed: int) -> dict:
    params, static = eqx.partition(CNN(jax.random.key(seed)), eqx.is_array)
    schedule = optax.warmup_cosine_decay_schedule(init_value=0.0, peak_value=1e-2, warmup_steps=2,
                                                  decay_steps=6, end_value=1e-3)
    return _train(jit, params, static, optax.adamw(schedule, weight_decay=1e-2), _classifier_loss,
                  _cnn_data(seed), steps=4)


def sgd_momentum_schedule(jit: Callable, seed: int) -> dict:
    key, kx, kw = jax.random.split(jax.random.key(seed), 3)
    model = eqx.nn.MLP(6, 2, 12, 2, activation=jax.nn.tanh, key=key)
    params, static = eqx.partition(model, eqx.is_array)
    x = jax.random.normal(kx, (16, 6), jnp.float32)
    y = jnp.tanh(x @ jax.random.normal(kw, (6, 2), jnp.float32))
    schedule = optax.join_schedules(
        [optax.constant_schedule(0.05),
         optax.exponential_decay(0.05, transition_steps=1, decay_rate=0.5, staircase=True)],
        boundaries=[2])
    optimiser = optax.sgd(schedule, momentum=0.9)
    return _train(jit, params, static, optimiser,
                  lambda m, x, y: jnp.mean((jax.vmap(m)(x) - y) ** 2), (x, y), steps=5)


@dataclass(frozen=True)
class ZooProgram:
    name: str
    description: str
    run: Callable[[Callable, int], dict]      # (jit, seed) -> named outputs (pytrees of arrays)
    tolerance: float = 1e-4                   # normwise: max|y - ref| / max|ref|, per output


ZOO: dict[str, ZooProgram] = {p.name: p for p in (
    ZooProgram("cnn", "equinox Conv2d/MaxPool2d/Linear classifier: logits, loss and gradient", cnn),
    ZooProgram("attention", "equinox LayerNorm + MultiheadAttention + MLP block: output, loss and gradient",
               attention),
    ZooProgram("gru-scan", "equinox GRUCell over lax.scan: outputs, loss and gradient", gru_scan),
    ZooProgram("adamw-cosine", "the CNN trained 4 steps by optax.adamw under a warm-up cosine schedule",
               adamw_cosine),
    ZooProgram("sgd-momentum-schedule", "an equinox MLP trained 5 steps by optax.sgd (momentum 0.9) under a "
               "constant-then-exponential-decay schedule", sgd_momentum_schedule),
)}


# ---- running -------------------------------------------------------------------------------------
@dataclass
class ZooResult:
    """One program on one family against ``jax.jit`` on the CPU."""

    name: str
    vendor: str
    tolerance: float
    errors: dict = field(default_factory=dict)       # output -> {"max_abs", "normwise", "leaves"}
    fallbacks: list = field(default_factory=list)    # the client's fallback rows
    routes: dict = field(default_factory=dict)       # equations per route
    device_primitives: list = field(default_factory=list)   # primitives lowered to device segments
    counts: dict = field(default_factory=dict)       # executions, segments, host loop iterations
    wall_s: float = 0.0
    reference_wall_s: float = 0.0
    error: str = ""                                  # the exception, when the program failed

    @property
    def ok(self) -> bool:
        return (not self.error and bool(self.errors) and not self.fallbacks
                and all(e["normwise"] <= self.tolerance for e in self.errors.values()))

    @property
    def worst(self) -> tuple[str, float]:
        """(output, normwise error) of the output furthest from the reference."""
        if not self.errors:
            return "", float("inf")
        name = max(self.errors, key=lambda k: self.errors[k]["normwise"])
        return name, self.errors[name]["normwise"]

    def to_json(self) -> dict:
        return {"program": self.name, "vendor": self.vendor, "ok": self.ok, "tolerance": self.tolerance,
                "errors": self.errors, "fallbacks": self.fallbacks, "routes": self.routes,
                "device_primitives": self.device_primitives, "counts": self.counts,
                "wall_s": round(self.wall_s, 3), "reference_wall_s": round(self.reference_wall_s, 3),
                "error": self.error}


def _compare(got, ref) -> dict:
    """Largest absolute and normwise error over the leaves of one output pytree."""
    g, r = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(ref)
    if len(g) != len(r):
        raise AssertionError(f"{len(g)} leaves against the reference's {len(r)}")
    max_abs, scale = 0.0, 0.0
    for a, b in zip(g, r):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            raise AssertionError(f"a leaf of shape {a.shape} against the reference's {b.shape}")
        if b.size:
            max_abs = max(max_abs, float(np.max(np.abs(a - b))))
            scale = max(scale, float(np.max(np.abs(b))))
    return {"max_abs": max_abs, "normwise": max_abs / scale if scale else max_abs, "leaves": len(r)}


def get_program(name: str) -> ZooProgram:
    if name not in ZOO:
        raise ConfigError(f"unknown jax zoo program {name!r}; available: {', '.join(ZOO)}",
                          hint="see fornax.scenarios.jax_zoo.ZOO")
    return ZOO[name]


@functools.cache
def _reference(name: str, seed: int) -> tuple[dict, float]:
    """A program's outputs under ``jax.jit`` on the CPU (as host arrays) and its wall time;
    computed once per process and shared by the families."""
    cpu = jax.devices("cpu")[0]
    t0 = time.perf_counter()
    with jax.default_device(cpu), jax.enable_x64(False):    # the programs are float32
        ref = ZOO[name].run(jax.jit, seed)
        ref = jax.tree_util.tree_map(np.asarray, ref)
    return ref, time.perf_counter() - t0


def run_program(name: str, vendor: str = "cuda-like", seed: int = 0, stack=None,
                route: str = "jaxpr") -> ZooResult:
    """Run zoo program ``name`` through ``fornax.frameworks.jax.jit`` on a fresh client of
    ``vendor`` (or of the composed ``stack``, any mix of seams) and through ``jax.jit`` on
    the CPU; compare every output.

    ``route="pjrt"``: through plain ``jax.jit`` on the ``fornax`` platform of the PJRT plugin
    registered in this process (:mod:`fornax.frameworks.jax.plugin`; ``vendor`` must be its
    family): every argument is put on ``jax.devices("fornax")[0]`` and JAX hands the plugin
    StableHLO.  The routes and counts are those of this program's calls alone."""
    import fornax.frameworks.jax as fj

    if route == "pjrt":
        return _run_pjrt(name, vendor, seed)
    if route != "jaxpr":
        raise ConfigError(f"unknown jax zoo route {route!r}; available: jaxpr, pjrt")
    prog = get_program(name)
    if stack is None and vendor not in FAMILIES:
        raise ConfigError(f"unknown vendor family {vendor!r} for the jax zoo; available: {', '.join(FAMILIES)}")
    label = stack.describe() if stack is not None else vendor
    result = ZooResult(name, label, prog.tolerance)
    ref, result.reference_wall_s = _reference(name, seed)
    client = fj.Client(stack, "fornax qualify") if stack is not None else fj.Client.for_vendor(vendor)
    t0 = time.perf_counter()
    try:
        with jax.enable_x64(False):       # float32 programs, whatever the process's flag
            got = prog.run(functools.partial(fj.jit, stack=client), seed)
    except (FornaxError, RuntimeError, ValueError, TypeError, AssertionError) as exc:
        # a failing program is a result (named, with the exception), not a crash of the sweep
        result.error = f"{type(exc).__name__}: {exc}"
        got = None
    result.wall_s = time.perf_counter() - t0
    _account(result, client.report())
    _compare_outputs(result, got, ref)
    return result


_COUNTS = ("executions", "segments_run", "host_fallback_runs", "host_loop_iterations")


def _account(result: ZooResult, report: dict, before: dict | None = None) -> None:
    """The result's routes and counts from a client report (less ``before``'s, a report of
    the same client taken before the program ran)."""
    rows = rows_delta((before or {}).get("primitives", []), report["primitives"], "primitive")
    result.fallbacks = [{"primitive": r["primitive"], "count": r["count"], "reason": r["reason"]}
                        for r in rows if r["route"] == "fallback"]
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["route"]] = totals.get(r["route"], 0) + int(r["count"])
    result.routes = totals
    result.device_primitives = sorted(r["primitive"] for r in rows if r["route"] == "native")
    result.counts = {k: int(report.get(k, 0)) - int((before or {}).get(k, 0)) for k in _COUNTS}


def _run_pjrt(name: str, vendor: str, seed: int) -> ZooResult:
    from fornax.frameworks.jax import plugin as fp

    prog = get_program(name)
    p = fp.registered()
    if p.settings.vendor != vendor:
        raise ConfigError(f"the PJRT plugin of this process composes {p.settings.vendor}, not {vendor}",
                          hint="one plugin per process: run each family in its own process")
    result = ZooResult(name, vendor, prog.tolerance)
    ref, result.reference_wall_s = _reference(name, seed)
    device = jax.devices(fp.PLATFORM)[0]
    client = p.clients[0].fornax
    before = client.report()

    def jit(fn, **kw):
        jitted = jax.jit(fn, **kw)
        return lambda *args: jitted(*jax.device_put(args, device))

    t0 = time.perf_counter()
    got = None
    try:
        # the model is built on the CPU in the reference's context, so JAX's caches of those
        # small CPU programs serve both runs; every jitted step goes to the fornax device
        with jax.default_device(jax.devices("cpu")[0]), jax.enable_x64(False):
            got = prog.run(jit, seed)
            got = jax.tree_util.tree_map(np.asarray, got)
    except (FornaxError, RuntimeError, SystemError, ValueError, TypeError, AssertionError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.wall_s = time.perf_counter() - t0
    _account(result, client.report(), before)
    _compare_outputs(result, got, ref)
    return result


def _compare_outputs(result: ZooResult, got, ref) -> None:
    if got is not None:
        for key in ref:
            try:
                result.errors[key] = _compare(got[key], ref[key])
            except AssertionError as exc:
                result.error = f"output {key!r}: {exc}"


def run_all(vendors=FAMILIES, names=None, seed: int = 0) -> list[ZooResult]:
    """Every program (or ``names``) on every family of ``vendors``."""
    return [run_program(n, v, seed) for n in (names or ZOO) for v in vendors]
