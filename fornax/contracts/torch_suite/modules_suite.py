"""Every ModuleInfo of PyTorch's ``module_db`` on the fornax device, against the CPU.

``@modules(module_db)`` parametrizes over ModuleInfos and training/eval mode (float32);
each module input of ``module_inputs_func`` is one sample of each check:

* forward: a module built on the CPU from a seed, ``deepcopy``'d and ``.to("fornax")``,
  gives the CPU's outputs (same RNG seed for dropout-like modules);
* backward: a seeded cotangent per output; gradients of every parameter and every input;
* to: ``.to("fornax")``, ``.cpu()`` and ``.to(torch.float64)`` keep each Parameter object
  (identity) and an alias registered under a second name (a tie), and the values;
* state_dict: the fornax module's ``state_dict`` (on fornax) loaded into a freshly
  initialised fornax module gives back the same values, and survives ``torch.save`` /
  ``torch.load``;
* deepcopy: a deep copy of the fornax module is on fornax, owns its own storage and gives
  the same outputs.
"""

from __future__ import annotations

import copy
import io
import warnings

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_modules import module_db, modules
from torch.testing._internal.common_utils import TestCase
from torch.nn.parameter import is_lazy
from torch.utils._pytree import tree_flatten, tree_map

import fornax.frameworks.torch  # noqa: F401  (the device, even without the autoload entry point)

from . import compare, harness, selection
from .record import Check

harness.install()

DEVICE = "fornax"
SELECTED = selection.select("modules", module_db, lambda m: m.name)


def _dev(x):
    return x.detach().to(DEVICE).requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x


def _tensors(x) -> list:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _close(got, want) -> str:
    """"" when ``got`` matches ``want`` at PyTorch's tolerances, else why not (see
    :func:`.compare.close`: a covering tolerance entry's bounds apply)."""
    return compare.close(tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, got), want, {})


class Case:
    """One module input: the CPU module, its fornax copy and the forward arguments."""

    def __init__(self, info, mi, seed: int, training: bool):
        self.info, self.mi, self.seed, self.training = info, mi, seed, training
        cargs, ckwargs = mi.constructor_input.args, mi.constructor_input.kwargs
        harness.seed(seed)
        self.cpu = info.module_cls(*cargs, **ckwargs).train(training)
        self.build = lambda: info.module_cls(*cargs, **ckwargs)
        self.dev = copy.deepcopy(self.cpu).to(DEVICE)
        self.args, self.kwargs = mi.forward_input.args, mi.forward_input.kwargs

    def run(self, module, device):
        if device == "cpu":
            args, kwargs = self.args, self.kwargs
        else:        # one fornax leaf per CPU tensor: an input passed twice stays one tensor
            moved: dict[int, torch.Tensor] = {}
            args, kwargs = tree_map(lambda x: moved.setdefault(id(x), _dev(x)) if isinstance(x, torch.Tensor) else x,
                                    (self.args, self.kwargs))
        harness.seed(self.seed)
        return module(*args, **kwargs), (args, kwargs)


def _both(cpu_fn, dev_fn, compare_fn):
    """Run both sides; where the CPU raises, fornax must raise the same exception type."""
    try:
        want = cpu_fn()
    except Exception as cpu_exc:
        try:
            dev_fn()
        except Exception as dev_exc:
            return "" if type(dev_exc) is type(cpu_exc) else \
                f"CPU raised {compare.short(cpu_exc)}; fornax raised {compare.short(dev_exc)}"
        return f"CPU raised {compare.short(cpu_exc)}; fornax raised nothing"
    return compare_fn(dev_fn(), want)


def check_forward(case: Case) -> str | None:
    with torch.no_grad():
        return _both(lambda: case.run(case.cpu, "cpu")[0], lambda: case.run(case.dev, DEVICE)[0], _close)


def _grads(case: Case, module, device):
    out, (args, kwargs) = case.run(module, device)
    outs = [o for o in _tensors(out) if o.requires_grad and o.is_floating_point()]
    leaves = [p for p in module.parameters() if p.requires_grad] + \
             [t for t in _tensors((args, kwargs)) if t.requires_grad]
    if not outs or not leaves:
        return None
    gen = torch.Generator().manual_seed(case.seed)
    loss = sum((o * torch.randn(o.shape, generator=gen).to(o.device)).sum() for o in outs)
    return torch.autograd.grad(loss, leaves, allow_unused=True)


def _same_grads(got, want) -> str | None:
    if want is None:
        return None
    if got is None or [g is None for g in got] != [g is None for g in want]:
        return "the fornax module's gradients are not defined where the CPU module's are"
    return _close([g for g in got if g is not None], [g for g in want if g is not None])


def check_backward(case: Case) -> str | None:
    return _both(lambda: _grads(case, case.cpu, "cpu"), lambda: _grads(case, case.dev, DEVICE), _same_grads)


def _holder(module):
    """``module`` in a container that also registers its first parameter under a second name."""
    holder = torch.nn.Module()
    holder.inner = module
    first = next(iter(module.parameters()), None)
    if first is not None:
        holder.register_parameter("tied", first)
    return holder


def check_to(case: Case) -> str | None:
    holder = _holder(copy.deepcopy(case.cpu))
    ids = [id(p) for _, p in holder.named_parameters(remove_duplicate=False)]
    for step, fn, want_device, want_dtype in (
            ('.to("fornax")', lambda m: m.to(DEVICE), DEVICE, None),
            (".cpu()", lambda m: m.cpu(), "cpu", None),
            ('.to(torch.float64)', lambda m: m.to(torch.float64), "cpu", torch.float64),
            ('.to("fornax") again', lambda m: m.to(DEVICE), DEVICE, torch.float64)):
        fn(holder)
        params = [p for _, p in holder.named_parameters(remove_duplicate=False)]
        if [id(p) for p in params] != ids:
            return f"{step} replaced Parameter objects (identity and ties are lost)"
        if hasattr(holder, "tied") and holder.tied is not next(iter(holder.inner.parameters())):
            return f"{step} untied a parameter registered under two names"
        bad = [p for p in params if p.device.type != want_device or (want_dtype and p.is_floating_point()
                                                                     and p.dtype != want_dtype)]
        if bad:
            return f"{step}: a parameter is {bad[0].dtype} on {bad[0].device}"
    pairs = list(zip(holder.inner.parameters(), case.cpu.parameters()))
    if [is_lazy(g) for g, _ in pairs] != [is_lazy(w) for _, w in pairs]:
        return "a lazy module's uninitialised parameter did not stay uninitialised through the moves"
    pairs = [(g, w) for g, w in pairs if not is_lazy(w)]       # nothing to compare before the first forward
    return _close([g for g, _ in pairs], [w.detach().to(torch.float64) for _, w in pairs])


def _materialised(case: Case) -> None:
    """A lazy module's first forward (from the same seed on both sides), so that its state
    holds real tensors to save, load and copy."""
    if any(is_lazy(p) for p in case.cpu.parameters()):
        with torch.no_grad():
            case.run(case.cpu, "cpu")
            case.run(case.dev, DEVICE)


def check_state_dict(case: Case) -> str | None:
    _materialised(case)
    sd = case.dev.state_dict()
    if any(t.device.type != DEVICE for t in _tensors(sd)):
        return "state_dict() of a fornax module holds tensors off fornax"
    harness.seed(case.seed + 1)
    fresh = case.build().to(DEVICE)
    fresh.load_state_dict(sd)
    err = _close(fresh.state_dict(), case.cpu.state_dict())
    if err:
        return f"load_state_dict: {err}"
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    if any(t.device.type != DEVICE for t in _tensors(loaded)):
        return "torch.load put a fornax state_dict's tensors off fornax"
    err = _close(loaded, case.cpu.state_dict())
    return f"torch.save/torch.load: {err}" if err else ""


def check_deepcopy(case: Case) -> str | None:
    _materialised(case)
    dup = copy.deepcopy(case.dev)
    for (name, a), b in zip(case.dev.state_dict().items(), dup.state_dict().values()):
        if b.device.type != DEVICE:
            return f"deepcopy moved {name} to {b.device}"
        if a.numel() and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr():
            return f"deepcopy shares {name}'s storage with the original"
    host = (lambda out: tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, out))
    with torch.no_grad():
        return _both(lambda: host(case.run(case.dev, DEVICE)[0]), lambda: case.run(dup, DEVICE)[0], _close)


CHECKS = {"forward": check_forward, "backward": check_backward, "to": check_to,
          "state_dict": check_state_dict, "deepcopy": check_deepcopy}


def run_check(device, dtype, info, training: bool, variant: str) -> None:
    check = Check("modules", info.name, str(dtype).removeprefix("torch."), variant)
    entry = check.entry_for()
    limit = selection.sample_limit(entry is not None)
    compare.TOLERANCE = entry.tolerance if entry is not None else None
    i = 0
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        harness.seed(compare.seed_of(info.name, -1))
        try:
            inputs = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=variant == "backward",
                                             training=training)
        except Exception as exc:
            inputs = []
            check.add(f"module_inputs_func: {compare.short(exc)}")
        for mi in inputs:
            if limit is not None and check.run >= limit:
                break
            if mi.forward_input is None:
                continue
            try:
                case = Case(info, mi, compare.seed_of(info.name, i), training)
                why = CHECKS[variant](case)
            except Exception as exc:
                why = compare.short(exc)
            check.add(why, f"input {i} ({'train' if training else 'eval'})")
            i += 1
    compare.TOLERANCE = None
    check.finish()


class TestFornaxModules(TestCase):
    @modules(SELECTED, allowed_dtypes=(torch.float32,))
    def test_forward(self, device, dtype, module_info, training):
        run_check(device, dtype, module_info, training, "forward")

    @modules(SELECTED, allowed_dtypes=(torch.float32,))
    def test_backward(self, device, dtype, module_info, training):
        run_check(device, dtype, module_info, training, "backward")

    @modules(SELECTED, allowed_dtypes=(torch.float32,))
    def test_to(self, device, dtype, module_info, training):
        run_check(device, dtype, module_info, training, "to")

    @modules(SELECTED, allowed_dtypes=(torch.float32,))
    def test_state_dict(self, device, dtype, module_info, training):
        run_check(device, dtype, module_info, training, "state_dict")

    @modules(SELECTED, allowed_dtypes=(torch.float32,))
    def test_deepcopy(self, device, dtype, module_info, training):
        run_check(device, dtype, module_info, training, "deepcopy")


instantiate_device_type_tests(TestFornaxModules, globals(), only_for="fornax")
