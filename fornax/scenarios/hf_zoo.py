"""The ``transformers`` zoo on the ``fornax`` device of a family, against PyTorch on the CPU.

:data:`ZOO` holds eight real architectures (see :mod:`.hf_models`: GPT-2 with tied
embeddings, a GQA + RoPE Llama, a BERT classifier, T5, ViT, Mixtral, ResNet, Mamba), each
built from a small configuration with seeded random weights. :func:`run_model` runs one
of them on one family and compares it with the same model (same weights, same inputs) on
the CPU in float32, mode by mode:

* ``eager`` — ``model.to("fornax")`` (the user's path; tied parameters must stay tied:
  the device model has exactly the CPU model's named parameters), forward in training
  mode with labels, ``loss.backward()``: the loss, the logits and the gradient of every
  parameter, by name;
* ``compile`` — the same through ``torch.compile(model, backend="fornax")`` (Dynamo's
  caches are reset first, so every run really compiles on the active stack);
* ``generate`` — greedy ``model.generate()`` (no sampling) in evaluation mode, for the
  generative models: the tokens must be identical;
* ``train`` — 3 steps of ``torch.optim.AdamW`` (lr 1e-2, weight decay 1e-2, eps 1e-6: see
  ``EPS``): the loss of every step, then every parameter and floating-point buffer
  (batch-norm running statistics) after the last step.

A tensor matches when ``max|device - cpu| <= ATOL + RTOL * max|cpu|`` (normwise: float32
kernels may sum in another order than the CPU's), with ATOL 1e-5 and RTOL 1e-4 for
outputs, gradients and losses; parameters and buffers after training get ``TRAIN_ATOL``
1e-3, a tenth of one AdamW step (AdamW amplifies the rounding of gradient elements near
its ``EPS``: see there). Tokens and other integer tensors must be identical (their error
is the number of elements that differ). Each mode reports the largest absolute error, the
tensor whose error is the largest fraction of its allowance (``worst_tensor``, e.g.
``grad:model.layers.0.mlp.up_proj.weight``), the error that stopped it if any, and the
front end's CPU fallbacks during the run (``fallbacks``: op, count, reason).

The CPU reference of a model does not depend on the family: :func:`reference` computes it
once per process and every family's run compares with the same one.
"""

from __future__ import annotations

import contextlib
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from ..layers.errors import ConfigError
from ..report import rows_delta
from .hf_models import MODELS, ZooModel
from ..stack import BUILTIN_FAMILIES

if TYPE_CHECKING:                                  # transformers is imported where a model is built
    from transformers import GenerationMixin

ZOO: dict[str, ZooModel] = MODELS
MODES = ("eager", "compile", "generate", "train")
ATOL = 1e-5
RTOL = 1e-4
# AdamW divides each gradient element by its running RMS + EPS. It so amplifies the float32
# rounding of a gradient element near EPS (checked at ATOL/RTOL by the eager mode) by up to
# LR / EPS, and makes a gradient that is mathematically zero, only rounding noise on either
# device (a key-projection bias: softmax ignores a shift of all scores; ~1e-11 here), a step
# whose sign is noise: ~1e-5 with the default eps 1e-8, < 1e-7 with 1e-6 (a common
# fine-tuning setting). Trained parameters and buffers are compared with TRAIN_ATOL, a tenth
# of one step (the losses keep ATOL).
EPS = 1e-6
TRAIN_ATOL = 1e-3
TRAIN_STEPS = 3
LR = 1e-2
WEIGHT_DECAY = 1e-2


@dataclass
class ModeResult:
    """One mode of one model on one family."""

    ok: bool
    max_error: float | None = 0.0
    worst_tensor: str | None = None
    error: str | None = None
    seconds: float = 0.0
    fallbacks: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"ok": self.ok, "max_error": self.max_error, "worst_tensor": self.worst_tensor,
                "error": self.error, "seconds": round(self.seconds, 3),
                "fallbacks": self.fallbacks}


@dataclass
class ModelResult:
    """A model's modes on one family; ``ok`` when every mode run matched the CPU."""

    model: str
    vendor: str
    modes: dict[str, ModeResult] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(m.ok for m in self.modes.values())

    def failures(self) -> dict[str, ModeResult]:
        return {k: m for k, m in self.modes.items() if not m.ok}

    def to_json(self) -> dict:
        return {"model": self.model, "vendor": self.vendor, "ok": self.ok,
                "modes": {k: m.to_json() for k, m in self.modes.items()}}


class Mismatch(AssertionError):
    """The device computed something else than the CPU (or something of another shape)."""


def _atol(name: str) -> float:
    return TRAIN_ATOL if name.startswith(("param:", "buffer:")) else ATOL


def _compare(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> ModeResult:
    """Compare named tensors; the result names the one furthest outside its allowance."""
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing or extra:
        return ModeResult(False, None, (missing or extra)[0],
                          f"tensors differ by name: missing on fornax {missing}, "
                          f"only on fornax {extra}")
    worst, worst_ratio, max_error = None, -1.0, 0.0
    for name, ref in want.items():
        out = got[name]
        if out.shape != ref.shape or out.dtype != ref.dtype:
            return ModeResult(False, None, name,
                              f"{name}: fornax gave {out.dtype}{list(out.shape)}, "
                              f"CPU {ref.dtype}{list(ref.shape)}")
        if not ref.is_floating_point():
            err = float((out != ref).sum())
            ratio = float("inf") if err else 0.0
        else:
            if not torch.isfinite(out).all() and torch.isfinite(ref).all():
                return ModeResult(False, None, name, f"{name}: fornax gave non-finite values")
            diff = (out.double() - ref.double()).abs()
            err = float(diff.max()) if diff.numel() else 0.0
            scale = float(ref.abs().max()) if ref.numel() else 0.0
            ratio = err / (_atol(name) + RTOL * scale)
        max_error = max(max_error, err)
        if ratio > worst_ratio:
            worst, worst_ratio = name, ratio
    ok = worst_ratio <= 1.0
    if ok or worst is None:                    # (worst is None only when nothing was compared)
        return ModeResult(ok, max_error, worst, None)
    return ModeResult(ok, max_error, worst, f"{worst} differs from CPU beyond atol={_atol(worst)}, rtol={RTOL}")


def _cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, dict):
        return {k: _cpu(v) for k, v in x.items()}
    return x


def _to(batch: dict, device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def _forward_backward(model: nn.Module, batch: dict, call=None) -> dict[str, torch.Tensor]:
    """Loss, logits and every parameter's gradient (by name) of one training step;
    ``call`` (a compiled wrapper of ``model``) runs the forward when given."""
    model.train()
    model.zero_grad(set_to_none=True)
    out = (model if call is None else call)(**batch)
    out.loss.backward()
    got = {"loss": out.loss, "logits": out.logits}
    for name, p in model.named_parameters():
        got[f"grad:{name}"] = p.grad if p.grad is not None else torch.zeros_like(p)
    return {k: _cpu(v) for k, v in got.items()}


def _generate(zoo: ZooModel, model: nn.Module, device) -> dict[str, torch.Tensor]:
    assert zoo.prompt is not None, f"{zoo.name} does not generate"
    model.eval()
    with torch.no_grad():
        generative = cast("GenerationMixin", model)     # a model with a prompt is a generative one
        tokens = generative.generate(**_to(zoo.prompt(), device), max_new_tokens=zoo.max_new_tokens,
                                     do_sample=False, num_beams=1)
    return {"tokens": _cpu(tokens)}


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    got: dict[str, torch.Tensor] = {f"param:{n}": p for n, p in model.named_parameters()}
    got.update({f"buffer:{n}": b for n, b in model.named_buffers() if b.is_floating_point()})
    return {k: _cpu(v) for k, v in got.items()}


def _train(model: nn.Module, batch: dict) -> dict[str, torch.Tensor]:
    """``TRAIN_STEPS`` AdamW steps: every loss, then the final parameters and buffers."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, eps=EPS)
    got = {}
    for step in range(TRAIN_STEPS):
        opt.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        got[f"loss:step{step}"] = _cpu(loss)
    got.update(_state(model))
    return got


_REFERENCES: dict[tuple[str, str], dict[str, torch.Tensor]] = {}


def reference(name: str, mode: str) -> dict[str, torch.Tensor]:
    """The CPU result of one mode of a model (computed once per process; ``compile``
    compares with the eager CPU result: the compiled model computes the same function)."""
    zoo = _zoo(name)
    key = (name, "eager" if mode == "compile" else mode)
    if key not in _REFERENCES:
        model = zoo.build()
        if key[1] == "eager":
            _REFERENCES[key] = _forward_backward(model, zoo.batch())
        elif key[1] == "generate":
            _REFERENCES[key] = _generate(zoo, model, "cpu")
        else:
            _REFERENCES[key] = _train(model, zoo.batch())
    return _REFERENCES[key]


def _zoo(name: str) -> ZooModel:
    if name not in ZOO:
        raise ConfigError(f"unknown zoo model {name!r}; the zoo has {', '.join(ZOO)}")
    return ZOO[name]


def _device_model(zoo: ZooModel) -> nn.Module:
    """The model moved by ``.to("fornax")``, as a user does; ties must survive."""
    cpu: nn.Module = zoo.build()
    want = [n for n, _ in cpu.named_parameters()]
    model = cpu.to("fornax")
    got = [n for n, _ in model.named_parameters()]
    if got != want:
        lost = sorted(set(got) - set(want))
        raise Mismatch(f'model.to("fornax") changed the parameters: {len(want)} on CPU, '
                       f"{len(got)} on fornax (untied: {lost})")
    for a, b in zoo.tied:
        if model.get_parameter(a) is not model.get_parameter(b):
            raise Mismatch(f'model.to("fornax") untied {a} from {b}')
    return model


def _run_mode(zoo: ZooModel, mode: str) -> dict[str, torch.Tensor]:
    model = _device_model(zoo)
    batch = _to(zoo.batch(), "fornax")
    if mode == "eager":
        return _forward_backward(model, batch)
    if mode == "compile":
        torch._dynamo.reset()
        try:
            compiled = torch.compile(model, backend="fornax", fullgraph=False, dynamic=False)
            return _forward_backward(model, batch, compiled)
        finally:
            torch._dynamo.reset()
    if mode == "generate":
        return _generate(zoo, model, "fornax")
    return _train(model, batch)


def run_model(name: str, vendor: str | None, modes=MODES) -> ModelResult:
    """Run ``modes`` of zoo model ``name`` on family ``vendor`` and compare with the CPU.

    ``vendor`` switches the ``fornax`` device to that family's stack (``use_stack``);
    ``None`` keeps the active stack (a composed or configured one: ``fornax qualify``),
    reported under its description. ``generate`` is skipped (not reported) for a model
    that does not generate. A mode that raises is a failure whose ``error`` is the
    exception (type, message, innermost fornax frame); the other modes still run."""
    from ..frameworks.torch import current, report, use_stack

    zoo = _zoo(name)
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ConfigError(f"unknown zoo mode(s) {bad}; modes are {', '.join(MODES)}")
    if vendor is not None:
        use_stack(vendor)
    result = ModelResult(name, vendor or current().describe())
    with _quiet_clients():
        for mode in modes:
            if mode == "generate" and not zoo.generative:
                continue
            start = time.perf_counter()
            try:
                want = reference(name, mode)
                before = report()["fallbacks"]
                got = _run_mode(zoo, mode)
                res = _compare(got, want)
                res.fallbacks = rows_delta(before, report()["fallbacks"], "op")
            except Exception as exc:                      # noqa: BLE001 - reported per mode
                res = ModeResult(False, None, None, _describe(exc))
            res.seconds = time.perf_counter() - start
            result.modes[mode] = res
    return result


@contextlib.contextmanager
def _quiet_clients():
    """transformers' notices (no Mamba kernel package, so its reference PyTorch path runs)
    and Dynamo's note on transformers' lru_cache helpers are about the libraries, not the
    device: keep them out of a run's output."""
    import transformers
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Dynamo detected a call to a `functools.lru_cache`")
            yield
    finally:
        transformers.logging.set_verbosity(level)


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f"{f.filename.split('site-packages/')[-1]}:{f.lineno}"
                  for f in reversed(frames) if "fornax" in f.filename), None)
    text = f"{type(exc).__name__}: {exc}".strip()
    if len(text) > 600:
        text = text[:600] + "..."
    return f"{text} (at {where})" if where else text


def run_zoo(vendors=BUILTIN_FAMILIES, models=None,
            modes=MODES) -> list[ModelResult]:
    """Every model (or ``models``) on every family in ``vendors``."""
    return [run_model(name, vendor, modes) for vendor in vendors for name in (models or ZOO)]


__all__ = ["MODES", "ZOO", "ModeResult", "ModelResult", "ZooModel", "reference", "run_model",
           "run_zoo"]
