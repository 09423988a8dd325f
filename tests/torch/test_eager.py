"""The eager ``fornax`` device: PyTorch tensor semantics on simulated device memory.

Every check compares against the same computation on CPU tensors (PyTorch's own
semantics are the reference) or against what the stack's seams report.
"""

from __future__ import annotations

import copy
import importlib
import io

import numpy as np
import pytest
import torch

import fornax.frameworks.torch as ft
from fornax.frameworks.torch import register, session

DEV = "fornax"


@pytest.fixture(autouse=True)
def cuda_like():
    ft.use_stack("cuda-like")
    yield


def test_registration_is_once_per_process_and_idempotent():
    assert torch._C._get_privateuse1_backend_name() == "fornax"
    before = len(register.LIBRARIES)
    register.register()
    importlib.reload(importlib.import_module("fornax.frameworks.torch"))
    assert len(register.LIBRARIES) == before
    assert torch.fornax.is_available() and torch.fornax.device_count() == 1
    assert torch.device("fornax").type == "fornax"


def test_data_pointer_is_the_simulated_device_address():
    t = torch.arange(12, dtype=torch.float32).to(DEV)
    s = session.current()
    addr = s.address(t.data_ptr())
    assert addr in s.allocations
    v = t[3:]
    assert s.address(v.data_ptr()) == addr + 3 * 4
    # the bytes at that address are the tensor's values, read back through the runtime seam
    host = np.empty(12, dtype=np.float32)
    s.runtime.memcpy_d2h(host, addr, blocking=True)
    np.testing.assert_array_equal(host, np.arange(12, dtype=np.float32))


def test_views_strides_offsets_and_mutation_through_views():
    x = torch.randn(6, 8)
    d = x.to(DEV)
    for view in (lambda t: t[1:4, ::2], lambda t: t.t(), lambda t: t[2], lambda t: t[:, 3:5].T,
                 lambda t: t.view(4, 12)[1:], lambda t: t.unsqueeze(0).expand(3, 6, 8),
                 lambda t: t.as_strided((3, 3), (9, 2), 5), lambda t: t.reshape(2, 24)[:, 1::5]):
        cv, dv = view(x), view(d)
        assert dv.shape == cv.shape and dv.stride() == cv.stride()
        assert dv.storage_offset() == cv.storage_offset()
        torch.testing.assert_close(dv.cpu(), cv)
        torch.testing.assert_close((dv * 2 + 1).cpu(), cv * 2 + 1)
    # in-place through a view is visible in the base, as on CPU
    xc, dc = x.clone(), d.clone()
    xc[1:3, ::3].mul_(-2).add_(0.5)
    dc[1:3, ::3].mul_(-2).add_(0.5)
    torch.testing.assert_close(dc.cpu(), xc)
    xc.t()[2].fill_(7.0)
    dc.t()[2].fill_(7.0)
    torch.testing.assert_close(dc.cpu(), xc)
    # copy_ into a strided destination with broadcasting and a dtype cast
    xc[::2, 1:].copy_(torch.arange(7, dtype=torch.int64))
    dc[::2, 1:].copy_(torch.arange(7, dtype=torch.int64).to(DEV))
    torch.testing.assert_close(dc.cpu(), xc)


def test_to_cpu_roundtrip_dtypes_and_printing():
    for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
               torch.int32, torch.bool, torch.uint8, torch.complex64):
        x = (torch.randn(3, 5) * 10).to(dt)
        d = x.to(DEV)
        assert d.dtype == dt and d.device.type == "fornax"
        assert torch.equal(d.cpu(), x)
    x = torch.randn(3, 4)
    d = x.to(DEV)
    assert repr(d).startswith("tensor(") and "device='fornax:0'" in repr(d)
    assert str(d.cpu()) in str(d).replace(", device='fornax:0'", "")
    assert d.sum().item() == pytest.approx(x.sum().item(), rel=1e-5)
    assert torch.equal(d.to(torch.float16).cpu(), x.to(torch.float16))
    # a transposed (dense) tensor keeps its strides through .cpu(), as CUDA tensors do
    assert d.t().cpu().stride() == x.t().clone().stride()


def test_elementwise_promotion_and_scalars_match_cpu():
    a = torch.randint(-5, 5, (4, 3))
    b = torch.randn(4, 3)
    da, db = a.to(DEV), b.to(DEV)
    cases = [lambda p, q: p + 2.5, lambda p, q: p * q, lambda p, q: p / 3, lambda p, q: p // 2,
             lambda p, q: (p > 0) & (q < 0.5), lambda p, q: torch.where(p > 0, q, -q),
             lambda p, q: q.clamp(-0.5, 0.5), lambda p, q: p.sum(0), lambda p, q: q.mean(1),
             lambda p, q: q + torch.tensor(1.5), lambda p, q: torch.maximum(p.float(), q)]
    for f in cases:
        want, got = f(a, b), f(da, db).cpu()
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


def test_cat_with_zero_size_inputs_runs_on_the_device_as_cpu_does():
    """A key/value cache's first update concatenates an empty cache with the new keys: the
    empty inputs add nothing, still promote the dtype and still fail PyTorch's shape check."""
    x, e = torch.randn(4, 4, 3, 8), torch.empty(4, 4, 0, 8)
    before = {r["op"]: r for r in ft.report()["ops"]}.get("aten::cat", {}).get("count", 0)
    for a, b, dim in [(e, x, -2), (x, e, 2), (torch.empty(0), x, 1), (e.double(), x, -2),
                      (e, x.half(), 2), (e, e, 2)]:
        want = torch.cat([a, b], dim)
        got = torch.cat([a.to(DEV), b.to(DEV)], dim)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.cpu(), want)
    rows = {r["op"]: r for r in ft.report()["ops"]}
    assert not [r for r in ft.report()["fallbacks"] if r["op"] == "aten::cat"]
    assert rows["aten::cat"]["count"] > before
    bad = torch.empty(4, 0, 3, 8)
    with pytest.raises(RuntimeError, match="Sizes of tensors must match") as cpu_error:
        torch.cat([bad, x], 2)
    with pytest.raises(RuntimeError, match="Sizes of tensors must match") as dev_error:
        torch.cat([bad.to(DEV), x.to(DEV)], 2)
    assert str(dev_error.value) == str(cpu_error.value)


def test_a_small_cpu_tensor_goes_over_without_a_host_wait():
    """A CPU scalar mixed into a device op (and any small tensor moved over) is staged and
    copied in stream order, with no wait, as a small synchronous copy from pageable memory
    returns once its bytes are staged; a large one is read in place and waited for."""
    s = session.current()
    d = torch.randn(5, 3).to(DEV)
    torch.fornax.synchronize()
    syncs = s.runtime.counts["host_syncs"]
    scalar = torch.tensor(2.5)
    out = d * scalar
    scalar.fill_(-1.0)                      # the staged bytes were taken at submission
    assert s.runtime.counts["host_syncs"] == syncs
    torch.testing.assert_close(out.cpu(), d.cpu() * 2.5)
    syncs = s.runtime.counts["host_syncs"]
    torch.ones(64, 1024).to(DEV)            # 256 KiB: read in place, so the host waits
    assert s.runtime.counts["host_syncs"] == syncs + 1


def test_mixing_a_cpu_tensor_is_torch_s_device_error():
    with pytest.raises(RuntimeError, match="same device"):
        torch.randn(3).to(DEV) + torch.randn(3)


def test_deepcopy_save_and_load():
    m = torch.nn.Linear(4, 3).to(DEV)
    t = torch.randn(5, 5).to(DEV)
    t2 = copy.deepcopy(t)
    assert t2.device.type == "fornax" and t2.data_ptr() != t.data_ptr()
    assert torch.equal(t2.cpu(), t.cpu())
    m2 = copy.deepcopy(m)
    assert torch.equal(m2.weight.cpu(), m.weight.cpu())
    buf = io.BytesIO()
    torch.save({"t": t, "m": m.state_dict()}, buf)
    buf.seek(0)
    loaded = torch.load(buf)                              # back on the fornax device
    assert loaded["t"].device.type == "fornax"
    assert torch.equal(loaded["t"].cpu(), t.cpu())
    assert torch.equal(loaded["m"]["weight"].cpu(), m.weight.cpu())
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    assert on_cpu["t"].device.type == "cpu" and torch.equal(on_cpu["t"], t.cpu())
    st = torch.UntypedStorage(16).fornax() if hasattr(torch.UntypedStorage, "fornax") else None
    assert st is None or st.device.type == "fornax"


def test_manual_seed_reproduces_cpu_random_numbers():
    torch.manual_seed(123)
    want = torch.randn(4, 4)
    torch.manual_seed(123)
    got = torch.randn(4, 4, device=DEV)
    assert torch.equal(got.cpu(), want)
    torch.manual_seed(7)
    a = torch.empty(100, device=DEV).uniform_()
    torch.manual_seed(7)
    assert torch.equal(a.cpu(), torch.empty(100).uniform_())
    rep = ft.report()
    assert any(r["op"].startswith("aten::uniform") and r["route"] == "fallback" and
               "host generator" in r["reason"] for r in rep["fallbacks"])


@pytest.mark.parametrize("opt", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=1e-2),
    lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1)], ids=["sgd", "adam", "adamw"])
def test_training_with_optimizers_matches_cpu(opt):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    dev = copy.deepcopy(cpu).to(DEV)
    oc, od = opt(cpu.parameters()), opt(dev.parameters())
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    xd, yd = x.to(DEV), y.to(DEV)
    losses = []
    for _ in range(3):
        for model, o, xx, yy in ((cpu, oc, x, y), (dev, od, xd, yd)):
            o.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xx), yy)
            loss.backward()
            o.step()
            losses.append(loss.item())
    np.testing.assert_allclose(losses[0::2], losses[1::2], rtol=1e-5)
    assert losses[-2] < losses[0]
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.cpu(), p, rtol=1e-5, atol=1e-6)


def test_every_op_is_accounted_with_its_route():
    s = ft.use_stack("cuda-like")
    a = torch.randn(8, 8).to(DEV)
    (a @ a).relu_()
    a.nonzero()                         # data-dependent shape: runs on the host, with a reason
    rep = s.report()
    routes = {(r["op"], r["route"]) for r in rep["ops"]}
    assert {("aten::mm", "native"), ("aten::relu_", "native")} <= routes   # as the program called them
    assert not any(op.startswith("aten::mm.out") for op, _ in routes)  # no empty + out= detour
    fb = [r for r in rep["fallbacks"] if r["op"] == "aten::nonzero"]
    assert fb and fb[0]["count"] == 1 and fb[0]["reason"]
    assert rep["totals"]["native"] >= 2


def test_device_module_and_memory_statistics():
    s = ft.use_stack("rocm-like")
    props = torch.fornax.get_device_properties()
    drv = s.stack.driver.properties(0)
    assert s.stack.spec.name in props.name and props.total_memory == drv.memory_bytes
    assert props.gcnArchName.startswith(drv.target)
    assert torch.fornax.version.hip is not None and torch.fornax.version.cuda is None
    before = torch.fornax.memory_allocated()
    t = torch.empty(1 << 20, device=DEV)
    assert torch.fornax.memory_allocated() >= before + 4 * (1 << 20)
    assert torch.fornax.max_memory_allocated() >= torch.fornax.memory_allocated()
    assert torch.fornax.memory_reserved() >= torch.fornax.memory_allocated()
    del t
    assert torch.fornax.memory_allocated() == before
    torch.fornax.empty_cache()
    assert torch.fornax.memory_reserved() <= before + (2 << 20)
    assert "allocator" in torch.fornax.memory_summary()
    torch.fornax.synchronize()
    with pytest.raises(ft.DeviceError, match="device 1"):
        torch.fornax.get_device_properties(1)


FACTORIES = {
    "empty": lambda d: torch.empty(2, device=d), "ones": lambda d: torch.ones(2, device=d),
    "zeros": lambda d: torch.zeros(2, device=d), "full": lambda d: torch.full((2,), 3.0, device=d),
    "arange": lambda d: torch.arange(3, device=d), "linspace": lambda d: torch.linspace(0, 1, 3, device=d),
    "eye": lambda d: torch.eye(2, device=d), "tensor": lambda d: torch.tensor([1.0], device=d),
    "scalar_tensor": lambda d: torch.scalar_tensor(1.0, device=d), "randn": lambda d: torch.randn(2, device=d),
    "randint": lambda d: torch.randint(0, 3, (2,), device=d),
    "zeros_like": lambda d: torch.zeros_like(torch.ones(2), device=d), "to": lambda d: torch.ones(2).to(d),
}


@pytest.mark.parametrize("factory", sorted(FACTORIES))
def test_every_factory_refuses_a_device_the_face_cannot_address(factory):
    with pytest.raises(ft.DeviceError, match="fornax device 1 does not exist"):
        FACTORIES[factory]("fornax:1")
    assert FACTORIES[factory]("fornax:0").device == torch.device("fornax:0")


def test_streams_and_events_time_device_work():
    ft.use_stack("cuda-like")
    s = torch.fornax.Stream()
    a = torch.randn(128, 128).to(DEV)
    start, end = torch.fornax.Event(enable_timing=True), torch.fornax.Event(enable_timing=True)
    with torch.fornax.stream(s):
        start.record()
        b = a @ a
        end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0
    assert s.query()
    torch.testing.assert_close(b.cpu(), a.cpu() @ a.cpu(), rtol=1e-4, atol=1e-4)


def test_switching_stacks_refuses_tensors_of_the_old_stack():
    ft.use_stack("cuda-like")
    old = torch.ones(3).to(DEV)
    ft.use_stack("xpu-like")
    with pytest.raises(ft.DeviceError, match="previous fornax stack"):
        old + 1
    assert torch.fornax.face()["device_type"] == "xpu"


def test_autocast_follows_the_family_policy():
    ft.use_stack("cuda-like")
    a = torch.randn(8, 8).to(DEV)
    with torch.autocast("fornax"):
        mm = a @ a
        sm = torch.softmax(mm, -1)
    want = torch.fornax.face()["autocast_dtype"].removeprefix("torch.")
    assert str(mm.dtype).removeprefix("torch.") == want
    assert sm.dtype == torch.float32                       # softmax autocasts to float32
    ref = (a.cpu().to(mm.dtype) @ a.cpu().to(mm.dtype)).float()
    torch.testing.assert_close(mm.float().cpu(), ref, rtol=2e-2, atol=2e-2)


def test_stack_comes_from_the_environment(tmp_path):
    """FORNAX_VENDOR / FORNAX_CONFIG choose the stack when use_stack() was not called."""
    import os
    import subprocess
    import sys
    code = ("import torch, fornax.frameworks.torch as ft; t = torch.ones(2, device='fornax') * 3; "
            "print(ft.current().describe(), torch.fornax.face()['device_type'], "
            "torch.fornax.version.hip is not None, t.sum().item())")
    env = dict(os.environ, FORNAX_VENDOR="rocm-like")
    env.pop("FORNAX_CONFIG", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["rocm-like", "on", "h200-like", "cuda", "True", "6.0"]
    cfg = tmp_path / "stack.toml"
    cfg.write_text('[stack]\nvendor = "xpu-like"\nspec = "tiny"\n\n[stack.seams]\nruntime = "cuda-like"\n')
    env = dict(os.environ, FORNAX_CONFIG=str(cfg))
    env.pop("FORNAX_VENDOR", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "runtime=cuda-like" in out.stdout and "on tiny xpu" in out.stdout
    bad = dict(os.environ, FORNAX_VENDOR="no-such-vendor")
    bad.pop("FORNAX_CONFIG", None)
    out = subprocess.run([sys.executable, "-c", code], env=bad, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "no-such-vendor" in out.stderr
