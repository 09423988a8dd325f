"""Cross-family binary translation: cuda-like compiler -> xpu-like driver through a declared path."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from fornax import report as report_mod
from fornax.cli.main import main
from fornax.layers.binary import KernelBinary, unpack_programs
from fornax.layers.compiler import Target
from fornax.layers.errors import BinaryError, ConfigError, FormatMismatchError
from fornax.layers.graph import DType, Graph
from fornax.layers.translate import (TranslationPath, Translator, candidate_paths, cross_compile_paths,
                                    lane_efficiency, translation_paths)
from fornax.sim import isa
from fornax.stack import compose, get_vendor, load_config, make_config
from fornax.vendors.cuda_like import CudaLikeCompiler
from fornax.vendors.xpu_like import FACTS as XPU_FACTS
from fornax.vendors.xpu_like.compiler import SPIRV_MAGIC, spirv_image
from helpers import FAMILIES

F64 = np.float64


def mlp(m=16, k=32, h=48, n=10, seed=0):
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((k, h)) / np.sqrt(k)).astype(np.float32)
    b1 = (rng.standard_normal((h,)) / 4).astype(np.float32)
    w2 = (rng.standard_normal((h, n)) / np.sqrt(h)).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    g = Graph("mlp")
    xi = g.input("x", (m, k), DType.FLOAT32)
    hid = g.op("relu", g.op("add", g.op("matmul", xi, g.constant(w1, "w1")), g.constant(b1, "b1")))
    g.output(g.op("matmul", hid, g.constant(w2, "w2")))
    ref = np.maximum(x.astype(F64) @ w1.astype(F64) + b1.astype(F64), 0) @ w2.astype(F64)
    return g, {"x": x}, ref


def softmax_graph(rows=8, cols=40, seed=1):
    x = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    g = Graph("row_softmax")
    g.output(g.op("softmax", g.input("x", (rows, cols), DType.FLOAT32), axis=-1))
    e = np.exp(x.astype(F64) - x.astype(F64).max(-1, keepdims=True))
    return g, {"x": x}, e / e.sum(-1, keepdims=True)


def rel_err(out, ref) -> float:
    return float(np.abs(np.asarray(out, F64) - ref).max() / np.abs(ref).max())


def _declared():
    (t,) = XPU_FACTS["translators"]
    return t


@pytest.fixture
def stack():
    return compose(make_config("xpu-like", seams={"compiler": "cuda-like"}, spec="tiny"))


def test_ptx_like_to_spirv_like_composes_and_says_so(stack):
    neg = stack.negotiation
    assert neg["translation"]["from"] == "ptx-like" and neg["translation"]["to"] == "spirv-like"
    assert neg["translation"]["declared_by"] == "xpu-like"
    assert neg["compiler_format"] == "ptx-like"
    assert stack.target.format == "spirv-like" and stack.target.arch == stack.driver.properties(0).target
    # the cuda-like compiler was asked for the arch its own family names for this chip
    assert neg["translation"]["source_target"].startswith("sm_")


@pytest.mark.parametrize("build", [mlp, softmax_graph])
def test_translated_kernels_compute_the_float64_reference(stack, build):
    g, feeds, ref = build()
    res = stack.run(g, feeds)
    assert rel_err(res.outputs[0], ref) <= 1e-4
    plan = res.plans[0]
    assert plan.binary.format == "spirv-like" and plan.binary.target == "spirv64"
    assert plan.binary.metadata["translated_from"].startswith("ptx-like:compute_")
    assert stack.driver.counts["il_builds"] >= 1           # the xpu-like driver built the IL


def test_translation_is_counted_with_its_simulated_cost(stack):
    g, feeds, _ = softmax_graph()
    stack.run(g, feeds)
    stack.run(g, feeds)                                      # second run reuses the translation
    # the PTX-like text the cuda-like compiler emits for this graph, compiled independently
    arch = stack.negotiation["translation"]["source_target"]
    ptx = CudaLikeCompiler().compile(g, Target(arch, "ptx-like", stack.spec.compute_units)).binary
    t = stack.compiler.report()["translator"]
    assert t["translations"] == 1 and t["reused"] == 1
    assert t["bytes_in"] == len(ptx.data)
    decl = _declared()
    expect_s = decl["cost_s"] + decl["cost_s_per_kib"] * len(ptx.data) / 1024
    assert t["simulated_s"] == pytest.approx(expect_s)
    rep = report_mod.build(stack, "row_softmax")
    assert rep["costs"]["translations"] == 1
    assert rep["costs"]["translate_s"] == pytest.approx(expect_s)
    assert rep["seams"]["compiler"]["translator"]["name"] == decl["name"]


def test_translated_module_holds_the_same_programs(stack):
    g, _, _ = mlp()
    arch = stack.negotiation["translation"]["source_target"]
    plan = CudaLikeCompiler().compile(g, Target(arch, "ptx-like", 4))
    out = stack.compiler.translator.translate(plan.binary, stack.target.arch)
    assert out.format == "spirv-like" and out.entry_points == plan.binary.entry_points
    header, programs = unpack_programs(SPIRV_MAGIC, out.data)
    assert header["kind"] == "spirv-like"
    # the kernels the compiler generated, bit for bit, now in the SPIR-V-like container
    assert {n: isa.encode(p) for n, p in programs.items()} == \
        {n: isa.encode(p) for n, p in plan.programs.items()}


def test_no_translate_fails_naming_both_formats():
    with pytest.raises(FormatMismatchError) as exc:
        compose(make_config("xpu-like", seams={"compiler": "cuda-like"}, spec="tiny", translate=False))
    msg = str(exc.value)
    assert "ptx-like" in msg and "spirv-like" in msg and "switched off" in msg


@pytest.mark.parametrize("driver,other", [(d, o) for d in FAMILIES for o in FAMILIES if d != o])
def test_undeclared_paths_still_fail_naming_both_formats(driver, other, monkeypatch):
    # every built-in pair has a declared path (tests/test_portability.py); without the facts
    # that declare them, composing is a clean refusal naming both families and formats
    for fam in (driver, other):
        monkeypatch.delitem(get_vendor(fam).facts, "portability", raising=False)
        monkeypatch.delitem(get_vendor(fam).facts, "translators", raising=False)
    with pytest.raises(FormatMismatchError) as exc:
        compose(make_config(driver, seams={"compiler": other}, spec="tiny"))
    msg = str(exc.value)
    assert driver in msg and other in msg and "no portability path" in msg


def test_corrupt_or_wrong_binaries_are_binary_errors(stack):
    tr = stack.compiler.translator
    with pytest.raises(BinaryError) as exc:
        tr.translate(KernelBinary("ptx-like", "compute_90", ("k",), b".version 8.0\n.kernel k(\n"), "pvc")
    assert "ptx-like" in str(exc.value) and "spirv-like" in str(exc.value)
    with pytest.raises(BinaryError) as exc:
        tr.translate(KernelBinary("hsaco-like", "gfx942", ("k",), b"\x7fELF"), "pvc")
    assert "cannot translate a hsaco-like binary" in str(exc.value)
    with pytest.raises(BinaryError):
        tr.translate(b"not a binary", "pvc")
    assert tr.counts["translations"] == 0


def test_translator_with_handed_in_codecs():
    path = TranslationPath("t", "spirv-like", "spirv-like", "x", cost_s=1.0, cost_s_per_kib=2.0)
    (prog,) = CudaLikeCompiler().compile(softmax_graph()[0], Target("sm_90", "ptx-like", 4)).programs.values()
    src = spirv_image([prog], "pvc", "p")
    seen = []

    def decode(b):
        seen.append(b.format)
        return {prog.name: prog}
    tr = Translator(path, decode, spirv_image)
    out = tr.translate(src, "pvc")
    assert seen == ["spirv-like"] and out.producer == "p via t"
    assert tr.simulated_s == pytest.approx(1.0 + 2.0 * len(src.data) / 1024)


def test_declared_paths_are_checked_as_data():
    assert translation_paths({}, "v") == []
    good = translation_paths({"translators": [{"from": "a", "to": "b"}]}, "v")
    assert good[0].name == "a->b" and good[0].cost(4096) == 0.0
    assert candidate_paths({}, "c", {"translators": [{"from": "a", "to": "b"}]}, "v", ("z", "a"),
                           ("b",)) == good
    assert candidate_paths({}, "c", {"translators": [{"from": "a", "to": "b"}]}, "v", ("a",), ("c",)) == []
    for bad in ({"translators": {"from": "a"}}, {"translators": [{"from": "a"}]},
                {"translators": [{"from": "a", "to": "b", "cost_s": -1}]},
                {"translators": [{"from": "a", "to": "b", "via": "c"}]},
                {"translators": [{"from": "a", "to": "b", "basis": "a hunch"}]},
                # a translator's mechanism is fixed: only the compiler's table takes the key
                {"translators": [{"from": "a", "to": "b", "mechanism": "port"}]}):
        with pytest.raises(ConfigError):
            translation_paths(bad, "v")


def test_negotiation_order_is_cross_compile_then_translate_then_port():
    compiler = {"portability": {"compiler": [
        {"name": "ported", "from": "a", "to": "b", "mechanism": "port"},
        {"name": "cross", "from": "a", "to": "b"}]}}
    driver = {"translators": [{"name": "tr", "from": "a", "to": "b"}]}
    got = candidate_paths(compiler, "c", driver, "d", ("a",), ("b",))
    assert [(p.name, p.mechanism, p.vendor) for p in got] == [
        ("cross", "cross-compile", "c"), ("tr", "translate", "d"), ("ported", "port", "c")]
    with pytest.raises(ConfigError, match="mechanism must be one of cross-compile, port"):
        cross_compile_paths({"portability": {"compiler": [{"from": "a", "to": "b",
                                                           "mechanism": "translate"}]}}, "c")


def test_lane_efficiency_of_a_kernel_kept_in_its_source_layout():
    assert lane_efficiency(32, 64) == 0.5          # a warp on a wavefront: half the lanes
    assert lane_efficiency(64, 32) == 1.0          # splits into whole warps
    assert lane_efficiency(32, 16) == 1.0
    with pytest.raises(ValueError):
        lane_efficiency(0, 32)


def test_config_file_can_switch_translation_off(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('[stack]\nvendor = "xpu-like"\nspec = "tiny"\ntranslate = false\n'
                 '[stack.seams]\ncompiler = "cuda-like"\n')
    with pytest.raises(FormatMismatchError):
        compose(load_config(p))
    p.write_text('[stack]\nvendor = "xpu-like"\ntranslate = "no"\n')
    with pytest.raises(ConfigError):
        load_config(p)


def test_cli_compose_through_a_translator():
    r = CliRunner().invoke(main, ["compose", "--vendor", "xpu-like", "--seam", "compiler=cuda-like",
                                  "--spec", "tiny", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["costs"]["translations"] == 1 and all(n["ok"] for n in rep["numerics"])
    r = CliRunner().invoke(main, ["compose", "--vendor", "xpu-like", "--seam", "compiler=cuda-like",
                                  "--spec", "tiny", "--no-translate"])
    assert r.exit_code != 0 and "ptx-like" in r.output and "Traceback" not in r.output
