"""Workloads written as real ``torch.nn`` programs, run on the ``fornax`` device.

Each workload is built from one seed and run twice: on the CPU in float64 (the
reference: the same module and inputs, upcast with ``.double()``) and on
``torch.device("fornax")`` in float32, through whichever stack the torch front end
(:mod:`fornax.frameworks.torch`) serves.  The result (:class:`TorchRun`) holds the
outputs, their error against the reference (normwise, as the graph workloads'
numerics), the losses per step for the training workload, the host wall time of the
device run and the front end's route accounting for this run only (calls per ATen
op and route, CPU fallbacks with their reasons).

* ``mlp`` — Linear(256, 512) → ReLU → Linear(512, 128) on a batch of 64, with the
  very weights and input of the graph workload ``mlp`` of
  :mod:`fornax.scenarios.workloads` (same seed → same numbers), so the two front
  ends can be compared op for op.
* ``mlp-train`` — that MLP trained for a few SGD (momentum) or AdamW steps on a
  fixed regression batch (targets from a random teacher network); the loss falls.
* ``transformer-block`` — a pre-norm block: LayerNorm → multi-head self-attention
  with ``F.scaled_dot_product_attention`` → residual → LayerNorm → GELU MLP →
  residual.
* ``conv-net`` — Conv2d → BatchNorm2d → ReLU → MaxPool2d → Conv2d → BatchNorm2d →
  ReLU → AdaptiveAvgPool2d → Linear, forward, cross-entropy and backward
  (BatchNorm in training mode: batch statistics, running statistics updated).

Modes: only ``eager`` (every ATen op dispatched one by one to the device) exists
today; the model reaches the device in exactly one place (:func:`_on_device`), where
a compiled mode (``torch.compile(backend="fornax")``) will wrap it.

Honest limits: the default shapes of ``transformer-block`` and ``conv-net`` are
smaller than the graph workloads' because the simulator executes every kernel for
real and eager mode launches one or more kernels per ATen op; shapes are parameters.
A run switches the process's ``fornax`` device to the given stack (a new front-end
session); tensors made on an earlier stack must be moved to the CPU first.
"""

from __future__ import annotations

import copy
import inspect
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..layers.errors import ConfigError, FornaxError, NotSupportedError
from ..layers.graph import DType
from ..report import TORCH_ROUTES, route_totals, rows_delta
from .workloads import TOLERANCE
from .workloads import mlp as graph_mlp

MODES = ("eager",)


@dataclass
class Program:
    """What a workload runs: a float32 CPU module, its CPU inputs, and ``step(model, inputs)
    -> (outputs, losses)``, which runs on whatever device and dtype the model and inputs have."""

    model: nn.Module
    inputs: tuple
    step: Callable[[nn.Module, tuple], tuple[dict, list]]
    tol: float = TOLERANCE[DType.FLOAT32]


@dataclass(frozen=True)
class TorchWorkload:
    name: str
    description: str
    build: Callable[..., Program]          # (seed, **shape parameters) -> Program


@dataclass
class TorchRun:
    """One workload run on the fornax device against its float64 CPU reference."""

    workload: str
    mode: str
    stack: str                             # the front-end session's stack, in words
    outputs: dict[str, torch.Tensor]       # device results, back on the CPU (float32)
    reference: dict[str, torch.Tensor]     # the float64 CPU results
    numerics: list[dict]                   # as fornax.scenarios.workloads.numerics
    losses: list[float] = field(default_factory=list)
    reference_losses: list[float] = field(default_factory=list)
    host_wall_s: float = 0.0               # device run: upload, compute, download (host clock)
    reference_wall_s: float = 0.0          # the float64 CPU run (host clock)
    routes: dict = field(default_factory=dict)   # {"totals", "ops", "fallbacks"} of this run

    @property
    def ok(self) -> bool:
        return all(n["ok"] for n in self.numerics)


# ---- the workloads -----------------------------------------------------------------------------
def _seeded(seed: int, build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` with torch's default initialisation drawn from ``seed``, leaving the
    process's generator as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def _mlp_module(seed: int, batch: int, d_in: int, hidden: int, d_out: int):
    """The graph ``mlp`` workload's weights and input as an nn.Sequential (nn.Linear keeps
    its weight as [out, in]: the graph's [in, out] matrix transposed)."""
    graph, feeds = graph_mlp(seed, batch=batch, d_in=d_in, hidden=hidden, d_out=d_out)
    w1, b1, w2, b2 = (torch.from_numpy(np.array(v.const, np.float32)) for v in graph.constants)
    first, second = nn.Linear(d_in, hidden), nn.Linear(hidden, d_out)
    model = nn.Sequential(first, nn.ReLU(), second)
    with torch.no_grad():
        for layer, w, b in ((first, w1, b1), (second, w2, b2)):
            layer.weight.copy_(w.T)
            layer.bias.copy_(b)
    return model, torch.from_numpy(feeds["x"])


def mlp(seed: int, batch: int = 64, d_in: int = 256, hidden: int = 512, d_out: int = 128) -> Program:
    """y = Linear(ReLU(Linear(x))): the graph ``mlp`` workload, written with torch.nn."""
    model, x = _mlp_module(seed, batch, d_in, hidden, d_out)

    def step(m, inputs):
        with torch.no_grad():
            return {"y": m(inputs[0])}, []
    return Program(model, (x,), step)


def mlp_train(seed: int, batch: int = 64, d_in: int = 256, hidden: int = 512, d_out: int = 128,
              steps: int = 5, optimizer: str = "sgd", lr: float | None = None) -> Program:
    """``steps`` optimiser steps of the MLP on one fixed batch: MSE against the outputs of a
    random teacher MLP.  ``optimizer`` is ``sgd`` (momentum 0.9, default lr 0.2) or ``adamw``
    (default lr 3e-3).  Outputs: the losses per step, the trained model's output on the batch
    and the trained first-layer weight."""
    if optimizer not in ("sgd", "adamw"):
        raise ConfigError(f"mlp-train: unknown optimizer {optimizer!r}; use sgd or adamw")
    if steps < 2:
        raise ConfigError(f"mlp-train: steps must be at least 2 to see the loss fall, got {steps}")
    model, x = _mlp_module(seed, batch, d_in, hidden, d_out)
    teacher = _seeded(seed + 1, lambda: nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(),
                                                      nn.Linear(hidden, d_out)))
    with torch.no_grad():
        target = 2.0 * teacher(x)
    rate = lr if lr is not None else (0.2 if optimizer == "sgd" else 3e-3)

    def step(m, inputs):
        xb, yb = inputs
        opt = (torch.optim.SGD(m.parameters(), lr=rate, momentum=0.9) if optimizer == "sgd"
               else torch.optim.AdamW(m.parameters(), lr=rate))
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            loss = F.mse_loss(m(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        with torch.no_grad():
            y = m(xb)
        return {"loss": torch.stack(losses), "y": y, "w1": m[0].weight.detach()}, losses
    return Program(model, (x, target), step)


class Block(nn.Module):
    """A pre-norm transformer block: h = x + attn(ln1(x)); y = h + mlp(ln2(h)).

    Attention is written out: one fused QKV projection, heads split with view +
    transpose, ``F.scaled_dot_product_attention`` (non-causal), heads merged, output
    projection; the MLP is Linear → GELU → Linear."""

    def __init__(self, d_model: int, heads: int, d_ff: int):
        super().__init__()
        if d_model % heads:
            raise ConfigError(f"transformer-block: d_model {d_model} is not a multiple of heads {heads}")
        self.heads = heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.norm1(x)).split(d, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v)
        h = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return h + self.fc2(F.gelu(self.fc1(self.norm2(h))))


def transformer_block(seed: int, batch: int = 1, seq: int = 16, d_model: int = 64, heads: int = 4,
                      d_ff: int = 128) -> Program:
    """The block's forward pass on a [batch, seq, d_model] input.  The graph workload's
    sizes (seq 64, d_model 256, d_ff 512) are these parameters away; the defaults are
    smaller to keep CLI runs quick (every kernel really executes in the simulator)."""
    model = _seeded(seed, lambda: Block(d_model, heads, d_ff))
    x = torch.randn(batch, seq, d_model, generator=torch.Generator().manual_seed(seed))

    def step(m, inputs):
        with torch.no_grad():
            return {"y": m(inputs[0])}, []
    return Program(model, (x,), step)


def conv_net(seed: int, batch: int = 4, channels: int = 3, size: int = 8, width: int = 4,
             classes: int = 10) -> Program:
    """A small CNN on [batch, channels, size, size] images: forward, cross-entropy against
    fixed labels, backward.  Outputs: logits, loss, every parameter's gradient, the input's
    gradient and the first BatchNorm's updated running statistics."""
    if size % 2:
        raise ConfigError(f"conv-net: size must be even (one 2x2 max-pool), got {size}")

    def build():
        return nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, classes))
    model = _seeded(seed, build)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, channels, size, size, generator=gen)
    labels = torch.randint(0, classes, (batch,), generator=gen)

    def step(m, inputs):
        xb, yb = inputs
        xb = xb.detach().requires_grad_(True)
        logits = m(xb)
        loss = F.cross_entropy(logits, yb)
        loss.backward()
        out = {"logits": logits.detach(), "loss": loss.detach(), "grad.input": xb.grad}
        out.update({f"grad.{n}": p.grad for n, p in m.named_parameters()})
        out["bn1.running_mean"] = m[1].running_mean
        out["bn1.running_var"] = m[1].running_var
        return out, [loss.detach()]
    return Program(model, (x, labels), step)


WORKLOADS: dict[str, TorchWorkload] = {w.name: w for w in (
    TorchWorkload("mlp", "torch.nn MLP 256-512-128, batch 64: the graph mlp's weights and input "
                  "(float32 on the device, float64 CPU reference)", mlp),
    TorchWorkload("mlp-train", "that MLP trained 5 SGD steps (momentum 0.9) on a fixed regression "
                  "batch: forward, MSE loss, backward, optimizer step; losses per step", mlp_train),
    TorchWorkload("transformer-block", "pre-norm block: LayerNorm, 4-head attention "
                  "(scaled_dot_product_attention), GELU MLP, residuals; seq 16, d_model 64",
                  transformer_block),
    TorchWorkload("conv-net", "Conv2d-BatchNorm2d-ReLU-MaxPool, Conv2d-BatchNorm2d-ReLU-AvgPool, "
                  "Linear on 4x3x8x8 images: forward, cross-entropy, backward", conv_net),
)}
DEFAULT_WORKLOAD = "mlp"


def get_workload(name: str) -> TorchWorkload:
    if name not in WORKLOADS:
        raise ConfigError(f"unknown torch workload {name!r}; available: {', '.join(WORKLOADS)}",
                          hint="see `fornax workloads`")
    return WORKLOADS[name]


# ---- running ------------------------------------------------------------------------------------
def _on_device(model: nn.Module, mode: str) -> nn.Module:
    """The module as the fornax device runs it (eager: moved, nothing else)."""
    return model.to("fornax")


def _cast(x, dtype):
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.to(dtype)
    return x


def route_delta(before: dict, after: dict) -> dict:
    """What the front end recorded between two ``fornax.frameworks.torch.report()``s of one
    session: ``{"totals", "ops", "fallbacks"}`` with the same row shape as the report's."""
    old = before.get("ops", []) if before.get("session") == after.get("session") else []
    ops = rows_delta(old, after["ops"], "op")
    return {"totals": route_totals(ops, TORCH_ROUTES), "ops": ops,
            "fallbacks": [r for r in ops if r["route"] == "fallback"]}


def _numerics(outputs: dict, reference: dict, tol: float) -> list[dict]:
    """Each output against the float64 reference: max abs error and normwise relative error
    (max |y - ref| / max |ref|), as :func:`fornax.scenarios.workloads.numerics`."""
    rows = []
    for name, got in outputs.items():
        ref = reference[name].detach().to(torch.float64)
        g = got.detach().to(torch.float64)
        if g.shape != ref.shape:
            max_abs, finite = float("inf"), False
        else:
            diff = (g - ref).abs()
            max_abs = float(diff.max()) if diff.numel() else 0.0
            finite = bool(torch.isfinite(g).all())
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        max_rel = max_abs / scale if scale > 0 else max_abs
        rows.append({"output": name, "dtype": str(got.dtype).removeprefix("torch."),
                     "shape": list(got.shape), "max_abs_err": max_abs, "max_rel_err": max_rel,
                     "tol": tol, "ok": finite and max_rel <= tol})
    return rows


def run(name: str, stack=None, seed: int = 0, mode: str = "eager", **params) -> TorchRun:
    """Run workload ``name`` (shape parameters in ``params``) on the fornax device and in float64
    on the CPU.  With ``stack`` (a composed :class:`fornax.stack.Stack`) the device switches to a
    fresh front-end session on it; without, the active session is used.  The route accounting
    covers this run only either way."""
    import fornax.frameworks.torch as ft

    if mode not in MODES:
        raise ConfigError(f"unknown torch mode {mode!r}; available: {', '.join(MODES)}")
    wl = get_workload(name)
    known = list(inspect.signature(wl.build).parameters)[1:]
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ConfigError(f"torch workload {name} has no parameter {', '.join(unknown)}; "
                          f"it takes {', '.join(known)}")
    if stack is not None and getattr(stack.config, "meta", False):
        raise ConfigError("the torch device computes real values; a shape-only (meta) stack "
                          "cannot back it", hint="compose the stack with meta off")
    prog = wl.build(seed, **params)

    t0 = time.perf_counter()
    ref_model = copy.deepcopy(prog.model).double()
    ref_out, ref_losses = prog.step(ref_model, tuple(_cast(x, torch.float64) for x in prog.inputs))
    ref_wall = time.perf_counter() - t0

    session = ft.use_stack(stack=stack) if stack is not None else ft.current()
    before = session.report()
    t0 = time.perf_counter()
    try:
        dev_model = _on_device(copy.deepcopy(prog.model), mode)
        out, losses = prog.step(dev_model, tuple(x.to("fornax") for x in prog.inputs))
        out = {k: v.detach().cpu() for k, v in out.items()}
        losses = [float(v) for v in losses]
    except FornaxError:
        raise
    except (RuntimeError, NotImplementedError) as exc:
        raise NotSupportedError(
            f"torch workload {name} failed on the fornax device: {' '.join(str(exc).split())[:300]}",
            seam="framework", vendor=session.framework.vendor,
            hint="run with --debug for the traceback; report the op to the front end") from exc
    wall = time.perf_counter() - t0
    return TorchRun(name, mode, session.describe(), out, ref_out,
                    _numerics(out, ref_out, prog.tol), losses, [float(v) for v in ref_losses],
                    wall, ref_wall, route_delta(before, session.report()))
