"""The small models the autograd, compile and profiling evidence trains, and one train-step
on the device against the same step on the CPU."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable

from ..contracts.clause import Outcome
from .levels import TOL
from .measure import fmt, worst_error
from .subject import StackSubject

if TYPE_CHECKING:
    import torch

#: named (device result, CPU result) pairs of one step
Pairs = dict[str, tuple[Any, Any]]


@functools.lru_cache(maxsize=None)
def models() -> tuple[type[torch.nn.Module], type[torch.nn.Module]]:
    """The MLP and CNN of L3/L4, as classes of their own: torch.compile caches per code
    object, so the models must not share ``forward`` with other modules of the process."""
    import torch
    nn = torch.nn

    class MLP(nn.Module):
        out_features = 8

        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

        def forward(self, x):
            return self.fc2(nn.functional.gelu(self.fc1(x)))

    class CNN(nn.Module):
        out_features = 5

        def __init__(self):
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(64, 5)

        def forward(self, x):
            return self.fc(nn.functional.max_pool2d(torch.relu(self.conv(x)), 2).flatten(1))

    return MLP, CNN


def mlp() -> torch.nn.Module:
    """The MLP: x [N, 16] -> Linear 32 -> GELU -> Linear 8."""
    return models()[0]()


def cnn() -> torch.nn.Module:
    """The CNN: x [N, 3, 8, 8] -> Conv2d 3->4 k3 p1 -> ReLU -> MaxPool 2 -> Linear 64->5."""
    return models()[1]()


def train_step(s: StackSubject, build: Callable[[], torch.nn.Module], shape: tuple[int, ...],
               seed: int, compile_: bool = False) -> tuple[Pairs, dict[tuple[str, str], int]]:
    """One forward+backward of the model ``build()`` makes, on the device and on the CPU
    from the same weights and input: (normwise errors by tensor, the session's route delta)."""
    import torch
    from collections import Counter
    session = s.torch()
    torch.manual_seed(seed)
    ref = build()
    dev = build()
    dev.load_state_dict(ref.state_dict())
    dev.to("fornax")
    x = torch.randn(*shape)
    target = torch.randn(shape[0], int(getattr(ref, "out_features")))
    xc = x.clone().requires_grad_()
    xd = x.to("fornax").requires_grad_()
    before = Counter(session.stats.routes)
    model = torch.compile(dev, backend="fornax") if compile_ else dev
    out_d = model(xd)
    loss_d = torch.nn.functional.mse_loss(out_d, target.to("fornax"))
    loss_d.backward()
    out_c = ref(xc)
    loss_c = torch.nn.functional.mse_loss(out_c, target)
    loss_c.backward()
    routes = Counter(session.stats.routes)
    routes.subtract(before)
    pairs: Pairs = {"output": (out_d, out_c), "loss": (loss_d, loss_c), "input grad": (xd.grad, xc.grad)}
    for (name, pd), (_, pc) in zip(dev.named_parameters(), ref.named_parameters()):
        if pd.grad is None:
            raise AssertionError(f"no gradient reached {name} on the device")
        if pd.grad.device.type != "fornax":
            raise AssertionError(f"the gradient of {name} is on {pd.grad.device}, not on fornax")
        pairs[f"{name} grad"] = (pd.grad, pc.grad)
    if out_d.device.type != "fornax":
        raise AssertionError(f"the output is on {out_d.device}, not on fornax")
    return pairs, +routes


def autograd_outcome(s: StackSubject, build: Callable[[], torch.nn.Module], shape: tuple[int, ...],
                     seed: int) -> Outcome:
    """One train-step of ``build()`` on the device against the CPU: every tensor within
    float32 tolerance."""
    pairs, routes = train_step(s, build, shape, seed)
    err, worst = worst_error(pairs)
    fallbacks = sorted({op for op, kind in routes if kind == "fallback"})
    native = sum(n for (op, kind), n in routes.items() if kind == "native")
    detail = (f"{len(pairs)} tensors (output, loss, input and {len(pairs) - 3} parameter grads); "
              f"worst {worst} {fmt(err)}; {native} native kernel calls"
              + (f"; CPU fallbacks: {', '.join(fallbacks)}" if fallbacks else "; no CPU fallback"))
    return Outcome(err, err <= TOL["float32"], detail)
