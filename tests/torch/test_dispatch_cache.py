"""The eager dispatch cache (fornax.frameworks.torch.dispatch_cache): a call with a signature
seen before goes straight to its launch, and must do exactly what the full route does —
results equal to PyTorch CPU, the same route counts, the same errors — while everything
that could change the route keeps it out of the cache."""

from __future__ import annotations

import pytest
import torch

import fornax.frameworks.torch as ft
from fornax.frameworks.torch import dispatch_cache, eager
from fornax.frameworks.torch.session import current

DEV = "fornax"


@pytest.fixture(autouse=True, params=["cuda-like", "rocm-like", "xpu-like"])
def family(request):
    ft.use_stack(request.param)
    yield request.param


def _native_calls(op: str) -> int:
    return current().stats.routes.get((op, "native"), 0)


def test_a_repeated_call_takes_the_cached_launch_and_counts_as_native():
    a, b = torch.randn(8, 16), torch.randn(8, 16)
    da, db = a.to(DEV), b.to(DEV)
    session = current()
    assert torch.equal((da + db).cpu(), a + b)            # first call: the whole route
    entries = len(session.fast)
    before = _native_calls("aten::add.Tensor")
    for _ in range(5):
        assert torch.equal((da + db).cpu(), a + b)
    assert len(session.fast) == entries                     # the same entry served every call
    assert _native_calls("aten::add.Tensor") == before + 5  # and the report counts each one


def test_strides_scalars_and_dtypes_key_separately():
    x = torch.randn(6, 10)
    dx = x.to(DEV)
    session = current()
    session.fast.clear()
    torch.testing.assert_close((dx * 2.0).cpu(), x * 2.0, rtol=0, atol=0)
    torch.testing.assert_close((dx * -0.0).cpu(), x * -0.0, rtol=0, atol=0)
    assert torch.equal(torch.signbit((dx * -0.0).cpu()), torch.signbit(x * -0.0))
    assert torch.equal(torch.signbit((dx * 0.0).cpu()), torch.signbit(x * 0.0))
    t, dt = x.t(), dx.t()                                   # a transposed view: gathered first
    first = [torch.exp(dt).cpu(), torch.exp(dx).cpu()]      # the full route
    torch.testing.assert_close(first[0], torch.exp(t))
    torch.testing.assert_close(first[1], torch.exp(x))
    for _ in range(2):                                      # the cached launches: the same bits
        assert torch.equal(torch.exp(dt).cpu(), first[0])
        assert torch.equal(torch.exp(dx).cpu(), first[1])
        assert torch.equal((dx.double() + 1).cpu(), x.double() + 1)
    keys = [k for k in session.fast if k[0] is torch.ops.aten.exp.default]
    assert len(keys) == 2                                   # contiguous and transposed strides


def test_ops_whose_checks_read_the_data_stay_out_of_the_cache():
    x = torch.arange(10.0).to(DEV)
    idx = torch.tensor([1, 3]).to(DEV)
    assert torch.equal(x[idx].cpu(), torch.tensor([1.0, 3.0]))
    bad = torch.tensor([1, 12]).to(DEV)
    for _ in range(2):
        with pytest.raises(IndexError, match="out of bounds"):
            x[bad]
    assert not any(k[0] is torch.ops.aten.index.Tensor for k in current().fast)


def test_cpu_scalars_and_flagged_views_take_the_full_route():
    x = torch.randn(4, 4, dtype=torch.complex64)
    dx = x.to(DEV)
    for _ in range(3):
        assert torch.equal((dx.conj() * 2).cpu(), x.conj() * 2)
        assert torch.equal((dx.real + torch.tensor(1.5)).cpu(), x.real + 1.5)   # a 0-d CPU tensor
    assert dispatch_cache.key(torch.ops.aten.mul.Tensor, (dx.conj(), dx), {}) is None
    assert dispatch_cache.key(torch.ops.aten.add.Tensor, (dx.real, torch.tensor(1.5)), {}) is None


def test_evicting_a_plan_clears_the_cache(monkeypatch):
    monkeypatch.setattr(eager, "PLAN_CACHE_SIZE", 2)
    x = torch.randn(5).to(DEV)
    for op in (torch.exp, torch.sin, torch.cos, torch.tanh):
        op(x)
        op(x)
    session = current()
    assert len(session.plans) <= 2
    # every cached launch still refers to a plan the cache holds
    live = {id(e.plan) for e in session.plans.values() if isinstance(e, eager._Native)}
    assert all(id(launch.plan) in live for launch in session.fast.values())
    torch.testing.assert_close(torch.exp(x).cpu(), torch.exp(x.cpu()))


def test_a_new_stack_starts_with_an_empty_cache(family):
    x = torch.randn(3).to(DEV)
    torch.neg(x)
    torch.neg(x)
    assert current().fast
    ft.use_stack(family)
    assert not current().fast


def test_in_place_ops_write_their_tensor_through_the_cache():
    a, b = torch.randn(6, 8), torch.randn(6, 8)
    da, db = a.clone().to(DEV), b.to(DEV)
    ref = a.clone()
    before = _native_calls("aten::add_.Tensor")
    for _ in range(4):
        out = da.add_(db, alpha=0.5)
        ref.add_(b, alpha=0.5)
        assert out is da
    assert torch.equal(da.cpu(), ref)
    assert _native_calls("aten::add_.Tensor") == before + 4
    assert any(k[0] is torch.ops.aten.add_.Tensor for k in current().fast)
    # a transposed destination is not a dense tensor of the result's layout: the full route
    # computes and copies back, every time, and says so in the same counts
    t, dt = a.clone().t(), a.clone().to(DEV).t()
    for _ in range(3):
        dt.mul_(2.0)
        t.mul_(2.0)
    assert torch.equal(dt.cpu(), t)


def test_an_in_place_op_on_a_view_writes_through_to_its_base():
    base = torch.zeros(4, 6)
    dbase = base.to(DEV)
    for i in range(3):
        dbase[1].add_(1.0)          # a contiguous row view with a storage offset
        base[1].add_(1.0)
    assert torch.equal(dbase.cpu(), base)
