"""The compiler conformance suite: the built-in families pass, null and broken compilers fail readably."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.contracts import compiler as suite
from fornax.contracts.base import ContractFailure, Subject, run_clause
from fornax.contracts.suites import SUITES, run_suite
from fornax.layers.graph import OPS, DType
from fornax.layers.vendor import Vendor
from fornax.stack import get_vendor
from fornax.vendors.cuda_like import VENDOR as CUDA
from fornax.vendors.cuda_like import CudaLikeCompiler
from helpers import FAMILIES

CLAUSES = SUITES["compiler"]


@pytest.mark.parametrize("vendor", FAMILIES)
@pytest.mark.parametrize("c", CLAUSES, ids=[c.id for c in CLAUSES])
def test_builtin_families_pass_every_clause(vendor, c):
    result = run_clause(c, get_vendor(vendor))
    assert result.passed, result.line()


def test_null_fails_every_clause_naming_the_compiler_hook():
    results = run_suite("compiler", get_vendor("null"))
    assert len(results) == len(CLAUSES) and not any(r.passed for r in results)
    assert all("not implemented: compiler." in r.line() for r in results)


def _variant(name: str, **attrs) -> Vendor:
    broken = type(f"Broken{name}", (CudaLikeCompiler,), attrs)
    return Vendor(f"broken-{name}", "a deliberately wrong compiler", CUDA.facts, CUDA.driver, CUDA.runtime,
                  CUDA.library, broken, CUDA.framework)


def _clause(cid: str):
    return next(c for c in CLAUSES if c.id == cid)


def test_a_compiler_that_miscompiles_an_op_fails_c01_naming_it():
    def compile(self, graph, target, *args, **kwargs):
        for n in graph.nodes:                  # computes sigmoid where the graph says tanh
            if n.op == "tanh":
                n.op = "sigmoid"
        return CudaLikeCompiler.compile(self, graph, target, *args, **kwargs)
    with pytest.raises(ContractFailure) as exc:       # C01's check, on a few ops to keep it quick
        suite.check_ops(Subject(_variant("tanh", compile=compile)), DType.FLOAT32, ops=["exp", "tanh"])
    assert "1 op case(s) failed" in str(exc.value) or "2 op case(s) failed" in str(exc.value)
    assert "tanh(" in str(exc.value) and "outside rtol 1e-05" in str(exc.value)
    assert "exp(" not in str(exc.value)


def test_a_nondeterministic_compiler_fails_c05():
    builds = iter(range(1000))

    def emit(self, programs, target):
        b = CudaLikeCompiler.emit(self, programs, target)
        return dataclasses.replace(b, data=b.data + f"\n// build {next(builds)}\n".encode())
    result = run_clause(_clause("C05"), _variant("nonce", emit=emit))
    assert not result.passed and "different bytes" in result.detail


def test_a_compiler_that_crashes_on_a_bad_graph_fails_c07():
    def compile(self, graph, target, *args, **kwargs):
        if not graph.outputs:
            raise IndexError("list index out of range")
        return CudaLikeCompiler.compile(self, graph, target, *args, **kwargs)
    result = run_clause(_clause("C07"), _variant("crash", compile=compile))
    assert not result.passed and "a graph without outputs: crashed with IndexError" in result.detail


def test_a_compiler_whose_binary_the_driver_cannot_load_fails_c06():
    def emit(self, programs, target):
        b = CudaLikeCompiler.emit(self, programs, target)
        return dataclasses.replace(b, format="elf-like")
    result = run_clause(_clause("C06"), _variant("format", emit=emit))
    assert not result.passed and "elf-like" in result.detail


def test_every_op_in_the_op_set_gets_a_float32_case():
    for op in OPS:
        graph, feeds = suite.build_case(op, DType.FLOAT32, np.random.default_rng(0))
        assert op in {n.op for n in graph.nodes}
        refs = graph.reference(feeds)
        assert all(np.all(np.isfinite(np.asarray(r, np.float64))) for r in refs), op


def test_inputs_are_distinct_and_exact_in_every_float_dtype():
    rng = np.random.default_rng(1)
    for dt in (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16):
        x = suite.values(rng, (7, 9), dt)
        wide = x.astype(np.float64)
        assert len(np.unique(wide)) == x.size and np.abs(wide).max() <= 2
        assert np.array_equal(wide.astype(np.float32).astype(dt.numpy).astype(np.float64), wide)
        assert suite.values(rng, (5, 5), dt, positive=True).astype(np.float64).min() > 0


def test_tolerances_per_dtype():
    ref = np.array([1.0, -2.0, 3.0])
    assert suite.compare(np.float32(ref * (1 + 5e-6)), ref, 1e-5) is None
    assert "outside rtol" in suite.compare(np.float32(ref * (1 + 1e-4)), ref, 1e-5)
    assert suite.compare(np.array([1, 2, 3], np.int32), np.array([1.0, 2.0, 3.0]), 0.0) is None
    assert "differ" in suite.compare(np.array([1, 2, 4], np.int32), np.array([1.0, 2.0, 3.0]), 0.0)
    assert suite.TOLERANCE[DType.FLOAT32] == 1e-5
    assert suite.TOLERANCE[DType.FLOAT16] > suite.TOLERANCE[DType.FLOAT32]
    assert suite.TOLERANCE[DType.BFLOAT16] > suite.TOLERANCE[DType.FLOAT16]


def test_cli_conform_compiler():
    r = CliRunner().invoke(main, ["conform", "compiler", "--vendor", "rocm-like", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["seam"] == "compiler" and out["failed"] == 0 and out["passed"] == len(CLAUSES)
    r = CliRunner().invoke(main, ["conform", "compiler", "--vendor", "null"])
    assert r.exit_code == 1 and "FAIL compiler C01" in r.output and "Traceback" not in r.output
