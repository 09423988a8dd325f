"""The conformance suites: the built-in families pass, null and broken implementations fail readably."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.contracts.base import run_clause
from fornax.contracts.suites import SUITES, run_suite
from fornax.contracts import driver as driver_suite  # noqa: F401
from fornax.contracts import runtime as runtime_suite  # noqa: F401
from fornax.layers.errors import FornaxError
from fornax.layers.vendor import Vendor
from fornax.stack import get_vendor
from fornax.vendors.cuda_like import CudaLikeDriver, VENDOR as CUDA
from fornax.vendors.cuda_like.driver import Stream
from helpers import FAMILIES

CLAUSES = [(seam, c) for seam in ("driver", "runtime") for c in SUITES[seam]]


@pytest.mark.parametrize("vendor", FAMILIES)
@pytest.mark.parametrize("seam, c", CLAUSES, ids=[f"{s}-{c.id}" for s, c in CLAUSES])
def test_builtin_families_pass_every_clause(vendor, seam, c):
    result = run_clause(c, get_vendor(vendor))
    assert result.passed, result.line()


@pytest.mark.parametrize("seam", ["driver", "runtime"])
def test_null_fails_every_clause_naming_the_hook(seam):
    results = run_suite(seam, get_vendor("null"))
    assert results and not any(r.passed for r in results)
    # every failure names the hook it reached (a runtime clause may reach a driver hook first)
    assert all("not implemented: " in r.line() for r in results)
    assert any(f"not implemented: {seam}." in r.line() for r in results)


def _variant(name: str, **driver_attrs) -> Vendor:
    broken = type(f"Broken{name}", (CudaLikeDriver,), driver_attrs)
    return Vendor(f"broken-{name}", "a deliberately wrong driver", CUDA.facts, broken, CUDA.runtime,
                  CUDA.library, CUDA.compiler, CUDA.framework)


def _clause(seam: str, cid: str):
    return next(c for c in SUITES[seam] if c.id == cid)


def test_a_driver_that_ignores_double_free_fails_d05():
    def free(self, ctx, address):
        try:
            CudaLikeDriver.free(self, ctx, address)
        except FornaxError:
            pass
    result = run_clause(_clause("driver", "D05"), _variant("free", free=free))
    assert not result.passed and "double free: no error was raised" in result.detail


def test_a_driver_without_vendor_codes_fails_d02():
    def properties(self, index):
        if not 0 <= index < len(self.devices):
            raise FornaxError(f"bad device {index}")
        return CudaLikeDriver.properties(self, index)
    result = run_clause(_clause("driver", "D02"), _variant("codes", properties=properties))
    assert not result.passed and "without a vendor error code" in result.detail


def test_a_queue_that_ignores_waits_fails_d13():
    unordered = type("Unordered", (Stream,), {"wait": lambda self, marker: None})
    result = run_clause(_clause("driver", "D13"), _variant("order", queue_class=unordered))
    assert not result.passed and "did not see its result" in result.detail


def test_a_crashing_implementation_is_a_failed_clause_not_a_crash():
    def allocate(self, ctx, nbytes, kind="device"):
        raise ZeroDivisionError("oops")
    result = run_clause(_clause("driver", "D05"), _variant("crash", allocate=allocate))
    assert not result.passed and "crashed with ZeroDivisionError: oops" in result.detail


def test_cli_conform_passes_and_fails_with_one_line_per_clause():
    runner = CliRunner()
    ok = runner.invoke(main, ["conform", "driver", "--vendor", "rocm-like"])
    lines = ok.stdout.strip().splitlines()
    assert ok.exit_code == 0
    assert len(lines) == len(SUITES["driver"]) + 1 and all(x.startswith("PASS") for x in lines[:-1])
    bad = runner.invoke(main, ["conform", "runtime", "--vendor", "null"])
    assert bad.exit_code == 1
    fails = [x for x in bad.stdout.splitlines() if x.startswith("FAIL")]
    assert len(fails) == len(SUITES["runtime"]) and all("not implemented: " in x for x in fails)
    impl = runner.invoke(main, ["conform", "runtime", "--impl", "fornax.vendors.xpu_like:VENDOR"])
    assert impl.exit_code == 0


@pytest.mark.parametrize("args, needle", [
    (["conform", "linker", "--vendor", "cuda-like"], "no conformance suite for seam 'linker'"),
    (["conform", "driver"], "exactly one of --vendor"),
    (["conform", "driver", "--vendor", "cuda-like", "--impl", "x:y"], "exactly one of --vendor"),
    (["conform", "driver", "--impl", "no.such.module:VENDOR"], "cannot load implementation"),
    (["conform", "driver", "--impl", "fornax.stack:compose"], "cannot load implementation"),
    (["conform", "driver", "--impl", "nocolon"], "package.module:attribute"),
])
def test_cli_conform_bad_input(args, needle):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and needle in r.stderr and r.stderr.count("\n") == 1


def test_pytest_plugin_runs_the_suites_on_an_implementation():
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "fornax.contracts", "-p", "no:cacheprovider",
           "--fornax-seam", "runtime"]
    good = subprocess.run(cmd + ["--fornax-impl", "fornax.vendors.cuda_like:VENDOR"],
                          capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stdout[-2000:]
    assert f"{len(SUITES['runtime'])} passed" in good.stdout
    bad = subprocess.run(cmd + ["--fornax-impl", "null"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1
    assert f"{len(SUITES['runtime'])} failed" in bad.stdout
