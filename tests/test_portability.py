"""Any stack combination runs: every one of the 3^5 seam combinations composes, each boundary
between two families is carried by a named path (the compiler's cross-target output, a
translator at module load, a marshalling library, a runtime or framework layer, or fornax's
labelled generic adapter), workloads give correct numerics through every compiler / library /
driver pairing, and ``--no-translate`` refuses exactly the stacks whose compiler or library
comes from another family than the driver."""

from __future__ import annotations

import itertools
import json

import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.layers.errors import FormatMismatchError
from fornax.layers.vendor import SEAMS
from fornax.report import build
from fornax.scenarios.workloads import get_workload, numerics
from fornax.schemas import validate
from fornax.stack import BUILTIN_FAMILIES, compose, make_config

COMBOS = [dict(zip(SEAMS, c)) for c in itertools.product(BUILTIN_FAMILIES, repeat=len(SEAMS))]

#: (upper family, driver family) -> the real path, written from what the real stacks do
#: (HIP on NVIDIA, SYCL's CUDA and HIP backends, chipStar, ZLUDA), not read from the facts
COMPILER_PATHS = {
    ("rocm-like", "cuda-like"): ("cross-compile", "HIP on NVIDIA"),
    ("rocm-like", "xpu-like"): ("cross-compile", "chipStar"),
    ("xpu-like", "cuda-like"): ("cross-compile", "SYCL (DPC++) CUDA backend"),
    ("xpu-like", "rocm-like"): ("cross-compile", "SYCL (DPC++) HIP backend"),
    ("cuda-like", "rocm-like"): ("translate", "ZLUDA"),
    ("cuda-like", "xpu-like"): ("translate", "ZLUDA on Intel"),
}
LIBRARY_PATHS = {
    ("rocm-like", "cuda-like"): "hipBLAS on NVIDIA",
    ("rocm-like", "xpu-like"): "chipStar",
    ("xpu-like", "cuda-like"): "oneMath",
    ("xpu-like", "rocm-like"): "oneMath",
    ("cuda-like", "rocm-like"): "ZLUDA",
    ("cuda-like", "xpu-like"): "chipStar",
}


def test_all_combinations_compose_and_name_every_crossing():
    mechanisms = set()
    for seams in COMBOS:
        stack = compose(make_config(seams=seams, spec="tiny"))
        crossings = {c["boundary"]: c for c in stack.negotiation["crossings"]}
        expected = {f"{u}/{lo}" for u, lo in (("framework", "runtime"), ("runtime", "driver"),
                                              ("compiler", "driver"), ("library", "driver"))
                    if seams[u] != seams[lo]}
        assert set(crossings) == expected, seams
        for c in crossings.values():
            assert c["real_name"] and c["name"] and c["declared_by"], c
            mechanisms.add(c["mechanism"])
        if "compiler/driver" in crossings:
            c = crossings["compiler/driver"]
            mechanism, real = COMPILER_PATHS[(seams["compiler"], seams["driver"])]
            assert c["mechanism"] == mechanism and c["real_name"].startswith(real), c
            assert c["declared_by"] == (seams["compiler"] if mechanism == "cross-compile" else seams["driver"])
        if "library/driver" in crossings:
            c = crossings["library/driver"]
            assert c["mechanism"] == "marshal" and LIBRARY_PATHS[(seams["library"], seams["driver"])] in c["real_name"]
            assert stack.library.vendor == seams["library"]          # the API the user composed
    assert mechanisms == {"layer", "generic adapter", "cross-compile", "translate", "marshal"}


@pytest.mark.parametrize("compiler, library, driver", list(itertools.product(BUILTIN_FAMILIES, repeat=3)))
def test_every_compiler_library_driver_pairing_computes_correctly(compiler, library, driver):
    seams = {"framework": driver, "runtime": driver, "driver": driver, "compiler": compiler, "library": library}
    stack = compose(make_config(seams=seams, spec="tiny"))
    wl = get_workload("mlp")
    graph, feeds = wl.build(0)
    result = stack.run(graph, feeds)
    nums = numerics(graph, result.outputs, feeds)
    assert nums and all(n["ok"] for n in nums), nums
    rep = build(stack, "mlp", result, nums)
    validate(rep)
    lib = rep["seams"]["library"]
    # the MLP's two GEMMs reach the library where the compiler's family routes matmul there
    routed = 2 if "matmul" in rep["seams"]["compiler"]["routes_to_library"] else 0
    assert lib["calls"] == routed
    if library != driver:
        assert lib["marshalling"]["calls"] == routed and lib["marshalling"]["backend"] == driver
        assert (lib["marshalling"]["simulated_s"] > 0) == (routed > 0)
    if compiler != driver:
        t = rep["seams"]["compiler"]["translator"]
        assert t["translations"] >= 1 and t["mechanism"] == COMPILER_PATHS[(compiler, driver)][0]
        # a translation at module load costs simulated time; a cross-compilation does not
        assert (rep["costs"]["translate_s"] > 0) == (t["mechanism"] == "translate")


def test_no_translate_refuses_exactly_the_cross_family_formats():
    for seams in COMBOS:
        cfg = make_config(seams=seams, spec="tiny")
        cfg.translate = False
        crossing = seams["compiler"] != seams["driver"] or seams["library"] != seams["driver"]
        if crossing:
            with pytest.raises(FormatMismatchError, match="switched off"):
                compose(cfg)
        else:
            compose(cfg)


def test_the_compose_tree_and_json_name_the_paths():
    args = ["compose", "--vendor", "cuda-like", "--seam", "compiler=rocm-like", "--seam", "library=xpu-like",
            "--seam", "runtime=xpu-like", "--seam", "framework=rocm-like", "--spec", "tiny"]
    res = CliRunner().invoke(main, [*args, "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert all(n["ok"] for n in rep["numerics"])
    names = {c["boundary"]: c["name"] for c in rep["seams"]["compiler"]["negotiation"]["crossings"]}
    assert names == {"framework/runtime": "fornax rocm-like over xpu-like", "runtime/driver": "dpcpp-cuda-like",
                     "compiler/driver": "hip-nvidia-like", "library/driver": "onemath-cublas-like"}
    res = CliRunner().invoke(main, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "portability paths" in res.output and "HIP on NVIDIA" in res.output and "oneMath" in res.output
    assert "no real-world counterpart" in res.output


def test_a_torch_workload_runs_across_families():
    args = ["compose", "--framework", "torch", "--workload", "mlp", "--vendor", "xpu-like", "--seam",
            "compiler=cuda-like", "--seam", "library=rocm-like", "--seam", "runtime=cuda-like", "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["numerics"] and all(n["ok"] for n in rep["numerics"]), rep["numerics"]
    kinds = {c["boundary"]: c["mechanism"] for c in rep["seams"]["compiler"]["negotiation"]["crossings"]}
    assert kinds == {"framework/runtime": "generic adapter", "runtime/driver": "layer",
                     "compiler/driver": "translate", "library/driver": "marshal"}
