"""The fault matrix: every injected fault kind through every vendor family's driver.

The expected codes are the families' public facts, written out by hand from
``/work/shared/VENDORS.md`` and the real headers (``cuda.h`` CUresult,
``hip_runtime_api.h`` hipError_t, ``ze_api.h`` ze_result_t), so a wrong
``vendor.toml`` table fails here.  Each case checks the code, the state the
context or device is left in (sticky context vs lost device, and that a second
call fails the same way), and recovery by reset.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from helpers import FAMILIES, scale_program
from fornax.cli.main import main
from fornax.layers.compiler import Target
from fornax.layers.errors import (
    DeviceHangError,
    DeviceLostError,
    FornaxError,
    MemoryFaultError,
    UnknownError,
)
from fornax.sim import isa
from fornax.sim.device import Device
from fornax.sim.faults import FaultPlan, FaultSpec
from fornax.sim.spec import load_spec
from fornax.sim.topology import Topology
from fornax.stack import get_vendor

VENDORS = FAMILIES
API = {"cuda-like": "CUresult", "rocm-like": "hipError_t", "xpu-like": "ze_result_t"}
ZE_DEVICE_LOST = ("ZE_RESULT_ERROR_DEVICE_LOST", 0x70000001, DeviceLostError)

# (vendor, kind) -> (code name, value, fornax class, state): "context" = sticky for the
# context until destroyed, "device" = the whole device is unusable until reset
MATRIX = {
    ("cuda-like", "ecc_uncorrectable"): ("CUDA_ERROR_ECC_UNCORRECTABLE", 214, MemoryFaultError, "context"),
    ("cuda-like", "page_fault"): ("CUDA_ERROR_ILLEGAL_ADDRESS", 700, MemoryFaultError, "context"),
    ("cuda-like", "hang"): ("CUDA_ERROR_LAUNCH_TIMEOUT", 702, DeviceHangError, "context"),
    ("cuda-like", "link_failure"): ("CUDA_ERROR_NVLINK_UNCORRECTABLE", 220, UnknownError, "context"),
    ("cuda-like", "device_lost"): ("CUDA_ERROR_UNKNOWN", 999, UnknownError, "device"),
    ("rocm-like", "ecc_uncorrectable"): ("hipErrorECCNotCorrectable", 214, MemoryFaultError, "context"),
    ("rocm-like", "page_fault"): ("hipErrorIllegalAddress", 700, MemoryFaultError, "context"),
    ("rocm-like", "hang"): ("hipErrorLaunchTimeOut", 702, DeviceHangError, "context"),
    ("rocm-like", "link_failure"): ("hipErrorUnknown", 999, UnknownError, "context"),
    ("rocm-like", "device_lost"): ("hipErrorUnknown", 999, UnknownError, "device"),
    ("xpu-like", "ecc_uncorrectable"): (*ZE_DEVICE_LOST, "device"),
    ("xpu-like", "page_fault"): (*ZE_DEVICE_LOST, "context"),
    ("xpu-like", "hang"): (*ZE_DEVICE_LOST, "device"),
    ("xpu-like", "link_failure"): (*ZE_DEVICE_LOST, "device"),
    ("xpu-like", "device_lost"): (*ZE_DEVICE_LOST, "device"),
}
FAILING = ("ecc_uncorrectable", "page_fault", "hang", "link_failure", "device_lost")
INVALID_CONTEXT = {
    "cuda-like": ("CUDA_ERROR_INVALID_CONTEXT", 201),
    "rocm-like": ("hipErrorInvalidContext", 201),
    "xpu-like": ("ZE_RESULT_ERROR_INVALID_NULL_HANDLE", 0x78000005),
}
ILLEGAL_ADDRESS = {
    "cuda-like": ("CUDA_ERROR_ILLEGAL_ADDRESS", 700),
    "rocm-like": ("hipErrorIllegalAddress", 700),
    "xpu-like": ("ZE_RESULT_ERROR_DEVICE_LOST", 0x70000001),
}
RESET_CALL = {"cuda-like": "cuDevicePrimaryCtxReset", "rocm-like": "hipDeviceReset",
              "xpu-like": "zesDeviceReset"}


def assert_code(err: FornaxError, vendor: str, name: str, value: int) -> None:
    assert err.code is not None, f"{err!r} carries no vendor code"
    assert (err.code.api, err.code.name, err.code.value) == (API[vendor], name, value), str(err)
    assert name in str(err)


def triple() -> isa.Program:
    return scale_program()


def make(vendor: str, devices: int = 1):
    spec = load_spec("tiny")
    devs = [Device(spec, i) for i in range(devices)]
    if devices > 1:
        Topology.build(spec, devices).connect(devs)
    return get_vendor(vendor).driver(devs), devs


def image(vendor: str, drv):
    comp = get_vendor(vendor).compiler()
    props = drv.properties(0)
    fmt = next(f for f in comp.output_formats() if f in drv.loadable_formats(0))
    return comp.emit([triple()], Target(props.target, fmt, props.compute_units))


X = np.arange(64, dtype=np.float32) - 20


def expected() -> np.ndarray:
    return (X.astype(np.float64) * 3).astype(np.float32)


class Session:
    """One context with the triple kernel loaded and two buffers."""

    def __init__(self, vendor: str, drv, index: int = 0):
        self.drv = drv
        self.ctx = drv.create_context(index)
        self.module = drv.load_module(self.ctx, image(vendor, drv))
        self.q = drv.create_queue(self.ctx)
        self.a = drv.allocate(self.ctx, 4096)
        self.b = drv.allocate(self.ctx, 4096)

    def run(self, src: int | None = None) -> np.ndarray:
        """Upload X, triple it on the device, download and synchronise."""
        self.q.copy_h2d(self.a, X)
        self.q.launch(self.module, "triple", (1, 1, 1),
                      {"src": self.a if src is None else src, "dst": self.b})
        out = np.zeros(64, np.float32)
        self.q.copy_d2h(out, self.b)
        self.q.synchronize()
        return out


def spec_for(kind: str) -> FaultSpec:
    # link failures hit the copy engine (the upload, copy #1); the rest the kernel
    if kind == "page_fault":
        return FaultSpec(kind, at=1, address=0x1000)
    return FaultSpec(kind, at=1)


# -- the matrix -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", FAILING)
@pytest.mark.parametrize("vendor", VENDORS)
def test_fault_matrix(vendor, kind):
    name, value, cls, state = MATRIX[(vendor, kind)]
    drv, (dev,) = make(vendor)
    s = Session(vendor, drv)
    dev.inject(FaultPlan((spec_for(kind),)))
    with pytest.raises(cls) as exc:
        s.run()
    assert_code(exc.value, vendor, name, value)
    if kind == "page_fault":
        assert exc.value.address == 0x1000
    if kind == "hang":   # the watchdog took its two seconds of simulated time
        assert dev.timeline.busy_time == pytest.approx(2.0, rel=1e-3)
        assert dev.timeline.busy_time >= 2.0

    # a second call fails the same way
    for call in (s.q.synchronize, lambda: drv.synchronize(s.ctx), lambda: drv.allocate(s.ctx, 256),
                 lambda: s.q.copy_h2d(s.a, X)):
        with pytest.raises(FornaxError) as again:
            call()
        assert_code(again.value, vendor, name, value)

    if state == "context":
        # sticky for this context only: a new context on the device works without a reset
        other = Session(vendor, drv)
        np.testing.assert_array_equal(other.run(), expected())
    else:
        # the device is lost: even a new context fails, naming the reset call
        with pytest.raises(FornaxError) as lost:
            drv.create_context(0)
        assert_code(lost.value, vendor, name, value)
        assert RESET_CALL[vendor] in lost.value.hint
        assert drv.report()["devices_lost"] == [0]

    # recovery by reset
    dev.inject(None)
    drv.reset(0)
    assert drv.report()["devices_lost"] == [] and drv.report()["resets"] == 1
    with pytest.raises(FornaxError) as gone:     # every old context was destroyed
        drv.allocate(s.ctx, 256)
    assert_code(gone.value, vendor, *INVALID_CONTEXT[vendor])
    fresh = Session(vendor, drv)
    np.testing.assert_array_equal(fresh.run(), expected())
    # no stale mappings: the old buffer's address faults in the new context
    with pytest.raises(FornaxError) as stale:
        fresh.run(src=s.a)
    assert_code(stale.value, vendor, *ILLEGAL_ADDRESS[vendor])
    assert stale.value.address is not None


@pytest.mark.parametrize("vendor", VENDORS)
def test_correctable_ecc_is_counted_and_needs_no_reset(vendor):
    drv, (dev,) = make(vendor)
    s = Session(vendor, drv)
    dev.inject(FaultPlan((FaultSpec("ecc_correctable", at=1), FaultSpec("ecc_correctable", at=2),
                          FaultSpec("ecc_correctable", at=1, op="copy"))))
    np.testing.assert_array_equal(s.run(), expected())
    np.testing.assert_array_equal(s.run(), expected())       # same context, no reset
    assert drv.report()["ecc_corrected"] == 3
    assert dev.stats()["ecc_corrected"] == 3
    assert drv.report()["resets"] == 0 and drv.report()["devices_lost"] == []


@pytest.mark.parametrize("vendor", VENDORS)
def test_link_failure_on_a_peer_copy(vendor):
    name, value, cls, state = MATRIX[(vendor, "link_failure")]
    drv, devs = make(vendor, devices=2)
    s0, s1 = Session(vendor, drv, 0), Session(vendor, drv, 1)
    s0.q.copy_h2d(s0.a, X)
    s0.q.synchronize()
    devs[0].inject(FaultPlan((FaultSpec("link_failure", at=1, op="peer"),)))
    s0.q.copy_peer(s1.ctx, s1.b, s0.a, X.nbytes)
    with pytest.raises(cls) as exc:
        s0.q.synchronize()
    assert_code(exc.value, vendor, name, value)
    out = np.zeros(64, np.float32)                 # nothing reached the other device
    s1.q.copy_d2h(out, s1.b)
    s1.q.synchronize()
    np.testing.assert_array_equal(out, np.zeros(64, np.float32))
    # the fault belongs to device 0: device 1 keeps working, device 0 recovers by reset
    np.testing.assert_array_equal(s1.run(), expected())
    drv.reset(0)
    np.testing.assert_array_equal(Session(vendor, drv, 0).run(), expected())


@pytest.mark.parametrize("vendor", VENDORS)
def test_same_plan_same_failure_every_run(vendor):
    def attempt(seed: int):
        drv, (dev,) = make(vendor)
        s = Session(vendor, drv)
        dev.inject(FaultPlan((FaultSpec("ecc_uncorrectable", probability=0.3),), seed=seed))
        for i in range(40):
            try:
                s.run()
            except FornaxError as exc:
                return i, exc.code.name
        return None

    assert attempt(3) == attempt(3) is not None
    firsts = {attempt(seed)[0] for seed in range(6)}
    assert len(firsts) > 1


# -- the report ---------------------------------------------------------------------------------
@pytest.mark.parametrize("vendor, kind, code", [
    ("cuda-like", "hang", "CUDA_ERROR_LAUNCH_TIMEOUT (702)"),
    ("rocm-like", "ecc_uncorrectable", "hipErrorECCNotCorrectable (214)"),
    ("xpu-like", "device_lost", "ZE_RESULT_ERROR_DEVICE_LOST (0x70000001)"),
    ("cuda-like", "link_failure@2", "CUDA_ERROR_NVLINK_UNCORRECTABLE (220)"),
])
def test_compose_with_a_fault_exits_1_with_one_line_naming_the_code(vendor, kind, code):
    result = CliRunner().invoke(main, ["compose", "--vendor", vendor, "--spec", "tiny",
                                       "--inject", kind])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fornax: error:"), result.stderr
    assert code in lines[0]
    assert "Traceback" not in result.output


def test_compose_with_a_correctable_fault_succeeds_and_reports_it():
    result = CliRunner().invoke(main, ["compose", "--vendor", "rocm-like", "--spec", "tiny",
                                       "--inject", "ecc_correctable@2", "--json"])
    assert result.exit_code == 0, result.output
    rep = json.loads(result.stdout)
    assert rep["seams"]["driver"]["ecc_corrected"] == 1
    assert all(n["ok"] for n in rep["numerics"])


def test_compose_with_a_malformed_fault_is_a_usage_error():
    result = CliRunner().invoke(main, ["compose", "--vendor", "cuda-like", "--inject", "hang@zero"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--inject" in lines[0] and "KIND@N" in lines[0]
