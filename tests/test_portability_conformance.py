"""Conformance per portability path: a compiler that reaches a foreign driver by cross-compiling
or through a translator passes that driver's suite (hand-written kernels packed and carried
across, loaded, launched and checked) and the compiler suite (every op compiled, carried
across, run on the foreign driver and compared with the float64 reference); a library that
forwards to the driver family's library passes the library suite under its own family's name."""

from __future__ import annotations

import itertools
import json

import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.contracts.paths import path_subject
from fornax.contracts.suites import run_suite
from fornax.layers.marshal import marshal_paths
from fornax.stack import BUILTIN_FAMILIES, compose, get_vendor, make_config

PAIRS = list(itertools.permutations(BUILTIN_FAMILIES, 2))


def _compiler_paths() -> list[tuple[str, str, str]]:
    """(compiler, driver, path) for every path declared between two families, the default
    and each alternative ``--path`` can pick."""
    out = []
    for compiler, driver in PAIRS:
        stack = compose(make_config(driver, seams={"compiler": compiler}, spec="tiny"))
        c = next(c for c in stack.negotiation["crossings"] if c["boundary"] == "compiler/driver")
        out += [(compiler, driver, name) for name in (c["name"], *c["alternatives"])]
    return out


@pytest.mark.parametrize("compiler, driver, path", _compiler_paths())
def test_a_cross_family_compiler_passes_the_driver_and_compiler_suites(compiler, driver, path):
    subject, crossing = path_subject("compiler", compiler, driver, path)
    assert crossing["name"] == path
    for suite in ("driver", "compiler"):
        results = run_suite(suite, subject)
        assert results and all(r.passed for r in results), (path, [r.line() for r in results if not r.passed])


@pytest.mark.parametrize("library, driver, name", [
    (lib, drv, m.name) for lib, drv in PAIRS
    for m in marshal_paths(get_vendor(lib).facts, lib) if m.backend == drv])
def test_a_marshalling_library_passes_the_library_suite(library, driver, name):
    subject, crossing = path_subject("library", library, driver, name)
    assert crossing["name"] == name and crossing["mechanism"] == "marshal" and subject.name == library
    results = run_suite("library", subject)
    assert results and all(r.passed for r in results), (name, [r.line() for r in results if not r.passed])


def test_conform_over_a_foreign_driver_from_the_cli():
    res = CliRunner().invoke(main, ["conform", "compiler", "--vendor", "cuda-like", "--over", "rocm-like",
                                    "--path", "hipify-like", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["implementation"] == "cuda-like over rocm-like by port hipify-like"
    assert doc["failed"] == 0 and doc["passed"] == len(doc["clauses"]) > 0
    for args, msg in ((["driver", "--vendor", "xpu-like", "--over", "rocm-like"], "not driver"),
                      (["compiler", "--vendor", "cuda-like", "--path", "zluda-like"], "--path goes with --over"),
                      (["compiler", "--vendor", "cuda-like", "--over", "cuda-like"], "nothing crosses"),
                      (["compiler", "--vendor", "cuda-like", "--over", "rocm-like", "--path", "nope"],
                       "'nope' carries no crossing")):
        res = CliRunner().invoke(main, ["conform", *args])
        assert res.exit_code != 0 and msg in res.output and "Traceback" not in res.output, res.output
