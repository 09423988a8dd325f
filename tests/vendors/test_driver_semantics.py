"""Where the three driver families really differ, pinned family against family.

Every expected code below is written by hand from the real headers (CUresult,
hipError_t, ze_result_t); every expected number (migrated bytes, extra time)
is computed here from the chip spec, never read back from the code under test.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from fornax.layers.compiler import Target
from fornax.layers.errors import FornaxError
from fornax.sim import isa
from fornax.sim.device import Device
from fornax.sim.faults import FaultPlan, FaultSpec
from fornax.sim.spec import load_spec
from fornax.sim.topology import Topology
from fornax.stack import get_vendor
from fornax.vendors.cuda_like.compiler import fatbin_image, ptx_image
from fornax.vendors.rocm_like.compiler import ENCODERS as HSACO_ENCODERS
from fornax.vendors.xpu_like.compiler import spirv_image
from helpers import FAMILIES, scale_program

N = 64
OLD = np.full(N, -7.0, np.float32)
SRC = np.arange(N, dtype=np.float32) + 1
API = {"cuda-like": "CUresult", "rocm-like": "hipError_t", "xpu-like": "ze_result_t"}


def assert_code(err: FornaxError, vendor: str, name: str, value: int) -> None:
    assert err.code is not None, f"{err!r} carries no vendor code"
    assert (err.code.api, err.code.name, err.code.value) == (API[vendor], name, value), str(err)


def program(name: str = "scale3", factor: float = 3.0, **meta) -> isa.Program:
    """dst[i] = src[i] * factor for i < 64."""
    return scale_program(name, factor, N, **meta)


def broken_program(name: str = "broken") -> isa.Program:
    """Stores a register nothing wrote: the verifier rejects it."""
    return isa.Program(name, (isa.Param("dst", "ptr", "float32"),), (
        isa.Arange("%i", N),
        isa.Store("dst", "%i", "%never_written"),
    ), {"group_size": 64})


def driver(vendor: str, spec: str = "tiny", devices: int = 1):
    s = load_spec(spec)
    devs = [Device(s, i) for i in range(devices)]
    if devices > 1:
        Topology.build(s, devices, "switch").connect(devs)
    return get_vendor(vendor).driver(devs)


def image(vendor: str, drv, programs, fmt: str | None = None):
    comp = get_vendor(vendor).compiler()
    props = drv.properties(0)
    fmt = fmt or next(f for f in comp.output_formats() if f in drv.loadable_formats(0))
    return comp.emit(programs, Target(props.target, fmt, props.compute_units))


def kernel_span(drv, label: str) -> float:
    (rec,) = [r for d in drv.devices for r in d.timeline.records if r.label == label]
    return rec.end - rec.start


# == contexts ================================================================================
def test_cuda_like_calls_without_a_context_use_the_thread_current_context():
    drv = driver("cuda-like")
    with pytest.raises(FornaxError) as exc:
        drv.allocate(None, 64)                        # nothing current yet
    assert_code(exc.value, "cuda-like", "CUDA_ERROR_INVALID_CONTEXT", 201)
    ctx = drv.create_context(0)                       # cuCtxCreate makes it current
    assert drv.get_current() is ctx
    p = drv.allocate(None, 64)
    assert ctx.space.resolve(p, 64)[0].va == p        # the allocation lives in the current context
    seen = {}

    def other_thread():
        seen["current"] = drv.get_current()
        try:
            drv.allocate(None, 64)
        except FornaxError as err:
            seen["err"] = err

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert seen["current"] is None                    # current contexts are per thread
    assert_code(seen["err"], "cuda-like", "CUDA_ERROR_INVALID_CONTEXT", 201)
    assert drv.pop_current() is ctx
    with pytest.raises(FornaxError) as exc:
        drv.pop_current()                             # the stack is empty now
    assert_code(exc.value, "cuda-like", "CUDA_ERROR_INVALID_CONTEXT", 201)
    other = drv.create_context(0)
    drv.push_current(ctx)
    assert drv.get_current() is ctx
    assert drv.pop_current() is ctx and drv.get_current() is other
    drv.set_current(None)                             # cuCtxSetCurrent(NULL) pops the top
    assert drv.get_current() is None


def test_rocm_like_uses_the_selected_device_primary_context_and_xpu_like_needs_one():
    hip = driver("rocm-like", devices=2)
    p = hip.allocate(None, 64)                        # no hipSetDevice yet: device 0
    assert hip.devices[0].memory.owner_of(p) is not None
    hip.set_device(1)                                 # hipSetDevice(1)
    q = hip.allocate(None, 64)
    assert hip.devices[1].memory.owner_of(q) is not None
    assert hip.get_current() is hip.primary_context(1)
    ze = driver("xpu-like")
    with pytest.raises(FornaxError) as exc:
        ze.allocate(None, 64)
    assert_code(exc.value, "xpu-like", "ZE_RESULT_ERROR_INVALID_NULL_HANDLE", 0x78000005)
    with pytest.raises(FornaxError) as exc:
        ze.set_current(ze.create_context(0))          # Level Zero has no current context
    assert_code(exc.value, "xpu-like", "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE", 0x78000003)


# == managed / shared memory ===================================================================
def _managed_run(vendor: str, managed: bool, prefetch: bool = False):
    drv = driver(vendor)
    ctx = drv.create_context(0)
    module = drv.load_module(ctx, image(vendor, drv, [program()]))
    kind = "managed" if managed else "device"
    src, dst = drv.allocate(ctx, 4 * N, kind), drv.allocate(ctx, 4 * N, kind)
    q = drv.create_queue(ctx)
    if managed:
        drv.host_write(ctx, src, SRC)                 # the host writes managed memory directly
    else:
        q.copy_h2d(src, SRC)
    if prefetch:
        q.prefetch(src, 4 * N)
        q.prefetch(dst, 4 * N)
    q.launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst})
    q.synchronize()
    return drv, ctx, dst


def test_cuda_like_managed_memory_migrates_to_the_device_and_back():
    drv, ctx, dst = _managed_run("cuda-like", True)
    spec = drv.devices[0].spec
    c = drv.report()
    # 256-byte buffers: one 64 KiB migration block each, clipped to the allocation
    assert (c["managed_faults"], c["managed_migrations_h2d"], c["managed_bytes_h2d"]) == (2, 2, 512)
    base, _, _ = _managed_run("cuda-like", False)
    extra = kernel_span(drv, "scale3") - kernel_span(base, "scale3")
    assert extra == pytest.approx(2 * 2.0e-5 + 512 / spec.host_link_bandwidth, rel=1e-9)
    out = np.frombuffer(drv.host_read(ctx, dst, 4 * N), np.float32)
    np.testing.assert_array_equal(out, SRC * 3)
    c = drv.report()
    assert (c["managed_migrations_d2h"], c["managed_bytes_d2h"]) == (1, 256)   # dst came back
    assert c["managed_remote_bytes"] == 0


def test_rocm_like_managed_memory_stays_on_the_host_without_xnack():
    drv, ctx, dst = _managed_run("rocm-like", True)
    assert drv.native_properties(drv.devices[0], drv.target(0))["gcnArchName"].endswith("xnack-")
    spec = drv.devices[0].spec
    out = np.frombuffer(drv.host_read(ctx, dst, 4 * N), np.float32)
    np.testing.assert_array_equal(out, SRC * 3)       # slow, not wrong
    c = drv.report()
    assert (c["managed_faults"], c["managed_migrations_h2d"], c["managed_migrations_d2h"]) == (0, 0, 0)
    assert c["managed_remote_bytes"] == 512           # read src, wrote dst over the host link
    base, _, _ = _managed_run("rocm-like", False)
    extra = kernel_span(drv, "scale3") - kernel_span(base, "scale3")
    assert extra == pytest.approx(512 / spec.host_link_bandwidth, rel=1e-9)


def test_xpu_like_shared_memory_prefetch_is_a_command_list_entry():
    drv = driver("xpu-like")
    ctx = drv.create_context(0)
    module = drv.load_module(ctx, image("xpu-like", drv, [program()]))
    src, dst = drv.allocate(ctx, 4 * N, "managed"), drv.allocate(ctx, 4 * N, "managed")
    drv.host_write(ctx, src, SRC)
    cl = drv.create_command_list(ctx)
    cl.append_memory_prefetch(src, 4 * N)
    cl.append_memory_prefetch(dst, 4 * N)
    cl.append_barrier()
    cl.append_launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst})
    cl.close()
    cq = drv.create_command_queue(ctx)
    fence = cq.create_fence()
    cq.execute([cl], fence)
    fence.host_synchronize()
    c = drv.report()
    assert c["managed_prefetch_bytes"] == 512 and c["managed_migrations_h2d"] == 2
    assert c["managed_faults"] == 0                   # the kernel found its pages resident
    np.testing.assert_array_equal(np.frombuffer(drv.host_read(ctx, dst, 4 * N), np.float32), SRC * 3)
    plain = drv.allocate(ctx, 4 * N)
    bad = drv.create_command_list(ctx)
    bad.append_memory_prefetch(plain, 4 * N)          # device memory is not shared USM
    bad.close()
    with pytest.raises(FornaxError) as exc:
        cq.execute([bad])
    assert_code(exc.value, "xpu-like", "ZE_RESULT_ERROR_INVALID_ARGUMENT", 0x78000004)


@pytest.mark.parametrize("vendor", FAMILIES)
def test_the_host_cannot_dereference_device_memory(vendor):
    drv = driver(vendor)
    ctx = drv.create_context(0)
    p = drv.allocate(ctx, 64)
    with pytest.raises(FornaxError) as exc:
        drv.host_read(ctx, p, 64)
    name, value = {"cuda-like": ("CUDA_ERROR_INVALID_VALUE", 1),
                   "rocm-like": ("hipErrorInvalidValue", 1),
                   "xpu-like": ("ZE_RESULT_ERROR_INVALID_ARGUMENT", 0x78000004)}[vendor]
    assert_code(exc.value, vendor, name, value)
    pinned = drv.allocate(ctx, 64, "host_pinned")
    drv.host_write(ctx, pinned, bytes(range(64)))
    assert drv.host_read(ctx, pinned, 64) == bytes(range(64))


# == module formats =============================================================================
def _run(drv, ctx, module, entry="scale3") -> np.ndarray:
    src, dst = drv.allocate(ctx, 4 * N), drv.allocate(ctx, 4 * N)
    q = drv.create_queue(ctx)
    q.copy_h2d(src, SRC)
    q.launch(module, entry, (1, 1, 1), {"src": src, "dst": dst})
    out = np.zeros(N, np.float32)
    q.copy_d2h(out, dst)
    q.synchronize()
    return out


@pytest.mark.parametrize("spec, cubins, ptx, chosen, how", [
    ("h200-like", ["sm_80", "sm_90"], "sm_80", "cubin-like:sm_90", "loaded"),
    ("tiny", ["sm_80", "sm_90"], "sm_80", "cubin-like:sm_80", "loaded"),
    ("h200-like", ["sm_80"], "sm_70", "ptx-like:compute_70", "jit"),
])
def test_cuda_like_fat_bundle_picks_the_exact_cubin_else_the_ptx(spec, cubins, ptx, chosen, how):
    drv = driver("cuda-like", spec)
    ctx = drv.create_context(0)
    bundle = fatbin_image([program()], drv.target(0), "test", cubins=cubins, ptx=ptx)
    module = drv.load_module(ctx, bundle)
    assert (module.entry, module.how) == (chosen, how)
    assert module.binary is bundle
    assert drv.report()["jit_compiles"] == (1 if how == "jit" else 0)
    np.testing.assert_array_equal(_run(drv, ctx, module), SRC * 3)


def test_cuda_like_fat_bundle_without_a_usable_image_is_no_binary_for_gpu():
    drv = driver("cuda-like", "tiny")                 # sm_80
    ctx = drv.create_context(0)
    bundle = fatbin_image([program()], "sm_90", "test", cubins=["sm_90"], ptx="sm_90")
    with pytest.raises(FornaxError) as exc:
        drv.load_module(ctx, bundle)
    assert_code(exc.value, "cuda-like", "CUDA_ERROR_NO_BINARY_FOR_GPU", 209)
    assert "cubin-like:sm_90" in exc.value.message and "ptx-like:compute_90" in exc.value.message


def test_ptx_runs_on_newer_archs_while_a_gfx90a_code_object_refuses_gfx942():
    cuda = driver("cuda-like", "h200-like")           # sm_90
    ctx = cuda.create_context(0)
    module = cuda.load_module(ctx, ptx_image([program()], "sm_80", "test"))
    assert module.how == "jit"
    np.testing.assert_array_equal(_run(cuda, ctx, module), SRC * 3)
    rocm = driver("rocm-like", "h200-like")           # gfx942
    rctx = rocm.create_context(0)
    old = HSACO_ENCODERS["hsaco-like"]([program()], "gfx90a", "test")
    with pytest.raises(FornaxError) as exc:
        rocm.load_module(rctx, old)
    assert_code(exc.value, "rocm-like", "hipErrorNoBinaryForGpu", 209)


def test_spirv_build_failure_has_a_build_log_while_bad_ptx_is_invalid_ptx():
    ze = driver("xpu-like")
    ctx = ze.create_context(0)
    il = spirv_image([program("fine"), broken_program("broken")], "spirv64", "test")
    before = ze.module_load_s
    with pytest.raises(FornaxError) as exc:
        ze.load_module(ctx, il)
    assert_code(exc.value, "xpu-like", "ZE_RESULT_ERROR_MODULE_BUILD_FAILURE", 0x70000004)
    log = exc.value.build_log
    assert "'broken'" in log and "%never_written" in log and "'fine'" not in log
    assert ze.build_log() == log                      # zeModuleBuildLogGetString
    # the failed build still took its time: 20 ms + 1 ms per KiB of IL
    assert ze.module_load_s - before == pytest.approx(20e-3 + 1e-3 * len(il.data) / 1024)
    ze.load_module(ctx, spirv_image([program("fine")], "spirv64", "test"))
    assert ze.build_log() == ""
    cu = driver("cuda-like")
    cctx = cu.create_context(0)
    text = ptx_image([broken_program("broken")], "sm_80", "test")
    with pytest.raises(FornaxError) as exc:
        cu.load_module(cctx, text)
    assert_code(exc.value, "cuda-like", "CUDA_ERROR_INVALID_PTX", 218)


# == launch limits ===============================================================================
LIMIT_CODES = {
    # a work-group larger than the device's maximum
    "group": {"cuda-like": ("CUDA_ERROR_INVALID_VALUE", 1),
              "rocm-like": ("hipErrorInvalidValue", 1),
              "xpu-like": ("ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION", 0x78000013)},
    # registers per lane x lanes beyond a compute unit's register file
    "registers": {"cuda-like": ("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", 701),
                  "rocm-like": ("hipErrorLaunchOutOfResources", 701),
                  "xpu-like": ("ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION", 0x78000013)},
    # shared / local memory beyond a compute unit's
    "shared": {"cuda-like": ("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", 701),
               "rocm-like": ("hipErrorLaunchOutOfResources", 701),
               "xpu-like": ("ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY", 0x70000003)},
}


@pytest.mark.parametrize("vendor", FAMILIES)
@pytest.mark.parametrize("limit, meta", [
    ("group", {"group_size": 2048}),                               # tiny: max 1024
    ("registers", {"group_size": 1024, "registers": 128}),         # 131072 > 65536
    ("shared", {"shared_memory": 65536 + 1024}),                   # tiny: 64 KiB per unit
])
def test_launch_limits_are_enforced_with_each_family_code(vendor, limit, meta):
    drv = driver(vendor)
    ctx = drv.create_context(0)
    fits = program("fits", registers=64, shared_memory=65536)      # exactly at the limits
    too_big = program("too_big", **meta)
    module = drv.load_module(ctx, image(vendor, drv, [fits, too_big]))
    src, dst = drv.allocate(ctx, 4 * N), drv.allocate(ctx, 4 * N)
    q = drv.create_queue(ctx)
    q.launch(module, "fits", (1, 1, 1), {"src": src, "dst": dst})
    q.synchronize()
    with pytest.raises(FornaxError) as exc:
        q.launch(module, "too_big", (1, 1, 1), {"src": src, "dst": dst})
    assert_code(exc.value, vendor, *LIMIT_CODES[limit][vendor])


def test_generated_gemm_kernels_declare_their_tile_resources():
    from fornax.layers import codegen
    from fornax.layers.graph import DType
    prog, _ = codegen.gemm_kernel("g", DType.FLOAT32, 256, 256, 256, 1, False, (64, 64, 32), 128)
    assert prog.meta["shared_memory"] == (64 * 32 + 32 * 64) * 4      # the A and B tiles
    assert prog.meta["registers"] * 128 >= 64 * 64                    # the accumulator fits the lanes


# == queue ordering ==============================================================================
def _kernel_then_copy(vendor: str, mode: str):
    """A kernel writes dst, then a copy reads dst into out, with nothing in between."""
    drv = driver(vendor)
    ctx = drv.create_context(0)
    module = drv.load_module(ctx, image(vendor, drv, [program()]))
    src, dst, out = (drv.allocate(ctx, 4 * N) for _ in range(3))
    q = drv.create_queue(ctx)
    q.copy_h2d(src, SRC)
    q.copy_h2d(dst, OLD)
    q.synchronize()
    if vendor == "xpu-like":
        cl = drv.create_command_list(ctx, in_order=(mode == "in_order"))
        cl.append_launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst})
        if mode == "barrier":
            cl.append_barrier()
        cl.append_memory_copy(out, dst, 4 * N)
        cl.close()
        cq = drv.create_command_queue(ctx)
        fence = cq.create_fence()
        cq.execute([cl], fence)
        fence.host_synchronize()
    else:
        q.launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst})
        q.copy_d2d(out, dst, 4 * N)
    got = np.zeros(N, np.float32)
    q.copy_d2h(got, out)
    q.synchronize()
    return got, [r for d in drv.devices for r in d.races]


def test_plain_xpu_like_command_list_completes_out_of_order_and_races():
    got, races = _kernel_then_copy("xpu-like", "plain")
    np.testing.assert_array_equal(got, OLD)           # the copy finished before the kernel did
    (race,) = races
    d = race.to_dict()
    assert {d["first"]["label"], d["second"]["label"]} == {"scale3", f"d2d {4 * N}B"}


@pytest.mark.parametrize("vendor, mode", [("xpu-like", "barrier"), ("xpu-like", "in_order"),
                                          ("cuda-like", "stream"), ("rocm-like", "stream")])
def test_barrier_in_order_list_and_streams_keep_completion_order(vendor, mode):
    got, races = _kernel_then_copy(vendor, mode)
    np.testing.assert_array_equal(got, SRC * 3)
    assert races == []


def test_xpu_like_events_must_be_reset_while_cuda_like_markers_are_rerecorded():
    # xpu-like: an event signalled by an earlier execution still reads as signalled
    drv = driver("xpu-like")
    ctx = drv.create_context(0)
    module = drv.load_module(ctx, image("xpu-like", drv, [program()]))
    src, dst, out = (drv.allocate(ctx, 4 * N) for _ in range(3))
    imm = drv.create_queue(ctx)
    imm.copy_h2d(src, SRC)
    imm.copy_h2d(dst, OLD)
    imm.synchronize()
    ev = drv.create_event_pool(ctx, 1).event(0)
    cq_read, cq_write = drv.create_command_queue(ctx), drv.create_command_queue(ctx)
    writer = drv.create_command_list(ctx)
    writer.append_launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst}, signal=ev)
    writer.close()
    reader = drv.create_command_list(ctx)
    reader.append_wait_on_events(ev)
    reader.append_memory_copy(out, dst, 4 * N)
    reader.close()

    def round_trip(reset: bool) -> np.ndarray:
        imm.copy_h2d(dst, OLD)
        imm.synchronize()
        if reset:
            ev.host_reset()
        fr, fw = cq_read.create_fence(), cq_write.create_fence()
        cq_read.execute([reader], fr)                 # the reader is submitted first
        cq_write.execute([writer], fw)
        fr.host_synchronize()
        fw.host_synchronize()
        got = np.zeros(N, np.float32)
        imm.copy_d2h(got, out)
        imm.synchronize()
        return got

    np.testing.assert_array_equal(round_trip(reset=True), SRC * 3)    # first use: waits
    np.testing.assert_array_equal(round_trip(reset=False), OLD)       # stale event: no wait
    np.testing.assert_array_equal(round_trip(reset=True), SRC * 3)
    # cuda-like: record() marks the latest work every time, nothing to reset
    cu = driver("cuda-like")
    cctx = cu.create_context(0)
    cmod = cu.load_module(cctx, image("cuda-like", cu, [program()]))
    csrc, cdst = cu.allocate(cctx, 4 * N), cu.allocate(cctx, 4 * N)
    qa, qb = cu.create_queue(cctx), cu.create_queue(cctx)
    qa.copy_h2d(csrc, SRC)
    for _ in range(2):
        qa.copy_h2d(cdst, OLD)
        qa.launch(cmod, "scale3", (1, 1, 1), {"src": csrc, "dst": cdst})
        qb.wait(qa.record())
        got = np.zeros(N, np.float32)
        qb.copy_d2h(got, cdst)
        qb.synchronize()
        np.testing.assert_array_equal(got, SRC * 3)


# == peer access and faults =======================================================================
@pytest.mark.parametrize("vendor, name, value", [
    ("cuda-like", "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", 704),
    ("rocm-like", "hipErrorPeerAccessAlreadyEnabled", 704),
])
def test_enabling_peer_access_twice_is_704_where_xpu_like_only_queries(vendor, name, value):
    drv = driver(vendor, devices=2)
    a, b = drv.create_context(0), drv.create_context(1)
    drv.enable_peer_access(a, b)
    with pytest.raises(FornaxError) as exc:
        drv.enable_peer_access(a, b)
    assert_code(exc.value, vendor, name, value)
    ze = driver("xpu-like", devices=2)
    za, zb = ze.create_context(0), ze.create_context(1)
    assert ze.can_access_peer(0, 1)
    with pytest.raises(FornaxError) as exc:
        ze.enable_peer_access(za, zb)
    assert_code(exc.value, "xpu-like", "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE", 0x78000003)


@pytest.mark.parametrize("vendor, name, value, device_lost", [
    ("cuda-like", "CUDA_ERROR_LAUNCH_TIMEOUT", 702, False),
    ("rocm-like", "hipErrorLaunchTimeOut", 702, False),
    ("xpu-like", "ZE_RESULT_ERROR_DEVICE_LOST", 0x70000001, True),
])
def test_a_hang_poisons_the_context_or_loses_the_device(vendor, name, value, device_lost):
    drv = driver(vendor)
    ctx = drv.create_context(0)
    module = drv.load_module(ctx, image(vendor, drv, [program()]))
    drv.devices[0].inject(FaultPlan((FaultSpec("hang", at=1),)))
    src, dst = drv.allocate(ctx, 4 * N), drv.allocate(ctx, 4 * N)
    q = drv.create_queue(ctx)
    q.launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst})
    with pytest.raises(FornaxError) as exc:
        q.synchronize()
    assert_code(exc.value, vendor, name, value)
    with pytest.raises(FornaxError) as exc:
        drv.allocate(ctx, 64)                         # sticky in the context either way
    assert_code(exc.value, vendor, name, value)
    if device_lost:                                   # the whole device, until reset
        with pytest.raises(FornaxError) as exc:
            drv.create_context(0)
        assert_code(exc.value, vendor, name, value)
        drv.reset(0)
    fresh = drv.create_context(0)
    drv.allocate(fresh, 64)


@pytest.mark.parametrize("vendor", FAMILIES)
def test_a_launch_checked_before_is_checked_again_where_it_can_differ(vendor):
    """A queue remembers launches it validated (same loaded kernel, grid and argument names);
    a grid outside the device, missing arguments, an unloaded module and a destroyed
    context are still refused with the family's code after a launch that passed."""
    drv = driver(vendor)
    ctx = drv.create_context(0)
    module = drv.load_module(ctx, image(vendor, drv, [program()]))
    src, dst = drv.allocate(ctx, 4 * N, "device"), drv.allocate(ctx, 4 * N, "device")
    q = drv.create_queue(ctx)
    q.copy_h2d(src, SRC)
    for _ in range(3):
        q.launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst})
    q.synchronize()
    out = np.empty(N, np.float32)
    q.copy_d2h(out, dst)
    q.synchronize()
    np.testing.assert_array_equal(out, SRC * 3)
    assert drv.counts["launches"] == 3
    spec = drv.devices[0].spec
    with pytest.raises(FornaxError, match="outside the device limits"):
        q.launch(module, "scale3", (spec.max_grid[0] + 1, 1, 1), {"src": src, "dst": dst})
    with pytest.raises(FornaxError, match="missing argument"):
        q.launch(module, "scale3", (1, 1, 1), {"src": src})
    drv.unload_module(module)
    with pytest.raises(FornaxError, match="not loaded"):
        q.launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst})
    assert drv.counts["launches"] == 3
