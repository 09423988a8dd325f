"""torch.profiler on the fornax device: per-ATen-op rows carry the simulated device time of
the kernels each op launched (PyTorch's own tables and events, with PrivateUse1 activity)."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import fornax.frameworks.torch as ft
from fornax.frameworks.torch import profiler as fp

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


@pytest.fixture(autouse=True)
def rocm_like():
    ft.use_stack("rocm-like")
    yield


def _kernels_since(n: int) -> list:
    ft.stack().runtime.synchronize()
    return [k for k in ft.stack().driver.kernel_log if k.launch > n]


def test_each_op_row_has_the_device_time_of_the_kernels_it_launched():
    x = torch.randn(32, 48, device="fornax")
    w = torch.randn(48, 16, device="fornax")
    (x @ w).relu().sum().item()                       # compile and warm everything first
    start = ft.stack().driver.counts["launches"]
    with profile(activities=ACTIVITIES) as p:
        y = (x @ w).relu().sum()
    launched = _kernels_since(start)
    assert launched, "the ops launched no kernel"
    events = p.events()
    rows = {e.key: e for e in p.key_averages()}
    device_total = sum(k.duration_s for k in launched) * 1e6
    # PyTorch's table sums device-side events: it is the simulated time of every kernel
    assert sum(e.self_device_time_total for e in events
               if e.device_type == torch.autograd.DeviceType.PrivateUse1) == pytest.approx(device_total)
    for op in ("aten::mm", "aten::relu", "aten::sum"):
        assert rows[op].device_time_total > 0, op
    # an op's device time is exactly its kernels' (mm launches one GEMM: the library's)
    mm = [e for e in events if e.name == "aten::mm"]
    assert len(mm) == 1 and len(mm[0].kernels) == 1
    gemm = next(k for k in launched if k.name == mm[0].kernels[0].name)
    assert mm[0].device_time_total == pytest.approx(gemm.duration_s * 1e6)
    # matmul is CompositeImplicit: its device time is its child mm's, none of its own
    assert rows["aten::matmul"].device_time_total == pytest.approx(rows["aten::mm"].device_time_total)
    assert rows["aten::matmul"].self_device_time_total == 0
    table = p.key_averages().table(sort_by="self_device_time_total", row_limit=8)
    assert "Self FORNAX" in table and "aten::mm" in table
    assert y.item() == pytest.approx(float((x.cpu() @ w.cpu()).relu().sum()), rel=1e-5)


def test_backward_ops_are_timed_too():
    lin = torch.nn.Linear(8, 4).to("fornax")
    x = torch.randn(5, 8, device="fornax")
    lin(x).sum().backward()
    with profile(activities=ACTIVITIES) as p:
        lin(x).square().sum().backward()
    timed = {e.key for e in p.key_averages() if e.self_device_time_total > 0}
    assert "aten::addmm" in timed and "aten::mm" in timed, sorted(timed)


def test_cpu_only_profiles_keep_no_device_columns_and_no_records():
    x = torch.randn(16, device="fornax")
    with profile(activities=[ProfilerActivity.CPU]) as p:
        (x * 2).sum()
    assert all(e.device_time_total == 0 for e in p.key_averages())
    assert "FORNAX" not in p.key_averages().table()
    assert not fp._RECORDS                              # consumed by the parse
    (x * 3).sum()                                       # no profiler: nothing recorded
    assert not fp._RECORDS
