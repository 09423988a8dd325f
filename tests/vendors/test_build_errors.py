"""A kernel that does not build is a build error at module load, never a sticky launch failure.

Each family refuses a module holding an ill-typed kernel with its own load / build code
(written here by hand from the real headers: cuModuleLoadData's CUDA_ERROR_INVALID_PTX 218 for
PTX it JIT-compiles and CUDA_ERROR_INVALID_IMAGE 200 for machine code; hipModuleLoadData's
hipErrorInvalidImage 200; zeModuleCreate's ZE_RESULT_ERROR_MODULE_BUILD_FAILURE 0x70000004 for
IL and ZE_RESULT_ERROR_INVALID_NATIVE_BINARY 0x7800000f for a native binary), the message and
the build log name the kernel, the instruction and the tiles that do not fit, nothing launches,
and the context keeps running good kernels.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fornax.frameworks.torch as ft
from fornax.layers.compiler import Target
from fornax.layers.errors import FornaxError
from fornax.sim import isa
from fornax.sim.device import Device
from fornax.sim.spec import load_spec
from fornax.stack import get_vendor
from helpers import scale_program

API = {"cuda-like": "CUresult", "rocm-like": "hipError_t", "xpu-like": "ze_result_t"}
N = 64


def ill_typed(name: str = "bad_add") -> isa.Program:
    """Adds a [4] tile to an [8] tile: well formed, but no build can type it."""
    return isa.verify(isa.Program(name, (isa.Param("dst", "ptr", "int64"),), (
        isa.Arange("%i", 4), isa.Arange("%j", 8),
        isa.Binary("%s", "add", "%i", "%j"),
        isa.Store("dst", "%s", "%s"),
    ), {"group_size": 64}))


def launch_scale(drv, ctx, fmt: str) -> np.ndarray:
    """Load and run dst = 3 * src on ``ctx``; returns dst."""
    module = drv.load_module(ctx, image(drv, [scale_program("triple", 3.0, N)], fmt))
    src, dst = drv.allocate(ctx, N * 4, "managed"), drv.allocate(ctx, N * 4, "managed")
    drv.host_write(ctx, src, np.arange(N, dtype=np.float32).tobytes())
    q = drv.create_queue(ctx)
    q.launch(module, "triple", (1, 1, 1), {"src": src, "dst": dst})
    q.synchronize()
    return np.frombuffer(drv.host_read(ctx, dst, N * 4), np.float32)


def image(drv, programs, fmt: str):
    comp = get_vendor(drv.vendor).compiler()
    props = drv.properties(0)
    return comp.emit(programs, Target(props.target, fmt, props.compute_units))


@pytest.mark.parametrize("vendor, fmt, code, value", [
    ("cuda-like", "ptx-like", "CUDA_ERROR_INVALID_PTX", 218),
    ("cuda-like", "cubin-like", "CUDA_ERROR_INVALID_IMAGE", 200),
    ("rocm-like", "hsaco-like", "hipErrorInvalidImage", 200),
    ("xpu-like", "spirv-like", "ZE_RESULT_ERROR_MODULE_BUILD_FAILURE", 0x70000004),
    ("xpu-like", "zebin-like", "ZE_RESULT_ERROR_INVALID_NATIVE_BINARY", 0x7800000F),
])
def test_an_ill_typed_kernel_is_refused_at_load_and_the_context_keeps_working(vendor, fmt, code, value):
    drv = get_vendor(vendor).driver([Device(load_spec("tiny"), 0)])
    ctx = drv.create_context(0)
    want = np.arange(N, dtype=np.float32) * 3
    np.testing.assert_array_equal(launch_scale(drv, ctx, fmt), want)
    launched = drv.counts["launches"]
    with pytest.raises(FornaxError) as exc:
        drv.load_module(ctx, image(drv, [scale_program("fine", 2.0, N), ill_typed()], fmt))
    err = exc.value
    assert (err.code.api, err.code.name, err.code.value) == (API[vendor], code, value), str(err)
    what = ("kernel 'bad_add', instruction 2 (binary add): tile shapes of %i int64[4] and "
            "%j int64[8] do not broadcast")
    assert what in err.message
    assert what in err.build_log and "'fine'" not in err.build_log
    assert drv.build_log() == err.build_log          # cuLinkGetErrorLog / zeModuleBuildLogGetString
    assert drv.counts["launches"] == launched        # nothing reached the device
    assert ctx.sticky is None
    # the context is not poisoned: good kernels load and run, and the log is clear again
    np.testing.assert_array_equal(launch_scale(drv, ctx, fmt), want)
    assert drv.build_log() == ""
    drv.synchronize(ctx)


def test_a_lowered_op_whose_kernel_does_not_build_falls_back_to_the_cpu_with_the_reason(monkeypatch):
    """The compiler emitting an ill-typed kernel for one op: the module does not load, the op is
    reported as a compile error and runs on the host; later ops keep running on the device."""
    ft.use_stack("cuda-like")
    compiler = ft.current().framework.compiler
    real = compiler.emit

    def emit(programs, target):
        if any("hypot" in p.name for p in programs):
            programs = [*programs, ill_typed()]
        return real(programs, target)
    monkeypatch.setattr(compiler, "emit", emit)
    a, b = torch.randn(3, 7, 5), torch.randn(3, 7, 5)        # a shape no other test compiles
    got = torch.hypot(a.to("fornax"), b.to("fornax"))
    torch.testing.assert_close(got.cpu(), torch.hypot(a, b))
    fallbacks = repr(ft.report()["fallbacks"])
    assert "compile error" in fallbacks and "CUDA_ERROR_INVALID_PTX" in fallbacks
    assert "kernel 'bad_add', instruction 2 (binary add)" in fallbacks
    x = torch.arange(4.0, device="fornax")
    torch.testing.assert_close((x * 2 + 1).cpu(), torch.arange(4.0) * 2 + 1)
