"""The ``_foreach_*`` list ops (what optimizers call) on the ``fornax`` device: one device
plan per list op instead of one op per list element, with PyTorch CPU's results."""

from __future__ import annotations

import copy

import pytest
import torch

import fornax.frameworks.torch as ft

DEV = "fornax"
SHAPES = [(3, 4), (5,), (2, 3, 2), ()]


@pytest.fixture(autouse=True)
def cuda_like():
    ft.use_stack("cuda-like")
    yield


def _routes():
    return {r["op"]: (r["route"], r["count"]) for r in ft.report()["ops"]}


def _lists(seed, n=3):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g) for s in SHAPES] for _ in range(n)]


@pytest.mark.parametrize("call", [
    lambda a, b, c: torch._foreach_mul_(a, 0.75),
    lambda a, b, c: torch._foreach_add_(a, b, alpha=-0.5),
    lambda a, b, c: torch._foreach_lerp_(a, b, 0.1),
    lambda a, b, c: torch._foreach_addcmul_(a, b, c, value=0.25),
    lambda a, b, c: torch._foreach_addcdiv_(a, b, c, [0.5, -1.0, 2.0, 0.125]),
    lambda a, b, c: torch._foreach_div_(a, [1.5, 2.0, -4.0, 3.0]),
])
def test_in_place_list_ops_run_as_one_device_op_and_match_cpu(call):
    cpu = _lists(0)
    dev = [[t.to(DEV) for t in lst] for lst in cpu]
    before = _routes()
    call(*dev)
    call(*cpu)
    for got, want in zip(dev[0], cpu[0]):
        assert got.shape == want.shape
        torch.testing.assert_close(got.cpu(), want)
    grown = {op: r for op, r in _routes().items() if r[1] != before.get(op, (None, 0))[1]}
    name = [op for op in grown if op.startswith("aten::_foreach_")]
    assert len(name) == 1 and grown[name[0]][0] == "native", grown
    # one op on the device, not one per element
    assert not [op for op in grown if not op.startswith("aten::_foreach_") and grown[op][0] == "native"]


def test_the_values_of_a_changing_scalar_run_one_plan():
    """An optimizer's list op gets new floats every step: they are read from device memory,
    so later steps compile nothing and still match the CPU."""
    cpu = _lists(1, 1)[0]
    dev = [t.to(DEV) for t in cpu]
    s = ft.session.current()
    for step in range(4):
        if step == 3:
            plans = len(s.plans)
        torch._foreach_mul_(dev, 1.0 - 0.01 * step)
        torch._foreach_mul_(cpu, 1.0 - 0.01 * step)
    assert len(s.plans) == plans
    for got, want in zip(dev, cpu):
        torch.testing.assert_close(got.cpu(), want)


def test_a_tensor_read_at_another_position_runs_in_list_order_on_the_host():
    a, b = torch.randn(4), torch.randn(4)
    want_a, want_b = a.clone(), b.clone()
    torch._foreach_add_([want_a, want_b], [want_b, want_a])       # in order: b sees the new a
    da, db = a.to(DEV), b.to(DEV)
    torch._foreach_add_([da, db], [db, da])
    torch.testing.assert_close(da.cpu(), want_a)
    torch.testing.assert_close(db.cpu(), want_b)
    falls = [r for r in ft.report()["fallbacks"] if r["op"] == "aten::_foreach_add_.List"]
    assert falls and "another position" in falls[0]["reason"]


def test_a_tensor_read_at_two_positions_and_never_written_stays_on_the_device():
    a, b, c = torch.randn(3), torch.randn(3), torch.randn(3)
    want = [a.clone(), b.clone()]
    torch._foreach_add_(want, [c, c])
    got = [a.to(DEV), b.to(DEV)]
    dc = c.to(DEV)
    before = _routes().get("aten::_foreach_add_.List", (None, 0))
    torch._foreach_add_(got, [dc, dc])
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w)
    assert _routes()["aten::_foreach_add_.List"] == ("native", before[1] + 1)


def test_adamw_training_matches_cpu_with_its_list_ops_on_the_device():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    dev = copy.deepcopy(model).to(DEV)
    x, y = torch.randn(5, 8), torch.randn(5, 3)
    opts = [torch.optim.AdamW(m.parameters(), lr=0.05, weight_decay=0.1, foreach=True)
            for m in (model, dev)]
    for _ in range(3):
        for m, opt, xx, yy in ((model, opts[0], x, y), (dev, opts[1], x.to(DEV), y.to(DEV))):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(xx), yy).backward()
            opt.step()
    for p, q in zip(model.parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)
    routes = _routes()
    assert routes["aten::_foreach_addcdiv_.ScalarList"][0] == "native"
    assert "aten::addcdiv_" not in routes
