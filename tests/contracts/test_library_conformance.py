"""The library conformance suite: the families pass, null and deliberately broken libraries fail."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.contracts import library as library_suite
from fornax.contracts.base import run_clause
from fornax.contracts.suites import SUITES, run_suite
from fornax.layers.graph import DType
from fornax.layers.vendor import Vendor
from fornax.stack import get_vendor
from fornax.vendors.cuda_like import VENDOR as CUDA
from fornax.vendors.cuda_like.library import CudaLikeLibrary
from fornax.vendors.rocm_like import VENDOR as ROCM
from helpers import FAMILIES

CLAUSES = SUITES["library"]


def _clause(cid: str):
    return next(c for c in CLAUSES if c.id == cid)


@pytest.mark.parametrize("vendor", FAMILIES)
@pytest.mark.parametrize("c", CLAUSES, ids=[c.id for c in CLAUSES])
def test_builtin_families_pass_every_clause(vendor, c):
    result = run_clause(c, get_vendor(vendor))
    assert result.passed, result.line()


def test_null_fails_every_clause_naming_the_hook():
    results = run_suite("library", get_vendor("null"))
    # a clause about routines the Library protocol does not name yet has nothing to check
    applies = [r for r in results
               if not (r.clause.id == "L09" and not library_suite.protocol_requires("softmax_fwd"))]
    assert len(results) == len(CLAUSES) and not any(r.passed for r in applies)
    results = applies
    assert all("not implemented: " in r.line() for r in results)
    assert any("not implemented: library." in r.line() for r in results)


def _broken(name: str, base=CudaLikeLibrary, vendor: Vendor = CUDA, **attrs) -> Vendor:
    lib = type(f"Broken{name}", (base,), attrs)
    return Vendor(f"broken-{name}", "a deliberately wrong library", vendor.facts, vendor.driver,
                  vendor.runtime, lib, vendor.compiler, vendor.framework)


def _scale_result(factor: float, dtypes: tuple[str, ...]):
    """A gemm that multiplies C by ``factor`` afterwards for the given dtypes (a wrong kernel)."""
    def gemm(self, a, b, c, params, stream=None):
        rec = CudaLikeLibrary.gemm(self, a, b, c, params, stream)
        if params["dtype"] in dtypes:
            dt = DType.of(params["dtype"]).numpy
            shape = (params.get("batch", 1), params["m"], params["n"])
            out = np.empty(shape, dt)
            self.runtime.memcpy_d2h(out, c)
            self.runtime.memcpy_h2d(c, (out.astype(np.float64) * factor).astype(dt))
        return rec
    return gemm


def test_a_slightly_wrong_float32_gemm_fails_l02_only_there():
    vendor = _broken("scale", gemm=_scale_result(1.0 + 1e-4, ("float32",)))
    result = run_clause(_clause("L02"), vendor)
    assert not result.passed and "float32 gemm" in result.detail and "outside tolerance" in result.detail
    assert run_clause(_clause("L03"), vendor).passed          # float16 is untouched


def _low_precision_accumulation(self, a, b, c, params, stream=None):
    """Accumulates the products in the operand dtype (float16), as a sloppy kernel would."""
    rec = CudaLikeLibrary.gemm(self, a, b, c, params, stream)
    if params["dtype"] == "float16":
        m, n, k, batch = params["m"], params["n"], params["k"], params.get("batch", 1)
        nb = batch if params.get("b_batched") else 1
        A = np.empty((batch, m, k), np.float16)
        B = np.empty((nb, k, n), np.float16)
        self.runtime.memcpy_d2h(A, a)
        self.runtime.memcpy_d2h(B, b)
        acc = np.zeros((batch, m, n), np.float16)
        for i in range(k):
            acc = (acc + A[:, :, i:i + 1] * B[:, i:i + 1, :]).astype(np.float16)
        self.runtime.memcpy_h2d(c, acc)
    return rec


def test_float16_accumulation_fails_l03():
    result = run_clause(_clause("L03"), _broken("acc16", gemm=_low_precision_accumulation))
    assert not result.passed and "float16 gemm" in result.detail and "k=384" in result.detail


def test_a_gemm_that_ignores_batched_b_fails_l02():
    def gemm(self, a, b, c, params, stream=None):
        return CudaLikeLibrary.gemm(self, a, b, c, {**params, "b_batched": False}, stream)
    result = run_clause(_clause("L02"), _broken("bb", gemm=gemm))
    assert not result.passed and "b_batched=True" in result.detail


def test_a_library_that_crashes_on_a_bad_dtype_fails_l06():
    def gemm(self, a, b, c, params, stream=None):
        if params["dtype"] not in self.dtypes:
            raise KeyError(params["dtype"])
        return CudaLikeLibrary.gemm(self, a, b, c, params, stream)
    result = run_clause(_clause("L06"), _broken("crash", gemm=gemm))
    assert not result.passed and "crashed with KeyError" in result.detail


def test_a_call_without_a_reason_fails_l05():
    def gemm(self, a, b, c, params, stream=None):
        rec = CudaLikeLibrary.gemm(self, a, b, c, params, stream)
        rec.reason = ""
        return rec
    result = run_clause(_clause("L05"), _broken("why", gemm=gemm))
    assert not result.passed and "'reason'" in result.detail


def test_a_report_that_forgets_calls_fails_l08():
    def report(self):
        rep = CudaLikeLibrary.report(self)
        return {**rep, "calls": 1, "algorithms_chosen": rep["algorithms_chosen"][:1]}
    result = run_clause(_clause("L08"), _broken("forget", report=report))
    assert not result.passed and "after 3 calls" in result.detail


def test_a_library_that_runs_on_any_arch_by_mistake_fails_l07():
    """A rocm-like library that claims its gfx942 code object for any device: the chip outside its
    list (gfx1031 in the family's table) must fail with 'no kernel image', and does not."""
    def _image_for(self, target, loadable):
        return self.shipped[-1]
    from fornax.vendors.rocm_like.library import RocmLikeLibrary
    vendor = _broken("anyarch", base=RocmLikeLibrary, vendor=ROCM, _image_for=_image_for)
    result = run_clause(_clause("L07"), vendor)
    assert not result.passed and "gfx" in result.detail


def test_l07_needs_a_chip_outside_the_list():
    """With the out-of-list chip removed from the arch table, nothing shows the failure."""
    arch = {k: v for k, v in ROCM.facts["driver"]["arch"].items() if v in ("gfx90a", "gfx942")}
    facts = {**ROCM.facts, "driver": {**ROCM.facts["driver"], "arch": arch}}
    vendor = Vendor("rocm-all-exact", "", facts, ROCM.driver, ROCM.runtime, ROCM.library, ROCM.compiler,
                    ROCM.framework)
    result = run_clause(_clause("L07"), vendor)
    assert not result.passed and "list a chip the library was not built for" in result.detail


def test_a_missing_protocol_routine_is_named():
    class NoGemm(CudaLikeLibrary):
        gemm = None
    vendor = _broken("nogemm", base=NoGemm)
    result = run_clause(_clause("L02"), vendor)
    assert not result.passed and "not implemented: library.gemm" in result.detail


def test_tolerances_are_documented_per_dtype():
    for dtype in ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"):
        assert dtype in library_suite.RTOL and f"| {dtype} |" in library_suite.__doc__


def test_cli_conform_library_exit_codes():
    runner = CliRunner()
    for vendor in FAMILIES:
        ok = runner.invoke(main, ["conform", "library", "--vendor", vendor])
        lines = ok.stdout.strip().splitlines()
        assert ok.exit_code == 0, ok.stdout
        assert len(lines) == len(CLAUSES) + 1 and all(x.startswith("PASS library L") for x in lines[:-1])
        assert lines[-1] == f"library conformance of {vendor}: {len(CLAUSES)} of {len(CLAUSES)} clauses pass"
    bad = runner.invoke(main, ["conform", "library", "--vendor", "null"])
    assert bad.exit_code == 1
    fails = [x for x in bad.stdout.splitlines() if x.startswith("FAIL library")]
    assert len(fails) >= len(CLAUSES) - 1 and all("not implemented: " in x for x in fails)
    impl = runner.invoke(main, ["conform", "library", "--impl", "fornax.vendors.rocm_like:VENDOR", "--json"])
    assert impl.exit_code == 0 and '"failed": 0' in impl.stdout


def _with_dnn(base):
    from fornax.layers.dnn import DnnRoutines
    return (base,) if issubclass(base, DnnRoutines) else (DnnRoutines, base)


def test_row_routines_are_checked_and_a_wrong_softmax_backward_fails_l09():
    good = type("WithDnn", _with_dnn(CudaLikeLibrary), {})
    assert run_clause(_clause("L09"), _broken("dnn", base=good)).passed

    def softmax_bwd(self, y, dy, dx, params, stream=None):   # forgets the -sum(dy * y) term
        from fornax.layers.dnn import DnnRoutines
        rows, cols, dt = params["rows"], params["cols"], DType.of(params["dtype"]).numpy
        Y, DY = np.empty((rows, cols), dt), np.empty((rows, cols), dt)
        self.runtime.memcpy_d2h(Y, y)
        self.runtime.memcpy_d2h(DY, dy)
        DnnRoutines.softmax_bwd(self, y, dy, dx, params, stream)
        self.runtime.memcpy_h2d(dx, (Y.astype(np.float64) * DY).astype(dt))
    bad = type("BadSoftmax", (good,), {"softmax_bwd": softmax_bwd})
    result = run_clause(_clause("L09"), _broken("softmax", base=bad))
    assert not result.passed and "softmax_bwd" in result.detail


# -- the clauses on the routines beside GEMM (L10-L14) ------------------------------------------
def test_new_clauses_fail_for_null_naming_the_routine():
    # the null library on a working runtime (the null runtime would stop every clause first)
    null = get_vendor("null")
    vendor = Vendor("null-library", "the null library on cuda-like", CUDA.facts, CUDA.driver,
                    CUDA.runtime, null.library, CUDA.compiler, CUDA.framework)
    named = {"L11": "library.conv2d_fwd", "L12": "library.attention_fwd", "L13": "library.pool2d_fwd",
             "L14": "library.communicator"}
    for cid, hook in named.items():
        result = run_clause(_clause(cid), vendor)
        assert not result.passed and f"not implemented: {hook}" in result.detail, result.line()
    result = run_clause(_clause("L10"), vendor)
    assert not result.passed and "not implemented: " in result.detail


def test_a_gemm_that_ignores_deterministic_mode_fails_l10():
    def gemm(self, a, b, c, params, stream=None):
        return CudaLikeLibrary.gemm(self, a, b, c, {**params, "deterministic": False}, stream)
    result = run_clause(_clause("L10"), _broken("fast", gemm=gemm))
    assert not result.passed and "different bits" in result.detail and "k=512" in result.detail


def test_a_gemm_that_drops_beta_fails_l10():
    def gemm(self, a, b, c, params, stream=None):
        return CudaLikeLibrary.gemm(self, a, b, c, {**params, "beta": 0.0}, stream)
    result = run_clause(_clause("L10"), _broken("nobeta", gemm=gemm))
    assert not result.passed and "beta=-1.5" in result.detail and "outside tolerance" in result.detail


def test_a_family_without_fp8_must_refuse_it_in_l10():
    """xpu-like lists no fp8 and refuses it; a library that silently runs fp8 as float32 fails."""
    from fornax.vendors.xpu_like import VENDOR as XPU
    from fornax.vendors.xpu_like.library import XpuLikeLibrary
    assert "float8_e4m3fn" not in XPU.facts["library"]["gemm_dtypes"]

    def gemm(self, a, b, c, params, stream=None):
        if str(params["dtype"]).startswith("float8"):
            params = {**params, "dtype": "float32"}
        return XpuLikeLibrary.gemm(self, a, b, c, params, stream)
    result = run_clause(_clause("L10"), _broken("fp8", base=XpuLikeLibrary, vendor=XPU, gemm=gemm))
    assert not result.passed and "float8_e4m3fn" in result.detail and "no error was raised" in result.detail


def test_a_slightly_wrong_weight_gradient_fails_l11():
    def conv2d_bwd_weights(self, x, dy, dw, params, stream=None):
        rec = CudaLikeLibrary.conv2d_bwd_weights(self, x, dy, dw, params, stream)
        dt = DType.of(params["dtype"]).numpy
        shape = (params["k"], params["c"] // params.get("groups", 1), params["r"], params["s"])
        out = np.empty(shape, dt)
        self.runtime.memcpy_d2h(out, dw)
        self.runtime.memcpy_h2d(dw, (out.astype(np.float64) * (1 + 1e-4)).astype(dt))
        return rec
    result = run_clause(_clause("L11"), _broken("dw", conv2d_bwd_weights=conv2d_bwd_weights))
    assert not result.passed and "float32 conv2d_bwd_weights" in result.detail
    assert "outside tolerance" in result.detail


def test_an_attention_backward_without_the_causal_mask_fails_l12():
    def attention_bwd(self, q, k, v, o, do, lse, dq, dk, dv, params, stream=None):
        return CudaLikeLibrary.attention_bwd(self, q, k, v, o, do, lse, dq, dk, dv,
                                             {**params, "causal": False}, stream)
    result = run_clause(_clause("L12"), _broken("mask", attention_bwd=attention_bwd))
    assert not result.passed and "causal=True: dq" in result.detail


def test_average_pooling_that_excludes_padding_fails_l13():
    def pool2d_fwd(self, x, y, params, indices=None, stream=None):
        rec = CudaLikeLibrary.pool2d_fwd(self, x, y, params, indices, stream)
        if params["mode"] == "avg" and any(params["padding"]):   # divide by the real inputs only
            n, c, h, w = (params[key] for key in ("n", "c", "h", "w"))
            (r, s), (sh, sw), (ph, pw) = params["kernel"], params["stride"], params["padding"]
            ones = np.pad(np.ones((h, w)), ((ph, ph), (pw, pw)))
            P, Q = (h + 2 * ph - r) // sh + 1, (w + 2 * pw - s) // sw + 1
            cnt = np.array([[ones[i * sh:i * sh + r, j * sw:j * sw + s].sum() for j in range(Q)]
                            for i in range(P)])
            dt = DType.of(params["dtype"]).numpy
            out = np.empty((n, c, P, Q), dt)
            self.runtime.memcpy_d2h(out, y)
            self.runtime.memcpy_h2d(y, (out.astype(np.float64) * (r * s) / cnt).astype(dt))
        return rec
    result = run_clause(_clause("L13"), _broken("avgpad", pool2d_fwd=pool2d_fwd))
    assert not result.passed and "avg pool2d" in result.detail and ": y" in result.detail


def test_an_all_reduce_that_skips_one_ranks_contribution_fails_l14():
    from fornax.layers.collectives import Communicator

    class SkipLast(Communicator):
        def _run(self, calls):
            c0, last = calls[0], calls[-1]
            if c0.op == "all_reduce":
                zero = self.malloc(last.rank, max(4, c0.count * c0.dtype.itemsize))
                self.upload(last.rank, zero, np.zeros(c0.count, c0.dtype.numpy))
                last.send = zero
            return super()._run(calls)

    def communicator(self, devices=None, timeout_s=None):
        return SkipLast(self, devices, timeout_s)
    result = run_clause(_clause("L14"), _broken("skip", communicator=communicator))
    assert not result.passed and "all_reduce sum over 2 ranks" in result.detail


def test_a_watchdog_error_without_a_code_fails_l14():
    from fornax.layers.collectives import Communicator
    from fornax.layers.errors import FornaxError

    class Uncoded(Communicator):
        def _watchdog(self, ranks):
            try:
                super()._watchdog(ranks)
            except FornaxError as exc:
                raise FornaxError(exc.message, seam="library") from None

    def communicator(self, devices=None, timeout_s=None):
        return Uncoded(self, devices, timeout_s)
    result = run_clause(_clause("L14"), _broken("uncoded", communicator=communicator))
    assert not result.passed and "no vendor code" in result.detail


def test_subject_connects_its_devices_once():
    from fornax.contracts.base import Subject
    s = Subject(CUDA)
    topo = s.connect()
    assert topo is s.connect() and topo.devices == len(s.devices) == 2
    assert all(d.topology is topo for d in s.devices)
