"""Conformance per portability path: a compiler that reaches a foreign driver by cross-compiling
or through a translator passes that driver's suite (hand-written kernels packed and carried
across, loaded, launched and checked) and the compiler suite (every op compiled, carried
across, run on the foreign driver and compared with the float64 reference); a library that
forwards to the driver family's library passes the library suite under its own family's name."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from fornax.contracts.suites import run_suite
from fornax.layers.marshal import MarshallingLibrary, marshal_paths
from fornax.stack import BUILTIN_FAMILIES, compose, get_vendor, make_config

PAIRS = list(itertools.permutations(BUILTIN_FAMILIES, 2))


@pytest.mark.parametrize("compiler, driver", PAIRS)
def test_a_cross_family_compiler_passes_the_driver_and_compiler_suites(compiler, driver):
    stack = compose(make_config(driver, seams={"compiler": compiler}, spec="tiny"))
    crossing = next(c for c in stack.negotiation["crossings"] if c["boundary"] == "compiler/driver")
    subject = dataclasses.replace(get_vendor(driver), compiler=lambda: stack.compiler)
    for suite in ("driver", "compiler"):
        results = run_suite(suite, subject)
        assert results and all(r.passed for r in results), (crossing["name"], [r.line() for r in results
                                                                              if not r.passed])


@pytest.mark.parametrize("library, driver", PAIRS)
def test_a_marshalling_library_passes_the_library_suite(library, driver):
    front, back = get_vendor(library), get_vendor(driver)
    path = next(m for m in marshal_paths(front.facts, front.name) if m.backend == driver)

    def make(runtime):
        return MarshallingLibrary(path, front.facts["library"]["name"], back.library(runtime))
    # the driver family's seams under the library family's name: the report names the API the
    # user composed (hipBLAS-like over cuBLAS-like reports rocm-like)
    subject = dataclasses.replace(back, name=library, library=make)
    results = run_suite("library", subject)
    assert results and all(r.passed for r in results), (path.name, [r.line() for r in results if not r.passed])
