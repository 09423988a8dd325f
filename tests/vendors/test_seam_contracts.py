"""Every vendor family satisfies every seam's contract, checked by behaviour.

The expected names and numbers below are the vendor families' public facts
(``/work/shared/VENDORS.md`` and the real headers), written out here by hand
so that a wrong table in a vendor's ``vendor.toml`` fails these tests.
"""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import FAMILIES, scale_program
from fornax.layers.binary import KernelBinary
from fornax.layers.compiler import Target
from fornax.layers.errors import (
    BinaryError,
    DeviceLostError,
    FornaxError,
    InvalidArgumentError,
    LibraryError,
    MemoryFaultError,
    OutOfMemoryError,
)
from fornax.layers.framework import execute_plan
from fornax.layers.graph import DType, Graph
from fornax.sim import isa
from fornax.sim.device import Device
from fornax.sim.spec import load_spec
from fornax.stack import get_vendor

VENDORS = FAMILIES
BF16 = np.dtype(ml_dtypes.bfloat16)

# -- the families' facts, by hand ---------------------------------------------------------
TARGETS = {  # (vendor, spec) -> arch the driver reports
    ("cuda-like", "h200-like"): "sm_90", ("cuda-like", "tiny"): "sm_80",
    ("rocm-like", "h200-like"): "gfx942", ("rocm-like", "tiny"): "gfx90a",
    ("xpu-like", "h200-like"): "pvc", ("xpu-like", "tiny"): "dg2",
}
FORMATS = {
    "cuda-like": {"ptx-like", "cubin-like", "fatbin-like"},
    "rocm-like": {"hsaco-like"},
    "xpu-like": {"spirv-like", "zebin-like"},
}
API = {"cuda-like": "CUresult", "rocm-like": "hipError_t", "xpu-like": "ze_result_t"}
CORRUPT = {  # format -> code for a damaged image of that format
    "ptx-like": ("CUDA_ERROR_INVALID_PTX", 218),
    "cubin-like": ("CUDA_ERROR_INVALID_IMAGE", 200),
    "fatbin-like": ("CUDA_ERROR_INVALID_IMAGE", 200),
    "hsaco-like": ("hipErrorInvalidImage", 200),
    "spirv-like": ("ZE_RESULT_ERROR_MODULE_BUILD_FAILURE", 0x70000004),
    "zebin-like": ("ZE_RESULT_ERROR_INVALID_NATIVE_BINARY", 0x7800000F),
}
UNSUPPORTED_FORMAT = {
    "cuda-like": ("CUDA_ERROR_INVALID_IMAGE", 200),
    "rocm-like": ("hipErrorInvalidImage", 200),
    "xpu-like": ("ZE_RESULT_ERROR_INVALID_ENUMERATION", 0x7800000C),
}
NO_BINARY = {
    "cuda-like": ("CUDA_ERROR_NO_BINARY_FOR_GPU", 209),
    "rocm-like": ("hipErrorNoBinaryForGpu", 209),
    "xpu-like": ("ZE_RESULT_ERROR_INVALID_NATIVE_BINARY", 0x7800000F),
}
NOT_FOUND = {
    "cuda-like": ("CUDA_ERROR_NOT_FOUND", 500),
    "rocm-like": ("hipErrorNotFound", 500),
    "xpu-like": ("ZE_RESULT_ERROR_INVALID_KERNEL_NAME", 0x78000011),
}
ILLEGAL_ADDRESS = {
    "cuda-like": ("CUDA_ERROR_ILLEGAL_ADDRESS", 700, MemoryFaultError),
    "rocm-like": ("hipErrorIllegalAddress", 700, MemoryFaultError),
    "xpu-like": ("ZE_RESULT_ERROR_DEVICE_LOST", 0x70000001, DeviceLostError),
}
OOM = {
    "cuda-like": ("CUDA_ERROR_OUT_OF_MEMORY", 2),
    "rocm-like": ("hipErrorOutOfMemory", 2),
    "xpu-like": ("ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY", 0x70000003),
}
INVALID_DEVICE = {
    "cuda-like": ("CUDA_ERROR_INVALID_DEVICE", 101),
    "rocm-like": ("hipErrorInvalidDevice", 101),
    "xpu-like": ("ZE_RESULT_ERROR_INVALID_ARGUMENT", 0x78000004),
}
INVALID_CONTEXT = {
    "cuda-like": ("CUDA_ERROR_INVALID_CONTEXT", 201),
    "rocm-like": ("hipErrorInvalidContext", 201),
    "xpu-like": ("ZE_RESULT_ERROR_INVALID_NULL_HANDLE", 0x78000005),
}
FACE = {  # device_type, version_field, dist backend
    "cuda-like": ("cuda", "cuda", "nccl"),
    "rocm-like": ("cuda", "hip", "nccl"),
    "xpu-like": ("xpu", "xpu", "xccl"),
}
BLOCKING_MALLOC = {"cuda-like": False, "rocm-like": True, "xpu-like": False}

vendors = pytest.mark.parametrize("vendor", VENDORS)


def assert_code(err: FornaxError, vendor: str, name: str, value: int) -> None:
    assert err.code is not None, f"{err!r} carries no vendor code"
    assert (err.code.api, err.code.name, err.code.value) == (API[vendor], name, value), str(err)
    assert name in str(err)


# -- helpers ------------------------------------------------------------------------------
def make_driver(vendor: str, spec: str = "tiny", devices: int = 1):
    s = load_spec(spec)
    return get_vendor(vendor).driver([Device(s, i) for i in range(devices)])


def small_graph() -> Graph:
    """y = relu(x + x) on a 4x8 float32 input (one fused pointwise kernel)."""
    g = Graph("small")
    x = g.input("x", (4, 8), DType.FLOAT32)
    g.output(g.op("relu", g.op("add", x, x)))
    return g


def compile_small(vendor: str, driver, fmt: str | None = None, arch: str | None = None):
    comp = get_vendor(vendor).compiler()
    props = driver.properties(0)
    fmt = fmt or next(f for f in comp.output_formats() if f in driver.loadable_formats(0))
    plan = comp.compile(small_graph(), Target(arch or props.target, fmt, props.compute_units))
    return plan


def run_small(driver, ctx, module, plan, x: np.ndarray, queue=None) -> np.ndarray:
    """Upload x, launch the plan's one kernel, download y."""
    (step,) = plan.steps
    q = queue or driver.create_queue(ctx)
    ptrs = {bid: driver.allocate(ctx, buf.nbytes) for bid, buf in plan.buffers.items()}
    q.copy_h2d(ptrs[plan.inputs[0]], x)
    q.launch(module, step.entry, step.grid, {k: ptrs[b] for k, b in step.args.items()})
    out = np.zeros((4, 8), np.float32)
    q.copy_d2h(out, ptrs[plan.outputs[0]])
    q.synchronize()
    return out


def expected_small(x: np.ndarray) -> np.ndarray:
    return np.maximum(2 * x.astype(np.float64), 0)


def oob_program() -> isa.Program:
    """Copies 64 floats starting 1024 elements (4 KiB) past ``src``: past a one-page buffer."""
    return isa.verify(isa.Program("oob", (isa.Param("src", "ptr", "float32"),
                                          isa.Param("dst", "ptr", "float32")), (
        isa.Arange("%i", 64),
        isa.Const("%far", 1024, "int64"),
        isa.Binary("%o", "add", "%i", "%far"),
        isa.Load("%v", "src", "%o"),
        isa.Store("dst", "%i", "%v"),
    ), {"group_size": 64}))


def copy_program() -> isa.Program:
    """dst[i] = src[i] * 3 for i < 64 (an in-bounds kernel of the same shape)."""
    return scale_program()


def own_image(vendor: str, driver, programs) -> KernelBinary:
    """Hand-written kernels packed by the vendor's own encoder (its compiler's emit step)."""
    comp = get_vendor(vendor).compiler()
    props = driver.properties(0)
    fmt = next(f for f in comp.output_formats() if f in driver.loadable_formats(0))
    return comp.emit(list(programs), Target(props.target, fmt, props.compute_units))


# == driver ===============================================================================
@vendors
@pytest.mark.parametrize("spec", ["tiny", "h200-like"])
def test_driver_properties_use_the_family_vocabulary(vendor, spec):
    drv = make_driver(vendor, spec)
    assert drv.device_count() == 1
    props = drv.properties(0)
    assert props.target == TARGETS[(vendor, spec)]
    assert props.memory_bytes == load_spec(spec).hbm_bytes
    assert props.simd_width == {"cuda-like": 32, "rocm-like": 64, "xpu-like": 16}[vendor]
    native = props.native
    if vendor == "cuda-like":
        cc = {"sm_90": (9, 0), "sm_80": (8, 0)}[props.target]
        assert (native["major"], native["minor"]) == cc
        assert native["warpSize"] == 32
    elif vendor == "rocm-like":
        assert native["gcnArchName"] == f"{props.target}:sramecc+:xnack-"
        assert native["warpSize"] == 64
    else:
        assert native["type"] == "ZE_DEVICE_TYPE_GPU"
        assert 16 in native["subGroupSizes"] and 32 in native["subGroupSizes"]
    assert set(drv.loadable_formats(0)) == FORMATS[vendor]


@vendors
def test_driver_enumerates_devices_and_rejects_bad_ordinals(vendor):
    drv = make_driver(vendor, devices=2)
    assert drv.device_count() == 2
    assert drv.properties(1).index == 1
    with pytest.raises(FornaxError) as exc:
        drv.properties(2)
    assert_code(exc.value, vendor, *INVALID_DEVICE[vendor])


@vendors
def test_driver_copy_round_trip(vendor):
    drv = make_driver(vendor)
    ctx = drv.create_context(0)
    q = drv.create_queue(ctx)
    src = np.arange(1000, dtype=np.float32) * 0.5 - 7
    ptr = drv.allocate(ctx, src.nbytes)
    q.copy_h2d(ptr, src)
    back = np.zeros_like(src)
    q.copy_d2h(back, ptr)
    q.synchronize()
    np.testing.assert_array_equal(back, src)


@vendors
def test_driver_loads_and_launches_every_format_of_its_own_compiler(vendor):
    drv = make_driver(vendor)
    ctx = drv.create_context(0)
    x = np.linspace(-3, 3, 32, dtype=np.float32).reshape(4, 8)
    comp = get_vendor(vendor).compiler()
    assert set(comp.output_formats()) <= set(drv.loadable_formats(0))
    for fmt in comp.output_formats():
        plan = compile_small(vendor, drv, fmt)
        assert plan.binary.format == fmt
        module = drv.load_module(ctx, plan.binary)
        np.testing.assert_allclose(run_small(drv, ctx, module, plan, x), expected_small(x), rtol=1e-6)


@vendors
def test_driver_rejects_a_corrupted_image_with_the_family_code(vendor):
    drv = make_driver(vendor)
    ctx = drv.create_context(0)
    for fmt in get_vendor(vendor).compiler().output_formats():
        binary = compile_small(vendor, drv, fmt).binary
        for pos in (len(binary.data) // 2, len(binary.data) - 1):
            data = bytearray(binary.data)
            data[pos] ^= 0xFF
            with pytest.raises(BinaryError) as exc:
                drv.load_module(ctx, replace(binary, data=bytes(data)))
            assert_code(exc.value, vendor, *CORRUPT[fmt])
        with pytest.raises(BinaryError) as exc:                 # truncated
            drv.load_module(ctx, replace(binary, data=binary.data[:-9]))
        assert_code(exc.value, vendor, *CORRUPT[fmt])
    # the context is still usable afterwards: a load failure is not sticky
    drv.load_module(ctx, compile_small(vendor, drv).binary)


CHECKSUMMED = [(v, f) for v in VENDORS for f in sorted(FORMATS[v]) if f != "ptx-like"]


@pytest.mark.parametrize("vendor,fmt", CHECKSUMMED)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_damaged_byte_of_a_container_image_is_rejected(vendor, fmt, data):
    drv = _CACHE.get(vendor) or _CACHE.setdefault(vendor, make_driver(vendor, "h200-like"))
    key = (vendor, fmt)
    if key not in _CACHE:
        _CACHE[key] = compile_small(vendor, drv, fmt).binary
    binary = _CACHE[key]
    pos = data.draw(st.integers(0, len(binary.data) - 1), label="byte")
    mask = data.draw(st.integers(1, 255), label="xor")
    damaged = bytearray(binary.data)
    damaged[pos] ^= mask
    with pytest.raises(BinaryError) as exc:
        drv.load_module(drv.create_context(0), replace(binary, data=bytes(damaged)))
    assert_code(exc.value, vendor, *CORRUPT[fmt])


_CACHE: dict = {}


def test_cuda_like_ptx_text_that_does_not_assemble_is_invalid_ptx():
    drv = make_driver("cuda-like")
    ctx = drv.create_context(0)
    binary = compile_small("cuda-like", drv, "ptx-like").binary
    text = binary.data.decode()
    assert "%ctaid.x" in text and text.rstrip().endswith("}")
    for bad in (text.replace("%ctaid.x", "%ctaxx.x", 1),         # unknown instruction
                text.rstrip()[:-1],                                # unterminated kernel
                text.replace(".global .f32", ".global .f99", 1)):  # unknown dtype
        with pytest.raises(BinaryError) as exc:
            drv.load_module(ctx, replace(binary, data=bad.encode()))
        assert_code(exc.value, "cuda-like", "CUDA_ERROR_INVALID_PTX", 218)


@vendors
def test_driver_rejects_another_familys_format(vendor):
    drv = make_driver(vendor)
    ctx = drv.create_context(0)
    for other in VENDORS:
        if other == vendor:
            continue
        for fmt in get_vendor(other).compiler().output_formats():
            other_drv = make_driver(other)
            binary = compile_small(other, other_drv, fmt).binary
            with pytest.raises(FornaxError) as exc:
                drv.load_module(ctx, binary)
            assert_code(exc.value, vendor, *UNSUPPORTED_FORMAT[vendor])
            assert fmt in exc.value.message


@vendors
def test_driver_rejects_an_exact_binary_for_another_arch(vendor):
    drv = make_driver(vendor, "tiny")
    ctx = drv.create_context(0)
    fmt, other_arch = {"cuda-like": ("cubin-like", "sm_90"), "rocm-like": ("hsaco-like", "gfx942"),
                       "xpu-like": ("zebin-like", "pvc")}[vendor]
    plan = compile_small(vendor, drv, fmt, arch=other_arch)
    assert plan.binary.target == other_arch
    with pytest.raises(BinaryError) as exc:
        drv.load_module(ctx, plan.binary)
    assert_code(exc.value, vendor, *NO_BINARY[vendor])
    assert other_arch in exc.value.message and TARGETS[(vendor, "tiny")] in exc.value.message
    # and the same binary loads on the device it was built for
    big = make_driver(vendor, "h200-like")
    assert big.load_module(big.create_context(0), plan.binary).how == "loaded"


def test_cuda_like_ptx_jits_forward_but_not_backward():
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    big = make_driver("cuda-like", "h200-like")                      # sm_90
    plan80 = compile_small("cuda-like", big, "ptx-like", arch="sm_80")
    assert plan80.binary.target == "compute_80"
    ctx = big.create_context(0)
    module = big.load_module(ctx, plan80.binary)
    assert module.how == "jit"
    np.testing.assert_allclose(run_small(big, ctx, module, plan80, x), expected_small(x), rtol=1e-6)

    tiny = make_driver("cuda-like", "tiny")                          # sm_80
    plan90 = compile_small("cuda-like", tiny, "ptx-like", arch="sm_90")
    assert plan90.binary.target == "compute_90"
    with pytest.raises(BinaryError) as exc:
        tiny.load_module(tiny.create_context(0), plan90.binary)
    assert exc.value.code.name in ("CUDA_ERROR_NO_BINARY_FOR_GPU", "CUDA_ERROR_INVALID_PTX")
    assert exc.value.code.value in (209, 218)
    assert "compute_90" in exc.value.message and "sm_80" in exc.value.message


@vendors
def test_driver_unknown_kernel_name(vendor):
    drv = make_driver(vendor)
    ctx = drv.create_context(0)
    plan = compile_small(vendor, drv)
    module = drv.load_module(ctx, plan.binary)
    q = drv.create_queue(ctx)
    buf = drv.allocate(ctx, 4096)
    with pytest.raises(FornaxError) as exc:
        q.launch(module, "no_such_kernel", (1, 1, 1), {"in0": buf, "out0": buf})
    assert_code(exc.value, vendor, *NOT_FOUND[vendor])
    assert "no_such_kernel" in exc.value.message


@vendors
def test_illegal_address_is_sticky_for_the_context_only(vendor):
    name, value, cls = ILLEGAL_ADDRESS[vendor]
    drv = make_driver(vendor)
    ctx = drv.create_context(0)
    module = drv.load_module(ctx, own_image(vendor, drv, [oob_program()]))
    q = drv.create_queue(ctx)
    src = drv.allocate(ctx, 4096)               # one page: element 1024 lies past its end
    dst = drv.allocate(ctx, 4096)
    q.launch(module, "oob", (1, 1, 1), {"src": src, "dst": dst})   # asynchronous: no error yet
    with pytest.raises(cls) as exc:
        q.synchronize()
    assert_code(exc.value, vendor, name, value)
    assert exc.value.address is not None and exc.value.address >= src + 4096

    # sticky: every later call on this context reports the same code
    for call in (q.synchronize,
                 lambda: drv.synchronize(ctx),
                 lambda: drv.allocate(ctx, 256),
                 lambda: drv.create_queue(ctx),
                 lambda: drv.load_module(ctx, module.binary),
                 lambda: q.copy_h2d(dst, np.zeros(4, np.float32))):
        with pytest.raises(FornaxError) as again:
            call()
        assert_code(again.value, vendor, name, value)

    # the context can still be destroyed; afterwards it is an invalid context
    drv.destroy_context(ctx)
    with pytest.raises(FornaxError) as gone:
        drv.allocate(ctx, 256)
    assert_code(gone.value, vendor, *INVALID_CONTEXT[vendor])

    # a new context on the same device works
    ctx2 = drv.create_context(0)
    q2 = drv.create_queue(ctx2)
    mod2 = drv.load_module(ctx2, own_image(vendor, drv, [copy_program()]))
    a, b = drv.allocate(ctx2, 4096), drv.allocate(ctx2, 4096)
    x = np.arange(64, dtype=np.float32) - 10
    q2.copy_h2d(a, x)
    q2.launch(mod2, "triple", (1, 1, 1), {"src": a, "dst": b})
    out = np.zeros(64, np.float32)
    q2.copy_d2h(out, b)
    q2.synchronize()
    drv.synchronize(ctx2)
    np.testing.assert_array_equal(out, x * 3)


@vendors
def test_illegal_address_reported_by_a_context_synchronize(vendor):
    name, value, cls = ILLEGAL_ADDRESS[vendor]
    drv = make_driver(vendor)
    ctx = drv.create_context(0)
    module = drv.load_module(ctx, own_image(vendor, drv, [oob_program()]))
    q = drv.create_queue(ctx)
    src, dst = drv.allocate(ctx, 4096), drv.allocate(ctx, 4096)
    q.launch(module, "oob", (1, 1, 1), {"src": src, "dst": dst})
    with pytest.raises(cls) as exc:
        drv.synchronize(ctx)                     # cuCtxSynchronize / hipDeviceSynchronize
    assert_code(exc.value, vendor, name, value)
    with pytest.raises(FornaxError) as again:
        drv.allocate(ctx, 256)
    assert_code(again.value, vendor, name, value)


@vendors
def test_allocation_beyond_capacity_is_out_of_memory_with_usage_hint(vendor):
    drv = make_driver(vendor)                    # tiny: 64 MiB
    ctx = drv.create_context(0)
    capacity = load_spec("tiny").hbm_bytes
    held = drv.allocate(ctx, 1 << 20)
    with pytest.raises(OutOfMemoryError) as exc:
        drv.allocate(ctx, capacity)
    assert_code(exc.value, vendor, *OOM[vendor])
    assert "bytes in use" in exc.value.hint
    assert str(1 << 20) in exc.value.hint and str(capacity) in exc.value.hint
    # not sticky: the context keeps working
    drv.free(ctx, held)
    drv.allocate(ctx, 1 << 20)


@vendors
def test_queue_record_wait_orders_work_across_queues(vendor):
    drv = make_driver(vendor)
    ctx = drv.create_context(0)
    module = drv.load_module(ctx, own_image(vendor, drv, [copy_program()]))
    x = np.arange(64, dtype=np.float32) + 1

    def attempt(ordered: bool) -> np.ndarray:
        qa, qb = drv.create_queue(ctx), drv.create_queue(ctx)
        a, b = drv.allocate(ctx, 4096), drv.allocate(ctx, 4096)
        qa.copy_h2d(a, x)
        qa.launch(module, "triple", (1, 1, 1), {"src": a, "dst": b})
        if ordered:
            qb.wait(qa.record())
        out = np.full(64, -1, np.float32)
        qb.copy_d2h(out, b)
        qb.synchronize()
        qa.synchronize()
        return out

    np.testing.assert_array_equal(attempt(True), x * 3)
    # without the dependency the copy may run first: the device is asynchronous
    assert not np.array_equal(attempt(False), x * 3)


# -- rocm-like: AQL packets -----------------------------------------------------------------
def test_rocm_like_aql_queue_writes_dispatch_packets():
    from fornax.vendors.rocm_like.driver import (
        BARRIER_AND,
        DISPATCH,
        PACKET_SIZE,
        PACKET_TYPE_BARRIER_AND,
        PACKET_TYPE_KERNEL_DISPATCH,
    )
    assert DISPATCH.size == PACKET_SIZE == 64 and BARRIER_AND.size == 64
    drv = make_driver("rocm-like")
    ctx = drv.create_context(0)
    module = drv.load_module(ctx, own_image("rocm-like", drv, [copy_program()]))
    q = drv.create_queue(ctx)
    a, b = drv.allocate(ctx, 4096), drv.allocate(ctx, 4096)
    x = np.arange(64, dtype=np.float32)
    q.copy_h2d(a, x)
    w0, r0, d0 = q.write_index, q.read_index, q.doorbells
    q.launch(module, "triple", (3, 1, 1), {"src": a, "dst": b})
    assert (q.write_index, q.read_index, q.doorbells) == (w0 + 1, r0 + 1, d0 + 1)
    raw = q.ring[w0 * 64:(w0 + 1) * 64].tobytes()
    f = DISPATCH.unpack(raw)
    assert f[0] & 0xFF == PACKET_TYPE_KERNEL_DISPATCH
    assert f[1] == 3                                   # dimensions
    assert (f[2], f[3], f[4]) == (64, 1, 1)            # work-group size
    assert (f[6], f[7], f[8]) == (3 * 64, 1, 1)        # grid size in work-items
    kernarg = f[12]
    assert kernarg != 0
    assert f[14] != 0                                  # completion signal
    # the kernarg segment holds the two pointers
    assert struct.unpack("<qq", ctx.space.read(kernarg, 16)) == (a, b)
    other = drv.create_queue(ctx)
    other.wait(q.record())
    braw = other.ring[0:64].tobytes()
    assert struct.unpack_from("<H", braw)[0] & 0xFF == PACKET_TYPE_BARRIER_AND
    assert (other.write_index, other.read_index) == (1, 1)
    out = np.zeros(64, np.float32)
    other.copy_d2h(out, b)
    other.synchronize()
    np.testing.assert_array_equal(out, x * 3)


# -- xpu-like: command lists, fences and events -------------------------------------------------
def _xpu_setup():
    drv = make_driver("xpu-like")
    ctx = drv.create_context(0)
    module = drv.load_module(ctx, own_image("xpu-like", drv, [copy_program()]))
    a, b = drv.allocate(ctx, 4096), drv.allocate(ctx, 4096)
    x = np.arange(64, dtype=np.float32) - 5
    imm = drv.create_queue(ctx)
    imm.copy_h2d(a, x)
    imm.synchronize()
    return drv, ctx, module, a, b, x


def test_xpu_like_command_list_must_be_closed_and_fence_waits():
    drv, ctx, module, a, b, x = _xpu_setup()
    cq = drv.create_command_queue(ctx)
    cl = drv.create_command_list(ctx)
    cl.append_launch(module, "triple", (1, 1, 1), {"src": a, "dst": b})
    with pytest.raises(FornaxError) as exc:
        cq.execute([cl])
    assert_code(exc.value, "xpu-like", "ZE_RESULT_ERROR_INVALID_ARGUMENT", 0x78000004)
    assert "closed" in exc.value.message
    cl.close()
    with pytest.raises(FornaxError):                    # a closed list takes no more commands
        cl.append_barrier()
    fence = cq.create_fence()
    cq.execute([cl], fence)
    fence.host_synchronize()
    out = np.zeros(64, np.float32)
    imm = drv.create_queue(ctx)
    imm.copy_d2h(out, b)
    imm.synchronize()
    np.testing.assert_array_equal(out, x * 3)


def test_xpu_like_events_are_not_auto_reset():
    drv, ctx, module, a, b, _x = _xpu_setup()
    ev = drv.create_event_pool(ctx, 2).event(0)
    assert ev.query() is False
    cq = drv.create_command_queue(ctx)
    cl = drv.create_command_list(ctx)
    cl.append_launch(module, "triple", (1, 1, 1), {"src": a, "dst": b}, signal=ev)
    cl.append_signal_event(ev)                           # signalled twice, never reset
    cl.close()
    fence = cq.create_fence()
    cq.execute([cl], fence)
    fence.host_synchronize()
    assert ev.query() is True
    cq.execute([cl], fence)                              # re-executed without a host reset
    fence.host_synchronize()
    assert ev.query() is True
    ev.host_reset()
    assert ev.query() is False
    cq.execute([cl], fence)
    ev.host_synchronize()
    assert ev.query() is True


# == runtime ===============================================================================
def make_runtime(vendor: str, spec: str = "tiny"):
    return get_vendor(vendor).runtime(make_driver(vendor, spec))


@vendors
def test_runtime_caching_allocator_reuses_freed_blocks(vendor):
    rt = make_runtime(vendor)
    drv = rt.driver
    p1 = rt.malloc(1000)
    device_allocs = drv.counts["allocations"]
    rt.free(p1)
    p2 = rt.malloc(1000)
    assert p2 == p1                                       # the cached block comes back
    assert drv.counts["allocations"] == device_allocs     # without a new device allocation
    p3 = rt.malloc(1000)                                  # p2 is live: the next 1024 bytes of its segment
    assert p3 == p2 + 1024 and drv.counts["allocations"] == device_allocs
    big = rt.malloc(3 * 1024 * 1024)                      # a large request: its own 20 MiB segment
    assert drv.counts["allocations"] == device_allocs + 1
    rt.free(big)
    rt.free(p3)
    with pytest.raises(InvalidArgumentError):
        rt.free(12345)
    rt.free(p2)
    with pytest.raises(InvalidArgumentError):
        rt.free(p2)                                       # double free


@vendors
def test_runtime_memcpy_round_trip(vendor):
    rt = make_runtime(vendor)
    x = np.random.default_rng(1).standard_normal((17, 13)).astype(np.float32)
    p = rt.malloc(x.nbytes)
    rt.memcpy_h2d(p, x)
    out = np.empty_like(x)
    rt.memcpy_d2h(out, p)
    np.testing.assert_array_equal(out, x)


@vendors
def test_runtime_module_cache(vendor):
    rt = make_runtime(vendor)
    plan = compile_small(vendor, rt.driver)
    m1 = rt.load_module(plan.binary)
    loads = rt.driver.counts["modules_loaded"]
    m2 = rt.load_module(plan.binary)
    assert m2 is m1
    assert rt.driver.counts["modules_loaded"] == loads


@vendors
def test_runtime_blocking_malloc_per_family(vendor):
    rt = make_runtime(vendor)
    p = rt.malloc(4096)
    rt.memcpy_h2d(p, np.ones(1024, np.float32))          # enqueued, not yet run
    timeline = rt.driver.devices[0].timeline
    assert any(q.pending for q in timeline.queues)
    rt.malloc(8192)
    pending = any(q.pending for q in timeline.queues)
    assert pending is (not BLOCKING_MALLOC[vendor])       # hipMalloc synchronises the device


# == compiler ==============================================================================
def mlp_graph(dtype=DType.FLOAT32, m=8, k=16, h=24, n=5):
    rng = np.random.default_rng(7)
    npdt = dtype.numpy
    w1 = (rng.standard_normal((k, h)) / 4).astype(npdt)
    b1 = (rng.standard_normal((h,)) / 4).astype(npdt)
    w2 = (rng.standard_normal((h, n)) / 4).astype(npdt)
    g = Graph("mlp")
    x = g.input("x", (m, k), dtype)
    hid = g.op("relu", g.op("add", g.op("matmul", x, g.constant(w1, "w1")), g.constant(b1, "b1")))
    g.output(g.op("matmul", hid, g.constant(w2, "w2")))
    xv = rng.standard_normal((m, k)).astype(npdt)
    f = lambda a: a.astype(np.float64)
    ref = np.maximum(f(xv) @ f(w1) + f(b1), 0) @ f(w2)
    return g, xv, ref


@vendors
def test_compiler_formats_and_mlp_plan(vendor):
    comp = get_vendor(vendor).compiler()
    assert comp.output_formats(), "a compiler must emit at least one format"
    assert set(comp.output_formats()) == FORMATS[vendor]
    rt = make_runtime(vendor)
    lib = get_vendor(vendor).library(rt)
    props = rt.driver.properties(0)
    for fmt in comp.output_formats():
        g, xv, ref = mlp_graph()
        plan = comp.compile(g, Target(props.target, fmt, props.compute_units), lib.ops())
        assert plan.binary is not None and plan.binary.format == fmt
        (out,) = execute_plan(plan, [xv], rt, lib)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(FornaxError):
        comp.compile(mlp_graph()[0], Target(props.target, "no-such-format", 1))


# == library ===============================================================================
TOL = {DType.FLOAT32: 1e-5, DType.FLOAT16: 2e-3, DType.BFLOAT16: 1.6e-2}


@vendors
@pytest.mark.parametrize("dtype", [DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16])
def test_library_gemm_matches_float64(vendor, dtype):
    rt = make_runtime(vendor)
    lib = get_vendor(vendor).library(rt)
    m, n, k = 33, 20, 40
    rng = np.random.default_rng(3)
    a = rng.standard_normal((m, k)).astype(dtype.numpy)
    b = rng.standard_normal((k, n)).astype(dtype.numpy)
    pa, pb, pc = rt.malloc(a.nbytes), rt.malloc(b.nbytes), rt.malloc(m * n * dtype.itemsize)
    rt.memcpy_h2d(pa, a)
    rt.memcpy_h2d(pb, b)
    rec = lib.gemm(pa, pb, pc, {"m": m, "n": n, "k": k, "dtype": dtype.value})
    c = np.empty((m, n), dtype.numpy)
    rt.memcpy_d2h(c, pc)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = np.abs(c.astype(np.float64) - ref).max() / np.abs(ref).max()
    assert err <= TOL[dtype], f"{dtype}: relative error {err:.2e}"
    # the algorithm choice is recorded, with a reason
    names = {al["name"]: tuple(al["tile"]) for al in get_vendor(vendor).facts["library"]["gemm_algorithms"]}
    assert rec.algorithm in names
    assert rec.reason and "tile" in rec.reason
    assert lib.calls[-1] is rec
    # a 33x20 problem on a 4-unit chip fits in one wave of the smallest tile
    assert names[rec.algorithm] == min(names.values(), key=lambda t: t[0] * t[1])


@vendors
def test_library_rejects_unsupported_dtype(vendor):
    rt = make_runtime(vendor)
    lib = get_vendor(vendor).library(rt)
    p = rt.malloc(4096)
    with pytest.raises(LibraryError):
        lib.gemm(p, p, p, {"m": 4, "n": 4, "k": 4, "dtype": "int32"})


def test_rocm_like_library_without_an_image_for_the_device(tmp_path: Path):
    text = (Path(load_spec.__code__.co_filename).parent / "specs" / "tiny.toml").read_text()
    spec_file = tmp_path / "custom.toml"
    spec_file.write_text(text.replace('name = "tiny"', 'name = "custom-chip"'))
    spec = load_spec(spec_file)
    assert spec.name == "custom-chip"
    drv = get_vendor("rocm-like").driver([Device(spec)])
    assert drv.properties(0).target == "gfx942"            # an unknown chip maps to the default
    rt = get_vendor("rocm-like").runtime(drv)
    lib = get_vendor("rocm-like").library(rt)
    lib.shipped = [s for s in lib.shipped if s["target"] != "gfx942"]   # a build without gfx942
    assert lib.shipped
    p = rt.malloc(4096)
    with pytest.raises(LibraryError) as exc:
        lib.gemm(p, p, p, {"m": 4, "n": 4, "k": 4, "dtype": "float32"})
    assert "no kernel image" in exc.value.message and "gfx942" in exc.value.message


# == framework =============================================================================
def make_framework(vendor: str):
    rt = make_runtime(vendor)
    lib = get_vendor(vendor).library(rt)
    comp = get_vendor(vendor).compiler()
    props = rt.driver.properties(0)
    fmt = next(f for f in comp.output_formats() if f in rt.driver.loadable_formats(0))
    return get_vendor(vendor).framework(comp, lib, rt, Target(props.target, fmt, props.compute_units))


@vendors
def test_framework_face(vendor):
    fw = make_framework(vendor)
    device_type, version_field, backend = FACE[vendor]
    assert fw.face.device_type == device_type
    assert fw.face.version_field == version_field
    assert fw.face.dist_backend == backend
    assert fw.face.module == f"torch.{device_type}"
    rep = fw.report()
    assert f"version.{version_field}" in rep


@vendors
def test_framework_route(vendor):
    fw = make_framework(vendor)
    assert fw.route("matmul").kind == "native"
    assert fw.route("relu").kind == "native"
    softmax = fw.route("softmax")
    assert softmax.kind == ("decomposed" if vendor == "xpu-like" else "native")
    fw.native = fw.native - {"tanh"}
    r = fw.route("tanh")
    assert r.kind == "fallback" and "tanh" in r.reason and "CPU" in r.reason


@vendors
def test_framework_cpu_fallback_still_gives_correct_numbers(vendor):
    fw = make_framework(vendor)
    fw.native = fw.native - {"relu"}
    g, xv, ref = mlp_graph()
    res = fw.run(g, {"x": xv})
    np.testing.assert_allclose(res.outputs[0], ref, rtol=1e-4, atol=1e-5)
    assert [fb["op"] for fb in res.fallbacks] == ["relu"]
    assert res.fallbacks[0]["reason"]
    assert {r.op: r.kind for r in res.routes}["relu"] == "fallback"
    assert len(res.plans) == 2                            # device work on both sides of the fallback
