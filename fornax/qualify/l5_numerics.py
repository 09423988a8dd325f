"""L5, numerics and autocast: float32 within float32 tolerance of float64 references;
``torch.autocast('fornax')`` in the family's policy dtype; bfloat16 within bfloat16
tolerance; PyTorch's OptimInfos step as on CPU; the real models train and generate as on CPU."""

from __future__ import annotations

import numpy as np

from ..contracts.clause import Outcome
from .clients import suite_outcome, zoo_outcome
from .levels import TOL, evidence
from .measure import as_numpy, fmt, normwise
from .subject import StackSubject


@evidence("L5", "float32", "float32 matmul, softmax and layer_norm are within float32 tolerance of "
          "float64 references", seam="library", measured="worst normwise error vs float64",
          relation="<=", limit=TOL["float32"], dtype="float32",
          shape="matmul [16, 64] @ [64, 16]; softmax [8, 33]; layer_norm [8, 32]")
def _l5_float32(s: StackSubject) -> Outcome:
    import torch
    s.torch()
    g = torch.Generator().manual_seed(s.config.seed + 50)
    a, b = torch.randn(16, 64, generator=g), torch.randn(64, 16, generator=g)
    z = torch.randn(8, 33, generator=g) * 4
    y = torch.randn(8, 32, generator=g) * 3 + 1
    w, bias = torch.randn(32, generator=g), torch.randn(32, generator=g)
    a64, b64, z64, y64 = (t.double().numpy() for t in (a, b, z, y))
    e = np.exp(z64 - z64.max(-1, keepdims=True))
    mu, var = y64.mean(-1, keepdims=True), y64.var(-1, keepdims=True)
    ln = (y64 - mu) / np.sqrt(var + 1e-5) * w.double().numpy() + bias.double().numpy()
    D = "fornax"
    pairs = {
        "matmul": (a.to(D) @ b.to(D), a64 @ b64),
        "softmax": (torch.softmax(z.to(D), -1), e / e.sum(-1, keepdims=True)),
        "layer_norm": (torch.nn.functional.layer_norm(y.to(D), (32,), w.to(D), bias.to(D)), ln),
    }
    for name, (got, _) in pairs.items():
        if got.dtype != torch.float32:
            raise AssertionError(f"{name} returned {got.dtype}, not float32")
    errs = {n: normwise(as_numpy(got), ref) for n, (got, ref) in pairs.items()}
    worst = max(errs, key=lambda n: errs[n])
    return Outcome(errs[worst], errs[worst] <= TOL["float32"],
                   ", ".join(f"{n} {fmt(v)}" for n, v in errs.items()))


@evidence("L5", "autocast", "torch.autocast('fornax') runs a matmul in the family's policy dtype, "
          "within that dtype's tolerance", seam="framework",
          measured="normwise error vs float64 of the dtype-rounded inputs", relation="<=",
          limit="float16 9.8e-04 / bfloat16 7.8e-03", dtype="float32 in, policy dtype out",
          shape="[16, 64] @ [64, 16]")
def _l5_autocast(s: StackSubject) -> Outcome:
    import torch
    session = s.torch()
    policy = session.framework.autocast_policy()
    lowered = policy.cast("aten::mm") == "lower_precision_fp"
    want = policy.default_dtype if lowered else "float32"
    g = torch.Generator().manual_seed(s.config.seed + 51)
    a, b = torch.randn(16, 64, generator=g), torch.randn(64, 16, generator=g)
    with torch.autocast("fornax"):
        mm = a.to("fornax") @ b.to("fornax")
    got = str(mm.dtype).removeprefix("torch.")
    problems = []
    if torch.get_autocast_dtype("fornax") != getattr(torch, policy.default_dtype):
        problems.append(f"torch.get_autocast_dtype('fornax') is {torch.get_autocast_dtype('fornax')}, "
                        f"the family's policy says {policy.default_dtype}")
    if got != want:
        problems.append(f"the matmul ran in {got}; the family's policy "
                        f"({policy.dispatch_key}: mm -> {policy.cast('aten::mm')}) says {want}")
    dt = getattr(torch, got)
    ref = a.to(dt).double().numpy() @ b.to(dt).double().numpy()
    err = normwise(as_numpy(mm), ref)
    limit = TOL.get(got, TOL["float32"])
    if err > limit:
        problems.append(f"normwise error {fmt(err)} exceeds the {got} limit {fmt(limit)}")
    detail = (f"policy {policy.dispatch_key}: mm -> {policy.cast('aten::mm')}, default dtype "
              f"{policy.default_dtype}; the matmul ran in {got}; error {fmt(err)} (limit {fmt(limit)})")
    return Outcome(err, not problems, "; ".join(problems) or detail)


@evidence("L5", "bfloat16", "a bfloat16 matmul is within bfloat16 tolerance of float64",
          seam="library", measured="normwise error vs float64 of the bfloat16 inputs", relation="<=",
          limit=TOL["bfloat16"], dtype="bfloat16", shape="[16, 64] @ [64, 16]")
def _l5_bfloat16(s: StackSubject) -> Outcome:
    import torch
    s.torch()
    g = torch.Generator().manual_seed(s.config.seed + 52)
    a = torch.randn(16, 64, generator=g).bfloat16()
    b = torch.randn(64, 16, generator=g).bfloat16()
    out = a.to("fornax") @ b.to("fornax")
    if out.dtype != torch.bfloat16:
        raise AssertionError(f"a bfloat16 matmul returned {out.dtype}")
    err = normwise(as_numpy(out), a.double().numpy() @ b.double().numpy())
    return Outcome(err, err <= TOL["bfloat16"], f"normwise error {fmt(err)} "
                   f"(one bfloat16 rounding is <= {2.0 ** -8:.1e})")


@evidence("L5", "optiminfo", "PyTorch's OptimInfo database: optimizer steps match CPU (foreach and "
          "fused where the family claims them)", seam="framework", measured="checks passing",
          relation="==", limit=1.0, dtype="float32", shape="optim_db configurations")
def _l5_optiminfo(s: StackSubject) -> Outcome:
    return suite_outcome(s, "optims")


@evidence("L5", "zoo_training", "the models train: 3 AdamW steps (losses and final parameters) and "
          "greedy generate() (token-identical) match CPU", seam="framework",
          measured="models matching CPU", relation="==", limit="all", dtype="float32",
          shape="small configs, random weights")
def _l5zoo_outcome(s: StackSubject) -> Outcome:
    return zoo_outcome(s, ("train", "generate"))
