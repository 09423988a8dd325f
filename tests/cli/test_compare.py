"""``fornax compare``: one workload over a matrix of stacks, side by side."""

from __future__ import annotations

import dataclasses
import json
import struct
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from rich.console import Console

import fornax.compare
from fornax.cli.main import main
from fornax.layers.errors import ConfigError
from fornax.schemas import SchemaError, validate
from fornax.sim.faults import FaultPlan
from helpers import FAMILIES

VENDORS = list(FAMILIES)
METRIC_KEYS = {"device_time_s", "host_wall_s", "kernels", "launches", "fused_kernels", "library_calls",
               "copies", "h2d_bytes", "d2h_bytes", "peak_device_bytes", "fallbacks", "max_rel_err",
               "energy_j"}
# the MLP 256-512-128 on a batch of 64 in float32: weights, biases and input go up, y comes down
MLP_H2D = 4 * (256 * 512 + 512 + 512 * 128 + 128 + 64 * 256)
MLP_D2H = 4 * 64 * 128


def run(*args, env=None):
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def run_json(*args):
    code, out, err = run("compare", *args, "--json")
    doc = json.loads(out)
    validate(doc)
    return code, doc, err


def compose_json(*args):
    code, out, err = run("compose", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_graph_workload_three_families_match_compose():
    """The default matrix: the three families side by side, each column's figures the very ones
    `fornax compose --json` reports for that stack."""
    code, doc, err = run_json("--workload", "transformer-block")
    assert code == 0, err
    assert doc["schema"] == "fornax.compare/1" and doc["ok"] and doc["workload"] == "transformer-block"
    assert [c["label"] for c in doc["columns"]] == VENDORS
    for c, vendor in zip(doc["columns"], VENDORS):
        assert c["framework"] == "graph" and c["status"] == "ok" and c["error"] is None
        assert c["vendors"] == [vendor] and set(c["stack"]["seams"].values()) == {vendor}
        assert c["stack"]["description"] == f"{vendor} on h200-like"
        assert c["report"]["manifest"]["stack"] == c["stack"]["seams"]
        m = c["metrics"]
        assert set(m) == METRIC_KEYS
        # seq 64 x d_model 256 float32 comes back; input, 7 weight matrices and 2 gains go up
        assert m["d2h_bytes"] == 4 * 64 * 256
        assert m["h2d_bytes"] >= 4 * (64 * 256 + 4 * 256 * 256 + 3 * 256 * 512 + 2 * 256)
        assert m["max_rel_err"] == max(n["max_rel_err"] for n in c["report"]["numerics"]) < 1e-4
        assert m["kernels"] > 0 and m["device_time_s"] > 0 and m["energy_j"] > 0
        assert m["fallbacks"] == 0 and m["peak_device_bytes"] > 0
    ref = compose_json("--vendor", "rocm-like", "--workload", "transformer-block")
    got = doc["columns"][1]["metrics"]
    for key in ("device_time_s", "kernels", "launches", "fused_kernels", "library_calls", "copies",
                "h2d_bytes", "d2h_bytes", "peak_device_bytes", "energy_j"):
        assert got[key] == ref["costs"][key], key
    assert got["max_rel_err"] == pytest.approx(ref["numerics"][0]["max_rel_err"], rel=1e-12)

    # the human table: a column per family, a row per metric, values as compose formats them
    code, out, err = run("compare", "--workload", "transformer-block")
    assert code == 0 and err == ""
    header = next(line for line in out.splitlines() if "metric" in line)
    assert [name for name in VENDORS if name in header] == VENDORS
    for label in ("device time (simulated)", "host wall time", "kernels", "launches", "fused kernels",
                  "library calls", "copies", "H2D bytes", "D2H bytes", "peak device memory",
                  "CPU fallbacks", "max rel. error vs float64", "energy (simulated)"):
        assert label in out, label
    from fornax.report import fmt_time
    dev_row = next(line for line in out.splitlines() if "device time (simulated)" in line)
    assert fmt_time(ref["costs"]["device_time_s"]) in dev_row
    kern_row = next(line for line in out.splitlines() if line.startswith("│ kernels "))
    assert kern_row.split("│")[3].strip() == str(ref["costs"]["kernels"])      # the rocm-like cell


def test_torch_and_jax_front_ends_side_by_side():
    code, doc, err = run_json("--frameworks", "torch,jax", "--workload", "mlp", "--vendors", "cuda-like",
                              "--spec", "tiny", "--seed", "2")
    assert code == 0, err
    assert [(c["label"], c["framework"]) for c in doc["columns"]] == [
        ("cuda-like/torch", "torch"), ("cuda-like/jax", "jax")]
    # the float64 reference recomputed independently: the same module (seed 2) on the CPU
    from fornax.scenarios.torch_workloads import mlp as torch_mlp
    prog = torch_mlp(2)
    ref = prog.model.double()(prog.inputs[0].double()).detach().numpy()
    for c in doc["columns"]:
        m, rep = c["metrics"], c["report"]
        assert c["status"] == "ok" and rep["manifest"]["framework"] == c["framework"]
        assert rep["manifest"]["seed"] == 2 and c["stack"]["spec"] == "tiny"
        assert 0 < m["max_rel_err"] < 1e-4
        (num,) = rep["numerics"]
        assert num["max_abs_err"] / num["max_rel_err"] == pytest.approx(np.abs(ref).max(), rel=1e-9)
        assert m["d2h_bytes"] == MLP_D2H
        if c["framework"] == "torch":
            assert m["h2d_bytes"] == MLP_H2D
        else:                           # the jitted program uploads a small operand more
            assert MLP_H2D < m["h2d_bytes"] <= MLP_H2D + 64
        assert m["kernels"] >= 2 and m["launches"] >= m["kernels"] and m["device_time_s"] > 0
        assert 0 < m["host_wall_s"] < 60 and m["energy_j"] > 0
        front = rep[c["framework"]]
        assert m["fallbacks"] == sum(f["count"] for f in front["fallbacks"])
    assert doc["columns"][1]["report"]["jax"]["platform"] == "cuda"


def test_jax_at_both_of_its_boundaries():
    """--frameworks jax,jax-pjrt: the same JAX program handed to the stack as a jaxpr (the front
    end, above PJRT) and as StableHLO (plain jax.jit through the PJRT plugin, in a process of
    its own): the same kernels and results, different programs handed over."""
    code, doc, err = run_json("--frameworks", "jax,jax-pjrt", "--workload", "mlp", "--vendors", "rocm-like",
                              "--spec", "tiny", "--seed", "2")
    assert code == 0, err
    jx, pj = doc["columns"]
    assert (jx["framework"], pj["framework"]) == ("jax", "jax-pjrt") and pj["status"] == "ok"
    got_jaxpr, got_shlo = jx["report"]["jax"]["received"], pj["report"]["jax"]["received"]
    assert got_jaxpr["ir"] == "jaxpr" and got_jaxpr["equations"] > 0
    assert got_shlo["ir"] == "stablehlo" and got_shlo["kinds"]["stablehlo.dot_general"] == 2
    assert got_shlo["ops"] == sum(got_shlo["kinds"].values()) and got_shlo["bytes"] > 0
    assert pj["report"]["jax"]["platform"] == "fornax" and pj["report"]["manifest"]["framework"] == "jax-pjrt"
    assert pj["stack"]["spec"] == "tiny" and pj["report"]["manifest"]["seed"] == 2
    for key in ("kernels", "launches", "library_calls", "d2h_bytes", "fallbacks"):
        assert pj["metrics"][key] == jx["metrics"][key], key
    assert pj["metrics"]["d2h_bytes"] == MLP_D2H and pj["metrics"]["h2d_bytes"] >= MLP_H2D
    assert pj["metrics"]["max_rel_err"] == pytest.approx(jx["metrics"]["max_rel_err"], rel=1e-6)
    assert pj["one_off"]["first_run_wall_s"] > 0
    assert "StableHLO" in doc["boundaries"]["jax-pjrt"]["sees"] and "jaxpr" in doc["boundaries"]["jax"]["sees"]
    assert fornax.compare.received(pj["report"]).startswith("StableHLO: ")


def test_a_jax_pjrt_worker_that_never_reports_fails_its_column_only(monkeypatch):
    import fornax.compare_pjrt
    monkeypatch.setattr(fornax.compare_pjrt, "WORKER_TIMEOUT_S", 0.5)
    doc = fornax.compare.compare(fornax.compare.columns("mlp", frameworks=["graph", "jax-pjrt"],
                                                        vendors=["cuda-like"], spec="tiny"))
    validate(doc)
    graph, pjrt = doc["columns"]
    assert graph["status"] == "ok" and pjrt["status"] == "error" and doc["ok"] is False
    assert "the jax-pjrt run of mlp took over 0.5 s" in pjrt["error"] and pjrt["metrics"] is None


def test_stack_files_are_columns(tmp_path):
    a = tmp_path / "mixed.toml"
    a.write_text('[stack]\nvendor = "rocm-like"\nspec = "tiny"\nseed = 5\n'
                 '[stack.seams]\nruntime = "cuda-like"\n')
    b = tmp_path / "xpu.toml"
    b.write_text('[stack]\nvendor = "xpu-like"\nspec = "tiny"\nmeta = true\n')
    code, doc, err = run_json("--stack", str(a), "--stack", str(b))
    assert code == 0, err
    mixed, xpu = doc["columns"]
    assert (mixed["label"], mixed["file"], xpu["label"], xpu["file"]) == ("mixed", str(a), "xpu", str(b))
    assert mixed["stack"]["seams"] == {"framework": "rocm-like", "compiler": "rocm-like",
                                       "library": "rocm-like", "runtime": "cuda-like",
                                       "driver": "rocm-like"}
    assert mixed["vendors"] == ["cuda-like", "rocm-like"] and mixed["stack"]["seed"] == 5
    assert mixed["metrics"]["d2h_bytes"] == MLP_D2H and mixed["metrics"]["max_rel_err"] < 1e-4
    ref = compose_json("--config", str(a))
    for key in ("device_time_s", "kernels", "h2d_bytes"):
        assert mixed["metrics"][key] == ref["costs"][key], key
    # shape-only: costs from kernel estimates, nothing checked
    assert xpu["stack"]["meta"] and xpu["status"] == "ok" and xpu["metrics"]["max_rel_err"] is None
    assert xpu["metrics"]["kernels"] > 0 and xpu["report"]["numerics"] == []

    # --seed and --spec apply on top of every file; same-named files are told apart by path
    (tmp_path / "other").mkdir()
    c = tmp_path / "other" / "mixed.toml"
    c.write_text('[stack]\nvendor = "cuda-like"\n')
    code, doc, err = run_json("--stack", str(a), "--stack", str(c), "--seed", "7", "--spec", "tiny")
    assert code == 0, err
    assert [col["label"] for col in doc["columns"]] == [str(a), str(c)]
    assert [(col["stack"]["seed"], col["stack"]["spec"]) for col in doc["columns"]] == [(7, "tiny")] * 2
    code, out, _ = run("compare", "--stack", str(a), "--stack", str(b))
    assert code == 0 and "mixed" in out and "runtime=cuda-like" in out.replace("\n", " ").replace("│", "")


def test_a_failing_run_keeps_its_column_and_exits_1(monkeypatch):
    """A page fault on the rocm-like stack's device: that column shows its error (the family's own
    code), the others still run, and the command exits 1 at the end."""
    prepare = fornax.compare.prepare

    def prepare_with_fault(cfg, framework, workload, origin="fornax"):
        prep = prepare(cfg, framework, workload, origin)
        if cfg.seams["driver"] == "rocm-like":
            for device in prep.stack.devices:
                device.inject(FaultPlan.parse("page_fault@1", seed=0))
        return prep
    monkeypatch.setattr(fornax.compare, "prepare", prepare_with_fault)

    code, doc, _ = run_json("--spec", "tiny")
    assert code == 1 and not doc["ok"]
    cuda, rocm, xpu = doc["columns"]
    assert cuda["status"] == xpu["status"] == "ok" and cuda["metrics"]["d2h_bytes"] == MLP_D2H
    assert rocm["status"] == "error" and rocm["metrics"] is None
    (error,) = rocm["report"]["errors"]
    assert error["code"]["name"] == "hipErrorIllegalAddress" and "page fault" in rocm["error"]

    code, out, err = run("compare", "--spec", "tiny")
    assert code == 1
    assert "FAILED" in out and "hipErrorIllegalAddress" in out.replace("\n", "").replace(" ", "").replace("│", "")
    assert err.startswith("fornax: error: 1 of 3 runs failed — rocm-like: ") and err.count("\n") == 1
    status = next(line for line in out.splitlines() if line.startswith("│ status"))
    assert [cell.strip() for cell in status.split("│")[2:5]] == ["ok", "FAILED", "ok"]


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "out.png"
    code, _, err = run("compare", "--vendors", "cuda-like,xpu-like", "--spec", "tiny", "--plot", str(path))
    assert code == 0, err
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    width, height = struct.unpack(">II", data[16:24])          # IHDR: the figure at 100 dpi
    assert width > height > 300


def test_plot_without_matplotlib_is_one_line_exit_2(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)       # import matplotlib -> ImportError
    code, out, err = run("compare", "--vendors", "cuda-like", "--plot", str(tmp_path / "x.png"))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("fornax: error: ") and "pip install fornax[plot]" in err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("args, fragment", [
    (["--vendors", "cuda-like,nope"], "unknown vendor 'nope' in --vendors; available: cuda-like"),
    (["--frameworks", "torch,tensorflow"], "unknown framework 'tensorflow' in --frameworks"),
    (["--frameworks", "torch,jax", "--workload", "conv-net"], "unknown jax workload 'conv-net'"),
    (["--workload", "mlp-train"], "mlp-train is a torch and jax workload: add --frameworks torch"),
    (["--stack", "/nonexistent/stack.toml"], "config file /nonexistent/stack.toml does not exist"),
    (["--stack", "."], "--stack . is a folder"),
    (["--stack", "x.toml", "--vendors", "cuda-like"], "--vendors and --stack exclude each other"),
    (["--vendors", "cuda-like,,xpu-like"], "--vendors takes a comma-separated list"),
    (["--vendors", "xpu-like,xpu-like"], "--vendors names xpu-like more than once"),
    (["--spec", "nope"], "unknown chip spec 'nope'"),
    (["--workload", "llama70b-step"], "needs shape-only mode"),
    (["--plot", "/nonexistent/dir/out.png"], "folder /nonexistent/dir does not exist"),
])
def test_bad_arguments_are_one_line_exit_2(args, fragment):
    code, out, err = run("compare", *args)
    assert code == 2 and out == ""
    assert err.startswith("fornax: error: ") and err.count("\n") == 1 and fragment in err, err


def test_bad_stack_file_contents(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[stack]\nvendor = "cuda-like"\ncolour = "red"\n')
    good = tmp_path / "good.toml"
    good.write_text('[stack]\nvendor = "cuda-like"\n')
    code, out, err = run("compare", "--stack", str(good), "--stack", str(bad))
    assert code == 2 and out == "" and "unknown key(s) colour" in err and err.count("\n") == 1


def test_progress_bar_on_a_terminal_only_without_json():
    tty = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}
    code, _, err = run("compare", "--vendors", "cuda-like,xpu-like", "--spec", "tiny", env=tty)
    assert code == 0 and "running cuda-like (graph)" in err and "running xpu-like (graph)" in err
    code, out, err = run("compare", "--vendors", "cuda-like", "--spec", "tiny", "--json", env=tty)
    assert code == 0 and err == "" and json.loads(out)["ok"]


def test_schema_rejects_inconsistent_documents():
    code, doc, _ = run_json("--vendors", "xpu-like", "--spec", "tiny")
    assert code == 0
    col = doc["columns"][0]
    for broken in ({**col, "status": "error"},                       # an error needs its message
                   {**col, "metrics": {**col["metrics"], "kernels": -1}},
                   {**col, "metrics": {k: v for k, v in col["metrics"].items() if k != "energy_j"}},
                   {**col, "framework": "tensorflow"}):
        with pytest.raises(SchemaError):
            validate({**doc, "columns": [broken]})


def test_python_api_crosses_stacks_and_frameworks():
    cols = fornax.compare.columns("mlp", vendors=["rocm-like", "cuda-like"], frameworks=["graph", "jax"],
                                  spec="tiny")
    assert [(c.label, c.framework) for c in cols] == [
        ("rocm-like/graph", "graph"), ("rocm-like/jax", "jax"),
        ("cuda-like/graph", "graph"), ("cuda-like/jax", "jax")]
    started = []
    doc = fornax.compare.compare(cols[:2], on_run=lambda i, col: started.append((i, col.label)))
    validate(doc)
    assert started == [(0, "rocm-like/graph"), (1, "rocm-like/jax")] and doc["ok"]
    graph, jax_col = (c["metrics"] for c in doc["columns"])
    assert graph["h2d_bytes"] == MLP_H2D and MLP_H2D < jax_col["h2d_bytes"] <= MLP_H2D + 64
    with pytest.raises(ConfigError, match="one workload in every column, got mlp, softmax"):
        fornax.compare.compare([cols[0], dataclasses.replace(cols[2], workload="softmax")])


def test_as_a_subprocess():
    proc = subprocess.run([sys.executable, "-m", "fornax.cli", "compare", "--vendors", "cuda-like,xpu-like",
                           "--spec", "tiny", "--json"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    doc = json.loads(proc.stdout)
    validate(doc)
    assert [c["label"] for c in doc["columns"]] == ["cuda-like", "xpu-like"]
    assert all(c["metrics"]["d2h_bytes"] == MLP_D2H for c in doc["columns"])


def test_every_column_is_warmed_up_and_its_one_off_costs_reported_apart(tmp_path, monkeypatch):
    """The measured run of a column is its second: the first (the warm-up, on a stack of its
    own) pays the compiles, so the measured one finds every plan in the compile cache, and
    the one-off figures stand in their own rows."""
    monkeypatch.setenv("FORNAX_CACHE_DIR", str(tmp_path))
    cols = fornax.compare.columns("mlp", vendors=["xpu-like", "cuda-like"], spec="tiny")
    doc = fornax.compare.compare(cols)
    validate(doc)
    for col in doc["columns"]:
        assert col["one_off"]["first_run_wall_s"] > 0 and col["one_off"]["import_s"] == 0
        compiler = col["report"]["seams"]["compiler"]
        assert compiler["graphs_compiled"] == 0 and compiler["cache_hits"] >= 1
    console = Console(record=True, width=200)
    fornax.compare.render(doc, console)
    assert "one-off: first run (host wall)" in console.export_text()
