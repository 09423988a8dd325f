"""Lifted scalars (fornax.frameworks.torch.lifted): an eager op called with float values that
keep changing compiles once for all of them and reads each value from device memory.  Every
value must give PyTorch CPU's bits, a lowering that branches on the value or computes with it
must still be right, and a graph that changes with every value must stop lifting."""

from __future__ import annotations

import copy

import pytest
import torch

import fornax.frameworks.torch as ft
from fornax.frameworks.torch import lifted
from fornax.frameworks.torch.lowering import TABLE
from fornax.frameworks.torch.session import current

DEV = "fornax"


@pytest.fixture(autouse=True, params=["cuda-like", "rocm-like", "xpu-like"])
def family(request):
    ft.use_stack(request.param)
    yield request.param


def _compiles() -> int:
    return ft.stack().framework.counts.get("resident_plans", 0)


def _lifted_plans() -> list:
    return [k for k in current().plans if isinstance(k, tuple) and k and k[0] == "lifted-plan"]


def test_changing_values_compile_once_and_give_the_compiled_in_bits(monkeypatch):
    torch.manual_seed(0)
    p, a, b = torch.randn(33, 7), torch.randn(33, 7), torch.rand(33, 7) + 0.5
    dp, da, db = p.to(DEV), a.to(DEV), b.to(DEV)
    values = [0.1 * (k + 1) / 3 for k in range(12)]

    def run(v):
        return [torch.addcdiv(dp, da, db, value=-v).cpu(), (da / v).cpu(), (da * v).cpu()]
    for v in values[:3]:                    # the first value compiles in; the second lifts
        run(v)
    before = _compiles()
    got = {v: run(v) for v in values[3:]}
    assert _compiles() == before            # one plan per op served every later value
    # (``a / v`` and ``a * v`` reach the device as a tensor and a wrapped number: never lifted)
    assert [k[1][0] for k in _lifted_plans()] == [torch.ops.aten.addcdiv.default]
    for v, (q, d, m) in got.items():        # PyTorch CPU's values (its addcdiv may fuse a multiply-add)
        torch.testing.assert_close(q, torch.addcdiv(p, a, b, value=-v), rtol=2e-7, atol=2e-7)
        torch.testing.assert_close(d, a / v, rtol=0, atol=0)
        torch.testing.assert_close(m, a * v, rtol=0, atol=0)
    # and each value compiled in (lifting off) gives the same bits as the lifted plan
    monkeypatch.setattr(lifted, "varying", lambda *args: False)
    for v in values[3:6]:
        for x, y in zip(run(v), got[v]):
            assert torch.equal(x, y)


def test_in_place_ops_write_every_value_into_their_tensor():
    torch.manual_seed(1)
    x = torch.randn(5, 9)
    dx = x.to(DEV)
    for k in range(6):
        v = 1.0 + k / 7
        x.mul_(v)
        dx.mul_(v)
        assert torch.equal(dx.cpu(), x)


def test_a_lowering_that_branches_on_the_value_stays_right(monkeypatch):
    """``pow`` special-cases exponents 0, 1, 2 and 3 and ``add`` an alpha of 1: the graph of
    each such value differs, so it keys a plan of its own."""
    torch.manual_seed(2)
    x = torch.rand(4, 6) + 0.1
    y = torch.randn(4, 6)
    dx, dy = x.to(DEV), y.to(DEV)
    exponents = (2.0, 0.5, 1.0, 3.0, 2.5, 0.0, 2.0, 1.5)
    alphas = (1.0, 2.5, 1.0, -0.75, 1.0)

    def run():
        return [dx.pow(e).cpu() for e in exponents] + \
            [torch.add(dx, dy, alpha=alpha).cpu() for alpha in alphas]
    got = run()
    for e, r in zip(exponents, got):
        torch.testing.assert_close(r, x.pow(e), rtol=1e-6, atol=0)
    for alpha, r in zip(alphas, got[len(exponents):]):       # CPU fuses x + alpha * y
        torch.testing.assert_close(r, torch.add(x, y, alpha=alpha), rtol=2e-7, atol=5e-7)
    monkeypatch.setattr(lifted, "varying", lambda *args: False)
    current().plans.clear()
    for a, b in zip(run(), got):                              # each value compiled in: the same bits
        assert torch.equal(a, b)


def test_a_value_the_lowering_computes_with_is_compiled_in(monkeypatch):
    """A lowering that also turns the float into a plain number (here ``float(other)``)
    bakes that into a constant: each value's graph differs, so each gets its own plan and
    the results stay right; past PLANS_PER_SIGNATURE plans the signature stops lifting."""
    op = "aten::mul.Scalar"
    original = TABLE[op]

    def leaky(ctx, self, other):
        baked = ctx.op("mul", ctx.scalar(float(other), self.dtype), ctx.scalar(0.0, self.dtype))
        return ctx.op("add", original(ctx, self, other), baked)
    monkeypatch.setitem(TABLE, op, leaky)
    x = torch.randn(3, 5)
    dx = x.to(DEV)
    for k in range(lifted.PLANS_PER_SIGNATURE + 4):
        v = 0.25 + k / 13
        torch.testing.assert_close(torch.ops.aten.mul.Scalar(dx, v).cpu(), x * v, rtol=0, atol=0)
    mine = [k for k in _lifted_plans() if k[1][0] is torch.ops.aten.mul.Scalar]
    assert len(mine) == lifted.PLANS_PER_SIGNATURE


def test_adamw_steps_compile_nothing_after_warm_up_and_match_cpu():
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    dev = copy.deepcopy(model).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dopt = torch.optim.AdamW(dev.parameters(), lr=1e-2)
    x = torch.randn(6, 8)
    dx = x.to(DEV)
    counts = []
    for _ in range(6):
        for m, o, inp in ((model, opt, x), (dev, dopt, dx)):
            m(inp).square().mean().backward()
            o.step()
            o.zero_grad(set_to_none=True)
        counts.append(_compiles())
    assert counts[-1] == counts[-3]                # the last steps compiled no plan
    for p, q in zip(model.parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)
