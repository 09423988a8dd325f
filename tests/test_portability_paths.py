"""Choosing among several portability paths and what each one costs: ``--path NAME`` (and the
config's ``paths``) carries every crossing that declares NAME by it; a port compiles for the
target (no translation at module load, every lane used), a translation keeps the source SIMD
layout and pays at module load; a marshalling layer's host time is spent on the simulated host
clock; every cost figure says what it rests on."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.compare import execute, prepare
from fornax.layers.errors import ConfigError
from fornax.layers.marshal import MarshallingLibrary, marshal_paths
from fornax.layers.portability import BASES
from fornax.layers.translate import translation_paths
from fornax.sim.cost import kernel_cost
from fornax.sim.counters import Counters
from fornax.sim.spec import load_spec
from fornax.stack import BUILTIN_FAMILIES, compose, get_vendor, load_config, make_config

CUDA_ON_ROCM = {"framework": "cuda-like", "compiler": "cuda-like", "library": "cuda-like",
                "runtime": "cuda-like", "driver": "rocm-like"}
CUDA_ON_XPU = {**CUDA_ON_ROCM, "driver": "xpu-like"}


def _by_boundary(stack) -> dict[str, dict]:
    return {c["boundary"]: c for c in stack.negotiation["crossings"]}


def _run(cfg, workload="mlp"):
    prep = prepare(cfg, "graph", workload, origin="test")
    out = execute(prep)
    assert out.failed is None and out.numerics_ok, out.failed
    return out.report


def test_by_default_a_cuda_program_on_a_rocm_driver_runs_through_zluda_and_names_the_port():
    got = _by_boundary(compose(make_config(seams=CUDA_ON_ROCM, spec="tiny")))
    assert set(got) == {"runtime/driver", "compiler/driver", "library/driver"}
    for c in got.values():
        assert c["name"] == "zluda-like" and not c["forced"] and c["alternatives"] == ["hipify-like"]
    assert got["compiler/driver"]["mechanism"] == "translate"
    assert got["compiler/driver"]["basis"] == "modelling assumption"


@pytest.mark.parametrize("seams,name,real", [(CUDA_ON_ROCM, "hipify-like", "HIPIFY"),
                                             (CUDA_ON_XPU, "syclomatic-like", "SYCLomatic")])
def test_path_carries_every_crossing_that_declares_it(seams, name, real):
    cfg = make_config(seams=seams, spec="tiny", paths=[name])
    got = _by_boundary(compose(cfg))
    assert {c["name"] for c in got.values()} == {name}
    assert all(c["forced"] and c["real_name"].startswith(real) for c in got.values())
    assert got["compiler/driver"]["mechanism"] == "port"
    assert got["runtime/driver"]["mechanism"] == "port"
    rep = _run(cfg)                                     # numerics checked against float64
    tr = rep["seams"]["compiler"]["translator"]
    assert tr["mechanism"] == "port" and tr["simulated_s"] == 0.0 and tr["lane_efficiency"] == 1.0
    assert rep["costs"]["translate_s"] == 0.0


def test_a_path_that_carries_nothing_is_an_error_listing_the_declared_ones():
    with pytest.raises(ConfigError) as err:
        compose(make_config(seams=CUDA_ON_ROCM, spec="tiny", paths=["dpcpp-hip-like"]))
    msg = str(err.value)
    assert "'dpcpp-hip-like' carries no crossing" in msg
    assert "compiler/driver: zluda-like, hipify-like" in msg and "library/driver: zluda-like, hipify-like" in msg
    with pytest.raises(ConfigError, match="every seam is from one family"):
        compose(make_config(vendor="cuda-like", spec="tiny", paths=["zluda-like"]))
    # the sweep over many stacks ignores a path where it does not apply
    cfg = make_config(vendor="cuda-like", spec="tiny", paths=["zluda-like"])
    cfg.paths_strict = False
    assert compose(cfg).negotiation["crossings"] == []


def test_path_and_no_translate_contradict():
    with pytest.raises(ConfigError, match="cross-family paths are switched off"):
        make_config(seams=CUDA_ON_ROCM, paths=["hipify-like"], translate=False)
    for bad in ([""], [3]):
        with pytest.raises(ConfigError, match="non-empty string"):
            make_config(seams=CUDA_ON_ROCM, paths=bad)
    res = CliRunner().invoke(main, ["compose", "--vendor", "cuda-like", "--seam", "driver=rocm-like",
                                    "--no-translate", "--path", "hipify-like"])
    assert res.exit_code != 0 and "switched off" in res.output and "Traceback" not in res.output


def test_config_file_paths_key(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('[stack]\nvendor = "cuda-like"\nspec = "tiny"\npaths = ["syclomatic-like"]\n'
                 '[stack.seams]\ndriver = "xpu-like"\n')
    cfg = load_config(p)
    assert cfg.paths == ("syclomatic-like",)
    assert {c["name"] for c in compose(cfg).negotiation["crossings"]} == {"syclomatic-like"}
    # a flag replaces the file's choice
    assert make_config(base=cfg, paths=["zluda-like"]).paths == ("zluda-like",)
    p.write_text('[stack]\nvendor = "cuda-like"\npaths = "syclomatic-like"\n')
    with pytest.raises(ConfigError, match="paths must be a list of path names"):
        load_config(p)


def test_compose_tree_lists_the_alternatives_and_the_forced_path():
    args = ["compose", "--vendor", "cuda-like", "--seam", "driver=rocm-like", "--spec", "tiny"]
    res = CliRunner().invoke(main, args, env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "translate zluda-like" in res.output and "also declared: hipify-like (--path NAME)" in res.output
    assert "50% of each hardware group's lanes" in res.output
    res = CliRunner().invoke(main, [*args, "--path", "hipify-like", "--json"])
    rep = json.loads(res.stdout)
    assert all(c["forced"] for c in rep["seams"]["compiler"]["negotiation"]["crossings"])
    assert rep["manifest"]["paths"] == ["hipify-like"]


def test_a_translation_keeps_the_source_simd_layout_a_port_does_not():
    zluda = compose(make_config(seams=CUDA_ON_ROCM, spec="tiny"))
    assert zluda.compiler.translator.lanes == 0.5
    assert compose(make_config(seams=CUDA_ON_ROCM, spec="tiny",
                               paths=["hipify-like"])).compiler.translator.lanes == 1.0
    rep = _run(make_config(seams=CUDA_ON_ROCM, spec="tiny"))
    tr = rep["seams"]["compiler"]["translator"]
    # a 32-lane warp layout on 64-lane wavefronts: half the lanes work
    assert tr["lane_efficiency"] == 0.5 and tr["translations"] >= 1 and tr["simulated_s"] > 0
    assert rep["costs"]["translate_s"] == pytest.approx(tr["simulated_s"])
    # on an xpu-like driver (16-lane sub-groups) a 32-lane layout splits into whole sub-groups
    assert compose(make_config(seams=CUDA_ON_XPU, spec="tiny")).compiler.translator.lanes == 1.0


def test_translated_kernels_reach_the_driver_with_their_lane_efficiency():
    prep = prepare(make_config(seams=CUDA_ON_ROCM, spec="tiny"), "graph", "mlp", origin="test")
    execute(prep)
    translator = prep.stack.compiler.translator
    assert translator.path.mechanism == "translate"
    (binary,) = list(translator._done.values())
    kernels = prep.stack.driver.decode_image(binary)
    assert kernels and all(p.meta.get("lane_efficiency") == 0.5 for p in kernels.values())


def test_lane_efficiency_slows_vector_bound_work_and_not_memory_bound_work():
    spec = load_spec("mi300x-like")
    # compute-bound: many vector FLOPs per byte
    busy = Counters(instances=spec.compute_units * 4, vector_flops={"float32": 4e12},
                    bytes_read=1 << 20, bytes_written=1 << 20)
    full, half = kernel_cost(spec, busy, {}), kernel_cost(spec, busy, {"lane_efficiency": 0.5})
    assert half.compute_s == pytest.approx(2 * full.compute_s) and half.lane_efficiency == 0.5
    assert half.duration_s > 1.9 * full.duration_s - full.launch_s
    # memory-bound: the lanes wait on memory either way
    stream = Counters(instances=spec.compute_units * 4, vector_flops={"float32": 1e6},
                      bytes_read=1 << 30, bytes_written=1 << 30)
    assert kernel_cost(spec, stream, {"lane_efficiency": 0.5}).duration_s == pytest.approx(
        kernel_cost(spec, stream, {}).duration_s)
    # anything else in the slot is not a translator's stamp: the kernel runs as written
    for junk in (0, -1, 2.0, "half", True):
        assert kernel_cost(spec, busy, {"lane_efficiency": junk}).compute_s == pytest.approx(full.compute_s)


def test_marshalling_time_is_spent_on_the_host_clock():
    seams = {**CUDA_ON_ROCM, "library": "rocm-like", "compiler": "rocm-like", "driver": "cuda-like",
             "runtime": "cuda-like", "framework": "cuda-like"}
    cfg = make_config(seams=seams, spec="tiny")
    base = _run(cfg)
    slow_prep = prepare(cfg, "graph", "mlp", origin="test")
    lib = slow_prep.stack.library
    assert isinstance(lib, MarshallingLibrary)
    lib.path = dataclasses.replace(lib.path, per_call_s=1e-3)     # a very slow forwarding layer
    slow = execute(slow_prep).report
    calls = slow["seams"]["library"]["marshalling"]["calls"]
    assert calls == base["seams"]["library"]["marshalling"]["calls"] >= 2
    assert slow["costs"]["marshal_s"] == pytest.approx(calls * 1e-3)
    # the host reaches each launch later, so the launch-bound run takes longer on the device
    grown = slow["costs"]["device_time_s"] - base["costs"]["device_time_s"]
    assert 1e-3 <= grown <= calls * 1e-3 + 1e-6
    assert base["costs"]["marshal_s"] == pytest.approx(calls * 1e-7)     # hipBLAS on NVIDIA


def test_every_declared_cost_says_what_it_rests_on():
    for family in BUILTIN_FAMILIES:
        facts = get_vendor(family).facts
        for path in translation_paths(facts, family):
            assert path.basis in BASES, (family, path.name)
        for m in marshal_paths(facts, family):
            assert m.basis in BASES, (family, m.name)
        for table in ("library",):
            for entry in facts["portability"].get(table, []):
                assert entry.get("why"), (family, entry)
        for entry in facts.get("translators", []):
            assert entry.get("why"), (family, entry)
    with pytest.raises(ConfigError, match="basis must be one of"):
        marshal_paths({"portability": {"library": [{"backend": "x", "basis": "folklore"}]}}, "v")
