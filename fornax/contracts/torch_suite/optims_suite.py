"""Every OptimInfo of PyTorch's ``optim_db`` on the fornax device, against the CPU.

``@optims(optim_db)`` parametrizes over OptimInfos (float32).  The configurations are
``optim_inputs_func`` plus the implementation flags PyTorch's own helper adds for the device
(``_get_optim_inputs_including_global_cliquey_kwargs``: ``foreach`` where the device has
foreach kernels, which PyTorch grants every PrivateUse1 backend), and ``fused=True`` for
the optimizers whose fused kernel PyTorch ships for the CPU (the reference).  Each
configuration is one sample: three steps on a small linear model (a sparse embedding for
the sparse-only optimizer), the same seeded data on both devices; the parameters after
every step must match the CPU's.  Optimizers that evaluate a closure many times per step
(LBFGS) minimise a well-conditioned least-squares loss instead: on the linear model's
non-convex loss LBFGS is chaotic, and moving the CPU's own initial parameters by one
float32 ulp moves its result by up to 14 after two steps, so no comparison could mean
anything there (on the least-squares loss the same perturbation moves it by under 1e-5,
except through the strong-Wolfe line search's decisions).  Variants: ``step`` (plain), ``foreach``, ``fused``.
``capturable`` configurations run with ``capturable=False`` on the CPU (the CPU refuses
it; the arithmetic is the same).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_optimizers import (
    OptimizerInput, _get_optim_inputs_including_global_cliquey_kwargs, optim_db, optims)
from torch.testing._internal.common_utils import TestCase
from torch.utils._pytree import tree_map

import fornax.frameworks.torch  # noqa: F401  (the device, even without the autoload entry point)

from . import compare, harness, selection
from .record import Check

harness.install()

DEVICE = "fornax"
STEPS = 3
SELECTED = selection.select("optims", optim_db, lambda o: o.name)


def configurations(info, device) -> list[OptimizerInput]:
    inputs = _get_optim_inputs_including_global_cliquey_kwargs(device, torch.float32, info, skip=("differentiable",))
    if "fused" in info.supported_impls and "cpu" in info.supports_fused_on \
            and not any(i.kwargs.get("fused") for i in inputs):
        # PyTorch's own optim_inputs functions pass params=None (the test fills them in), but
        # OptimizerInput's annotation does not admit None
        inputs += [OptimizerInput(params=None,  # type: ignore[arg-type]
                                  kwargs={**i.kwargs, "fused": True, "foreach": False},
                                  desc=f"{i.desc} fused") for i in info.optim_inputs_func(device)]
    return inputs


def variant_of(kwargs) -> str:
    return "fused" if kwargs.get("fused") else "foreach" if kwargs.get("foreach") else "step"


def _params(device, with_bias: bool):
    gen = torch.Generator().manual_seed(0)
    ps = [torch.randn(4, 3, generator=gen), torch.randn(3, 5, generator=gen)]
    if with_bias:
        ps.append(torch.randn(4, generator=gen))
    return [p.to(device).requires_grad_(True) for p in ps]


def _loss(info, params, step: int):
    gen = torch.Generator().manual_seed(100 + step)
    dev = params[0].device
    if info.step_requires_closure:
        return _least_squares(params, dev)
    if info.only_supports_sparse_grads:
        idx = torch.randint(0, 4, (6,), generator=gen).to(dev)
        return F.embedding(idx, params[0], sparse=True).pow(2).sum() + F.embedding(
            idx.remainder(3), params[1], sparse=True).pow(2).sum()
    x = torch.randn(5, 2, generator=gen).to(dev)
    y = params[0] @ (params[1] @ x)
    if len(params) > 2:
        y = y + params[2][:, None]
    return (y.tanh() ** 2).sum()


def _least_squares(params, dev):
    """A convex least-squares loss, the same at every step (what a closure optimizer
    minimises); each parameter fits its own targets."""
    gen = torch.Generator().manual_seed(7)
    loss = 0
    for p in params:
        if p.dim() == 1:
            loss = loss + ((p - torch.randn(p.shape, generator=gen).to(dev)) ** 2).sum()
            continue
        x = torch.randn(p.shape[1], 32, generator=gen).to(dev)
        loss = loss + ((p @ x - torch.randn(p.shape[0], 32, generator=gen).to(dev)) ** 2).sum()
    return 0.5 * loss


def _trajectory(info, kwargs, device, with_bias: bool) -> list:
    params = _params(device, with_bias)
    opt = info.optim_cls(params, **kwargs)
    seen = []
    for step in range(STEPS):
        def closure():
            opt.zero_grad()
            loss = _loss(info, params, step)
            loss.backward()
            return loss
        if info.step_requires_closure:
            opt.step(closure)
        else:
            closure()
            opt.step()
        seen.append([p.detach().cpu().clone() for p in params])
    return seen


def _cpu_kwargs(kwargs):
    kw = tree_map(lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) else x, dict(kwargs))
    if kw.get("capturable"):
        kw["capturable"] = False
    return kw


def check_config(info, config) -> str | None:
    cpu_kwargs = _cpu_kwargs(config.kwargs)
    with_bias = True
    try:
        want = _trajectory(info, cpu_kwargs, "cpu", with_bias)
    except ValueError:                 # optimizers of matrices only (Muon) refuse the bias
        with_bias = False
        try:
            want = _trajectory(info, cpu_kwargs, "cpu", with_bias)
        except Exception as exc:
            return None if "fused" in config.kwargs else f"CPU refused the configuration: {compare.short(exc)}"
    except Exception as exc:
        return None if config.kwargs.get("fused") else f"CPU refused the configuration: {compare.short(exc)}"
    try:
        got = _trajectory(info, config.kwargs, DEVICE, with_bias)
    except Exception as exc:
        return compare.short(exc)
    for step, (g, w) in enumerate(zip(got, want)):
        why = compare.close(g, w, {})
        if why.startswith(compare.WITHIN):
            return compare.WITHIN + f"after step {step + 1}: " + why.removeprefix(compare.WITHIN)
        if why:
            return f"after step {step + 1}: {why}"
    return ""


class TestFornaxOptims(TestCase):
    @optims(SELECTED, dtypes=[torch.float32])
    def test_steps(self, device, dtype, optim_info):
        configs = configurations(optim_info, device)
        by_variant: dict[str, list] = {}
        for c in configs:
            by_variant.setdefault(variant_of(c.kwargs), []).append(c)
        checks = []
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning)
            for variant, group in by_variant.items():
                check = Check("optims", optim_info.name, "float32", variant)
                entry = check.entry_for()
                limit = selection.sample_limit(entry is not None)
                compare.TOLERANCE = entry.tolerance if entry is not None else None
                try:
                    for i, config in enumerate(group):
                        if limit is not None and check.run >= limit:
                            break
                        check.add(check_config(optim_info, config), f"{config.desc} {config.kwargs}")
                finally:
                    compare.TOLERANCE = None
                checks.append(check)
        failures = []
        for check in checks:       # every variant is recorded before the first verdict raises
            try:
                check.finish()
            except BaseException as exc:     # pytest's outcomes (xfail, skip) too
                failures.append(exc)
        for failure in failures:
            if isinstance(failure, AssertionError):
                raise failure
        if failures:
            raise failures[0]


instantiate_device_type_tests(TestFornaxOptims, globals(), only_for="fornax")
