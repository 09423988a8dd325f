"""Lab 7: autograd, precision and numerical validation.

Experiments: each family's ``torch.autocast("fornax")`` policy for a handful of ATen ops
(the framework face's data, fornax/layers/face.py and each vendor.toml's
[framework.torch.autocast]); a long dot product in bfloat16 on the device against a
bfloat16 running sum and float64 (the library accumulates in float32); a gradient check of
the device's autograd against float64 on the CPU; and a short training run on each family
beside the CPU, repeated to see it is bitwise deterministic.

Exercise 7.4 imports the student's own ``policy.py`` (deliberately, as a test would) and runs
a tiny residual model with the dtype it chooses per op, live on every family, against the
same model in float32.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Any

from .lab import Exercise, Lab, Section, Table, figure, number_fact, text_fact

FAMILIES = ("cuda-like", "rocm-like", "xpu-like")
SPEC = "tiny"
#: ATen ops whose autocast CastPolicy the first table shows
OPS = ("mm", "linear", "addmm", "tanh", "add.Tensor", "softmax.int", "sum", "layer_norm", "mse_loss",
       "binary_cross_entropy")
KS = (16, 128, 1024, 4096)                    # dot-product lengths
TRAIN_STEPS = 5
RERUNS = 6                                    # calls of the split-K GEMM per mode
#: the tiny model of exercise 7.4, its ops in order, the matmuls among them, the dtypes allowed
POLICY_OPS = ("fc1", "act", "fc2", "residual", "loss")
MATMULS = ("fc1", "fc2")
DTYPES = ("float32", "bfloat16", "float16")
TOL = 0.01                                    # relative error of the loss allowed against float32

STARTER_POLICY = '''"""Lab 7, exercise 7.4: choose a dtype per op.

`fornax lab check 7` imports this file (it runs your code, as a test would) and reads POLICY:
for each op of a tiny residual model, the dtype it runs in on the fornax device ("float32",
"bfloat16" or "float16"). The check casts each op's inputs to your dtype, runs the model live
on every family, and compares the loss with the same model in float32.

The model (x: 64 x 32 activations of magnitude ~100, the residual stream; t: the target):
    fc1      h = linear(x / 100, W1, b1)        a matmul
    act      a = tanh(h)
    fc2      z = linear(a, W2, b2)              a matmul (z is small, ~1)
    residual y = x + z
    loss     mse_loss(y, t)                     (t - x is ~1 as well)

It passes when both matmuls (fc1, fc2) run in bfloat16 and the loss stays within 1% of the
float32 loss on every family.
"""

POLICY = {
    "fc1": "float32",
    "act": "float32",
    "fc2": "float32",
    "residual": "float32",
    "loss": "float32",
}
'''


# -- autocast policy: data of the framework face ---------------------------------------------------
@lru_cache(maxsize=1)
def _autocast() -> tuple[tuple[str, str, tuple[str, ...], dict[str, str], int], ...]:
    """Per family: default dtype, the dtypes it allows, the CastPolicy of each of OPS and how many
    ops run in lower precision."""
    from fornax.stack import compose, make_config
    rows = []
    for fam in FAMILIES:
        pol = compose(make_config(fam, spec=SPEC)).framework.autocast_policy()
        casts = {op: str(pol.cast(op) or "(falls through)") for op in OPS}
        low = sum(1 for p in pol.casts.values() if p == "lower_precision_fp")
        rows.append((fam, pol.default_dtype, tuple(pol.dtypes), casts, low))
    return tuple(rows)


# -- accumulation: a long dot product ----------------------------------------------------------------
@lru_cache(maxsize=1)
def _dots() -> tuple[tuple[int, float, float, float, bool], ...]:
    """Per K: relative error against float64 of a bfloat16 running sum (CPU), the device's bfloat16
    dot product and its float32 one; and whether the bfloat16 result is the float32 one rounded."""
    import torch

    import fornax.frameworks.torch as ft
    ft.use_stack(FAMILIES[0], spec=SPEC)
    gen = torch.Generator().manual_seed(7)
    rows = []
    for k in KS:
        a = (torch.rand(1, k, generator=gen) + 0.5).bfloat16()     # positive terms: the sum grows
        b = (torch.rand(k, 1, generator=gen) + 0.5).bfloat16()
        ref = (a.double() @ b.double()).item()
        acc = torch.zeros((), dtype=torch.bfloat16)
        for p in (a.ravel().float() * b.ravel().float()).bfloat16():
            acc = acc + p                                          # rounds to bfloat16 every step
        dev16 = (a.to("fornax") @ b.to("fornax")).cpu()
        dev32 = (a.float().to("fornax") @ b.float().to("fornax")).cpu()
        rows.append((k, abs(acc.item() - ref) / abs(ref), abs(dev16.double().item() - ref) / abs(ref),
                     abs(dev32.double().item() - ref) / abs(ref), bool(torch.equal(dev16, dev32.bfloat16()))))
    return tuple(rows)


# -- gradient check -----------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _gradcheck() -> tuple[tuple[str, float, float], ...]:
    """Per family: the max relative error of d/dx sum(tanh(x @ W)^2) computed by the device's
    autograd in float32 against the CPU's autograd in float64, and of the CPU's float64 gradient
    against central finite differences (torch.autograd.gradcheck's method)."""
    import torch

    import fornax.frameworks.torch as ft
    gen = torch.Generator().manual_seed(3)
    x64 = torch.randn(4, 8, generator=gen, dtype=torch.float64)
    w64 = torch.randn(8, 6, generator=gen, dtype=torch.float64) * 0.5

    def f(x: Any, w: Any) -> Any:
        return torch.tanh(x @ w).pow(2).sum()

    xr = x64.clone().requires_grad_(True)
    f(xr, w64).backward()
    assert xr.grad is not None
    ref = xr.grad
    eps = 1e-6
    fd = torch.zeros_like(x64)
    for i in range(x64.numel()):
        d = torch.zeros_like(x64).view(-1)
        d[i] = eps
        fd.view(-1)[i] = (f(x64 + d.view_as(x64), w64) - f(x64 - d.view_as(x64), w64)) / (2 * eps)
    fd_err = float(((ref - fd).abs().max() / ref.abs().max()).item())
    rows = []
    for fam in FAMILIES:
        ft.use_stack(fam, spec=SPEC)
        xd = x64.float().to("fornax").requires_grad_(True)
        f(xd, w64.float().to("fornax")).backward()
        assert xd.grad is not None
        got = xd.grad.cpu().double()
        rows.append((fam, float(((got - ref).abs().max() / ref.abs().max()).item()), fd_err))
    return tuple(rows)


# -- a short training run -----------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _training() -> tuple[tuple[str, tuple[float, ...], bool], ...]:
    """The mlp-train workload (small) on the CPU and on each family: losses per step, and whether
    a second run on the family gives bitwise the same losses."""
    import copy

    import torch

    import fornax.frameworks.torch as ft
    from fornax.scenarios.torch_workloads import mlp_train
    prog = mlp_train(seed=1, batch=16, d_in=32, hidden=64, d_out=16, steps=TRAIN_STEPS)

    def run(device: str) -> tuple[float, ...]:
        model = copy.deepcopy(prog.model).to(device)
        outs, _ = prog.step(model, tuple(t.to(device) for t in prog.inputs))
        return tuple(float(v) for v in outs["loss"].detach().cpu().tolist())

    rows = [("cpu", run("cpu"), True)]
    for fam in FAMILIES:
        ft.use_stack(fam, spec=SPEC)
        first = run("fornax")
        rows.append((fam, first, first == run("fornax")))
    del torch
    return tuple(rows)


@lru_cache(maxsize=1)
def _split_k() -> tuple[tuple[str, str, int, int, float], ...]:
    """Per family: a split-K GEMM (float32, 30 x 30 x 512) called RERUNS times through the library
    with ``deterministic`` true and false: distinct results (bit patterns) of each, and the largest
    difference between the fast results."""
    import numpy as np

    from fornax.stack import compose, make_config
    rng = np.random.default_rng(1)
    m, n, k = 30, 30, 512
    a = (rng.standard_normal((m, k)) * 10).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    rows = []
    for fam in FAMILIES:
        stack = compose(make_config(fam, spec=SPEC))
        rt = stack.runtime
        lib: Any = stack.library             # every family's library lists its GEMM algorithms (the protocol omits it)
        algo = next(x.name for x in lib.algorithms if x.split_k > 1)
        outs: dict[bool, list[Any]] = {}
        for det in (True, False):
            outs[det] = []
            for _ in range(RERUNS):
                ptrs = [rt.malloc(x.nbytes) for x in (a, b)] + [rt.malloc(4 * m * n)]
                rt.memcpy_h2d(ptrs[0], a)
                rt.memcpy_h2d(ptrs[1], b)
                lib.gemm(ptrs[0], ptrs[1], ptrs[2], {"m": m, "n": n, "k": k, "dtype": "float32",
                                                     "algorithm": algo, "deterministic": det})
                c = np.empty((m, n), np.float32)
                rt.memcpy_d2h(c, ptrs[2])
                for p in ptrs:
                    rt.free(p)
                outs[det].append(c)
        fast = outs[False]
        spread = max(float(np.abs(x - fast[0]).max()) for x in fast)
        rows.append((fam, algo, len({x.tobytes() for x in outs[True]}), len({x.tobytes() for x in fast}), spread))
    return tuple(rows)


# -- the tiny model of exercise 7.4 -----------------------------------------------------------------
@lru_cache(maxsize=1)
def _model_data() -> tuple[Any, ...]:
    import torch
    gen = torch.Generator().manual_seed(70)
    x = torch.randn(64, 32, generator=gen) * 100
    w1, b1 = torch.randn(64, 32, generator=gen) * 0.1, torch.randn(64, generator=gen) * 0.1
    w2, b2 = torch.randn(32, 64, generator=gen) * 0.1, torch.randn(32, generator=gen) * 0.1
    t = x + torch.randn(64, 32, generator=gen)
    return x, w1, b1, w2, b2, t


def run_policy(family: str, policy: dict[str, str]) -> tuple[float, dict[str, str]]:
    """The tiny model on ``family`` with each op's inputs cast to ``policy[op]``: the loss (as a
    float) and the dtype each op's result really had."""
    import torch
    import torch.nn.functional as F

    import fornax.frameworks.torch as ft
    ft.use_stack(family, spec=SPEC)
    d = {op: getattr(torch, policy[op]) for op in POLICY_OPS}
    x, w1, b1, w2, b2, t = (v.to("fornax") for v in _model_data())
    seen = {}
    h = F.linear(x.to(d["fc1"]) / 100, w1.to(d["fc1"]), b1.to(d["fc1"]))
    seen["fc1"] = h.dtype
    a = torch.tanh(h.to(d["act"]))
    seen["act"] = a.dtype
    z = F.linear(a.to(d["fc2"]), w2.to(d["fc2"]), b2.to(d["fc2"]))
    seen["fc2"] = z.dtype
    y = x.to(d["residual"]) + z.to(d["residual"])
    seen["residual"] = y.dtype
    loss = F.mse_loss(y.to(d["loss"]), t.to(d["loss"]))
    seen["loss"] = loss.dtype
    return float(loss.float().cpu().item()), {k: str(v).removeprefix("torch.") for k, v in seen.items()}


FLOAT32 = dict.fromkeys(POLICY_OPS, "float32")
#: the policies the lab's table shows (not the answer: the table shows what breaks)
SHOWN = (("all float32", FLOAT32), ("all bfloat16", dict.fromkeys(POLICY_OPS, "bfloat16")),
         ("matmuls bfloat16, loss bfloat16", {**FLOAT32, "fc1": "bfloat16", "fc2": "bfloat16", "loss": "bfloat16"}))


@lru_cache(maxsize=1)
def _policies() -> tuple[tuple[str, float, float], ...]:
    rows = []
    base = run_policy(FAMILIES[0], FLOAT32)[0]
    for name, pol in SHOWN:
        loss = run_policy(FAMILIES[0], pol)[0]
        rows.append((name, loss, abs(loss - base) / abs(base)))
    return tuple(rows)


def experiments(out: Path) -> list[Section]:
    ac, dots, grads, train, pols = _autocast(), _dots(), _gradcheck(), _training(), _policies()
    split = _split_k()
    _picture(dots, out / "accumulation.png")
    return [
        Section("Autocast: which ops run in lower precision",
                "Under `torch.autocast(\"fornax\")` each ATen op follows its family's CastPolicy "
                "(torch's names: lower_precision_fp runs the op in the autocast dtype, fp32 casts its "
                "inputs up, fp32_set_opt_dtype asks the op for a float32 result, banned refuses). The "
                "policy is data of the framework face (fornax/layers/face.py, each vendor.toml's "
                "[framework.torch.autocast]); fornax/frameworks/torch/autocast.py registers a kernel "
                "on the AutocastPrivateUse1 key for every op it names and looks up the current "
                "stack's policy at call time. Ops it does not name (tanh, add) fall through and run "
                "in whatever dtype their inputs have. The families share torch's lists; the count differs "
                "by the extra entry points a vendor.toml adds ([framework.torch.autocast.extra]).",
                [Table("autocast per family", ["family", "default dtype", "dtypes", "ops in lower precision"],
                       [[f, d, ", ".join(ds), str(n)] for f, d, ds, _, n in ac]),
                 Table("CastPolicy per op", ["op", *(f for f, *_ in ac)],
                       [[op, *(c[op] for *_, c, _ in ac)] for op in OPS])]),
        Section("bfloat16 accumulation: the error grows with K",
                "A dot product of K positive bfloat16 terms, against float64: summed in bfloat16 one "
                "term at a time (rounding after every add, on the CPU), as a bfloat16 GEMM on the "
                f"device ({FAMILIES[0]}, the library's matrix kernel: products accumulate in a float32 "
                "accumulator, only the result is rounded to bfloat16) and as a float32 GEMM. The "
                "bfloat16 running sum stops growing once the terms fall below half its spacing; the "
                "device's bfloat16 result stays within one rounding of the exact one at every K.",
                [Table("relative error against float64", ["K", "bf16 running sum", "device bf16 GEMM",
                                                          "device fp32 GEMM", "bf16 = fp32 rounded"],
                       [[str(k), f"{r:.1e}", f"{d16:.1e}", f"{d32:.1e}", "yes" if same else "no"]
                        for k, r, d16, d32, same in dots])], ["accumulation.png"]),
        Section("Gradient check against float64",
                "d/dx of sum(tanh(x @ W)^2) for x 4 x 8: the CPU's autograd in float64 checked by "
                "central finite differences (eps 1e-6, torch.autograd.gradcheck's method), and each "
                "family's autograd on the device in float32 checked against it (max error over the "
                "largest gradient). float32 agrees to ~1e-7 relative; gradcheck's own tolerances "
                "need float64.",
                [Table("gradient error", ["family", "device fp32 vs CPU fp64", "CPU fp64 vs finite differences"],
                       [[f, f"{e:.1e}", f"{fd:.1e}"] for f, e, fd in grads])]),
        Section("A short training run, and determinism",
                f"The mlp-train workload (fornax/scenarios/torch_workloads.py, batch 16, 32 -> 64 -> 16, "
                f"SGD with momentum) for {TRAIN_STEPS} steps on the CPU and on each family's device, in "
                "float32. The losses track the CPU's to float32 rounding. The simulated device runs "
                "each kernel the same way every time (a fixed reduction order; no atomics race), so "
                "a second run gives bitwise the same losses. Where order is a choice, the library says "
                "so: a split-K GEMM (fornax/layers/gemm.py, blas.py) adds K's slices in the order an "
                "order buffer gives, 0..split-1 with its `deterministic` param true (the library's "
                "default) and a per-call permutation with it false -- the same answer to float32 "
                "rounding, but not bit for bit. (torch.use_deterministic_algorithms is the framework's "
                "switch for the same promise.)",
                [Table("loss per step", ["device", *(f"step {i}" for i in range(TRAIN_STEPS)), "rerun identical"],
                       [[d, *(f"{v:.6f}" for v in ls), "yes" if same else "no"] for d, ls, same in train]),
                 Table(f"a split-K GEMM (float32, 30 x 30 x 512) called {RERUNS} times",
                       ["family", "algorithm", "distinct results, deterministic", "distinct results, fast",
                        "largest difference, fast"],
                       [[f, al, str(d), str(nd), f"{sp:.1e}"] for f, al, d, nd, sp in split])]),
        Section("Mixed precision by hand: the model of exercise 7.4",
                "A tiny residual model (fc1, tanh, fc2, a residual add of activations of magnitude "
                "~100, an MSE loss against a target within ~1 of them) run on the device with each "
                "op's inputs cast to a chosen dtype. Some choices, and the loss's error against float32. "
                "Exercise 7.4 asks for your own choice in policy.py; its check imports that file "
                "deliberately and runs it live on every family. The dtypes are applied by hand, op by "
                "op, with autocast off (torch.autocast itself would choose them by the family's "
                "policy in the first table), so the choice is yours alone.",
                [Table(f"policies on {FAMILIES[0]}", ["policy", "loss", "relative error"],
                       [[n, f"{v:.5f}", f"{e:.1e}"] for n, v, e in pols])]),
    ]


def _picture(dots: Any, path: Path) -> None:
    fig = figure(6, 3.4)
    ax = fig.subplots()
    ks = [r[0] for r in dots]
    for i, (label, style) in enumerate((("bf16 running sum", "o-"), ("device bf16 GEMM (fp32 accumulate)", "s-"),
                                        ("device fp32 GEMM", "^-")), start=1):
        ax.plot(ks, [max(r[i], 1e-12) for r in dots], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("K (terms in the dot product)")
    ax.set_ylabel("relative error vs float64")
    ax.legend(fontsize=8)
    fig.savefig(path, format="png", dpi=90)


def facts() -> dict[str, Any]:
    ac, dots, train = _autocast(), _dots(), _training()
    casts = {f: c for f, _, _, c, _ in ac}
    acc = "float32" if all(same for *_, same in dots) else "bfloat16"
    return {"mse_policy": casts["cuda-like"]["mse_loss"], "accumulate": acc,
            "xpu_last_loss": next(ls[-1] for d, ls, _ in train if d == "xpu-like")}


def _load_policy(path: Path) -> Any:
    """The student's POLICY from ``path`` (their code, imported as a test would)."""
    spec = importlib.util.spec_from_file_location(f"fornax_lab07_policy_{abs(hash(str(path)))}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not hasattr(mod, "POLICY"):
        raise TypeError("policy.py defines no POLICY")
    return mod.POLICY


def _check_policy(answers: dict[str, Any], folder: Path, facts: dict[str, Any]) -> tuple[bool, str, str]:
    """policy.py's POLICY runs fc1 and fc2 in bfloat16 and keeps the loss within TOL on every family."""
    want = f"fc1 and fc2 in bfloat16 and the loss within {TOL:.0%} of float32, on every family"
    path = folder / "policy.py"
    if not path.is_file():
        return False, want, "no policy.py"
    try:
        policy = _load_policy(path)
    except Exception as exc:          # noqa: BLE001 - the student's module may raise anything
        msg = str(exc).splitlines()[0][:160] if str(exc) else ""
        return False, want, f"policy.py does not import: {type(exc).__name__}: {msg}"
    if not isinstance(policy, dict):
        return False, want, f"POLICY is a {type(policy).__name__}, not a dict of op -> dtype"
    missing = [op for op in POLICY_OPS if op not in policy]
    if missing:
        return False, want, f"POLICY names no dtype for {', '.join(missing)}"
    bad = {op: policy[op] for op in POLICY_OPS if policy[op] not in DTYPES}
    if bad:
        op, v = next(iter(bad.items()))
        return False, want, f"POLICY[{op!r}] is {v!r}, not one of {', '.join(DTYPES)}"
    seen = []
    for fam in FAMILIES:
        try:
            base = run_policy(fam, FLOAT32)[0]
            loss, ran = run_policy(fam, {op: str(policy[op]) for op in POLICY_OPS})
        except Exception as exc:      # noqa: BLE001 - a dtype the device refuses is an answer, not a crash
            msg = str(exc).splitlines()[0][:160] if str(exc) else ""
            return False, want, f"{fam}: the model raised {type(exc).__name__}: {msg}"
        where = ", ".join(f"{op} {dt}" for op, dt in ran.items())
        err = abs(loss - base) / abs(base)
        slow = [op for op in MATMULS if ran[op] != "bfloat16"]
        if slow:
            return False, want, f"{fam}: {', '.join(slow)} ran in {ran[slow[0]]} (ops ran: {where})"
        if err > TOL:
            return False, want, (f"{fam}: loss {loss:.5f} against float32's {base:.5f}, relative error "
                                 f"{err:.1e} > {TOL:g} (ops ran: {where})")
        seen.append(f"{fam} {err:.1e}")
    return True, want, f"matmuls in bfloat16; relative error of the loss: {', '.join(seen)}"


LAB = Lab(
    number=7, slug="07-autograd-and-precision", title="Autograd, precision and numerical validation",
    part="Part 7",
    goal="Read each family's autocast policy, see why bfloat16 GEMMs accumulate in float32, check the "
         "device's gradients and a short training run against the CPU, and choose a dtype per op so "
         "that a model's matmuls run in bfloat16 while its loss stays close to float32.",
    minutes=30, experiments=experiments, facts=facts,
    exercises=[
        Exercise("7.1", "Which CastPolicy does the cuda-like autocast policy give aten::mse_loss (torch's "
                 "name, e.g. lower_precision_fp)?", text_fact("7.1", "mse_policy"),
                 "fornax/layers/face.py TORCH_AUTOCAST and fornax/frameworks/torch/autocast.py"),
        Exercise("7.2", "In which dtype does the library accumulate a bfloat16 GEMM's products (the "
                 "table's last column tells)?", text_fact("7.2", "accumulate"),
                 "the library seam's GEMM: the accumulator dtype of the ISA's matrix multiply-accumulate "
                 "(fornax/sim/isa.py)"),
        Exercise("7.3", "What is the last step's loss of the training run on xpu-like (within 0.1%)?",
                 number_fact("7.3", "xpu_last_loss", rel=0.001),
                 "the mlp-train workload in fornax/scenarios/torch_workloads.py"),
        Exercise("7.4", "Write policy.py (in this folder, written by `fornax lab new`): its POLICY gives "
                 "each op of the tiny residual model a dtype so that fc1 and fc2 run in bfloat16 and the "
                 "loss stays within 1% of float32 on every family. The check imports your policy.py and "
                 "runs the model with it, deliberately, as a test would.", _check_policy,
                 "which op loses the residual's small part: bfloat16's spacing at ~100 is 0.5 "
                 "(fornax/frameworks/torch/autocast.py: what autocast leaves in float32)", points=2),
    ],
    starter_files={"policy.py": STARTER_POLICY})
