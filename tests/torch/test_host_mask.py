"""Dropout on the device with its mask from the host generator (fornax.frameworks.torch.host_mask):
with the same seed, the output, the mask and the generator's state afterwards must be PyTorch
CPU's bit for bit, in every float dtype; calls it does not take still run on the CPU, exactly."""

from __future__ import annotations

import copy

import pytest
import torch

import fornax.frameworks.torch as ft
from fornax.frameworks.torch.session import current

DEV = "fornax"
A = torch.ops.aten


@pytest.fixture(autouse=True, params=["cuda-like", "rocm-like", "xpu-like"])
def family(request):
    ft.use_stack(request.param)
    yield request.param


def _seeded(fn, seed=11):
    torch.manual_seed(seed)
    out = fn()
    return out, torch.rand(4)               # the generator's next numbers: where it was left


def _routes(op="aten::native_dropout"):
    return {k[1]: v for k, v in current().stats.routes.items() if k[0] == op}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.875])
def test_output_mask_and_generator_match_cpu_bit_for_bit(dtype, p):
    x = torch.randn(3, 17, 9).to(dtype)
    x[0, 0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    native = _routes().get("native", 0)
    (out, mask), after = _seeded(lambda: A.native_dropout(x.to(DEV), p, True))
    (ref, ref_mask), ref_after = _seeded(lambda: A.native_dropout(x, p, True))
    assert out.device.type == DEV and out.dtype == dtype and mask.dtype == torch.bool
    assert torch.equal(mask.cpu(), ref_mask)
    got = out.cpu()
    assert torch.equal(got.isnan(), ref.isnan())
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(ref))
    assert torch.equal(torch.signbit(got), torch.signbit(ref))
    assert torch.equal(after, ref_after)
    assert _routes()["native"] == native + 1


@pytest.mark.parametrize("case", ["eval", "transposed", "p=0", "p=1"])
def test_calls_it_does_not_take_run_on_the_cpu_exactly(case):
    x = torch.randn(6, 5)
    args = {"eval": (x, 0.3, False), "transposed": (x.t(), 0.3, True),
            "p=0": (x, 0.0, True), "p=1": (x, 1.0, True)}[case]
    fallback = _routes().get("fallback", 0)
    (out, mask), after = _seeded(lambda: A.native_dropout(args[0].to(DEV) if case != "transposed"
                                                          else x.to(DEV).t(), *args[1:]))
    (ref, ref_mask), ref_after = _seeded(lambda: A.native_dropout(*args))
    assert torch.equal(out.cpu(), ref) and torch.equal(mask.cpu(), ref_mask)
    assert torch.equal(after, ref_after)
    assert _routes()["fallback"] == fallback + 1


def test_a_training_step_with_dropout_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Dropout(0.25), torch.nn.ReLU(),
                                torch.nn.Linear(32, 3))
    x = torch.randn(8, 12)
    dev = copy.deepcopy(model).to(DEV)
    (loss, grads) = _step(dev, x.to(DEV))
    (ref_loss, ref_grads) = _step(model, x)
    torch.testing.assert_close(loss.cpu(), ref_loss, rtol=1e-5, atol=1e-6)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.cpu(), r, rtol=1e-5, atol=1e-6)


def _step(model, x):
    torch.manual_seed(5)
    loss = model(x).square().mean()
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]
