"""The fornax command: compose runs, JSON reports, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.layers.graph import DType
from fornax.scenarios.workloads import TOLERANCE, WORKLOADS
from helpers import FAMILIES

VENDORS = list(FAMILIES)
REQUIRED_COSTS = {"device_time_s", "host_wall_s", "kernels", "launches", "h2d_bytes", "d2h_bytes",
                  "peak_device_bytes"}


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("vendor", VENDORS)
def test_compose_json_report_numerics_ok(vendor):
    code, out, _ = run("compose", "--vendor", vendor, "--spec", "tiny", "--json")
    assert code == 0, out
    rep = json.loads(out)
    assert rep["schema"] == "fornax.report/1"
    m = rep["manifest"]
    for key in ("fornax", "python", "numpy", "torch", "jax", "stack", "spec", "seed"):
        assert key in m
    assert m["stack"] == {s: vendor for s in ("framework", "compiler", "library", "runtime", "driver")}
    assert m["spec"] == "tiny"
    assert set(rep["seams"]) == {"framework", "compiler", "library", "runtime", "driver"}
    assert REQUIRED_COSTS <= set(rep["costs"])
    assert rep["numerics"] and all(n["ok"] for n in rep["numerics"])
    assert all(n["tol"] == TOLERANCE[DType.FLOAT32] for n in rep["numerics"])
    assert rep["costs"]["kernels"] >= 2 and rep["costs"]["device_time_s"] > 0
    assert rep["costs"]["h2d_bytes"] > 0 and rep["costs"]["d2h_bytes"] == 64 * 128 * 4
    assert rep["fallbacks"] == [] and rep["errors"] == []


def test_json_numerics_are_recomputed_not_trusted():
    """The reported error must match an independent float64 recomputation of the workload."""
    from fornax.stack import compose, make_config
    code, out, _ = run("compose", "--vendor", "xpu-like", "--spec", "tiny", "--seed", "3", "--json")
    rep = json.loads(out)
    graph, feeds = WORKLOADS["mlp"].build(3)
    x = feeds["x"].astype(np.float64)
    w1, b1, w2, b2 = (np.asarray(v.const, np.float64) for v in graph.constants)
    ref = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    got = compose(make_config("xpu-like", spec="tiny", seed=3)).run(graph, feeds).outputs[0]
    err = float(np.abs(got - ref).max())
    assert rep["numerics"][0]["max_abs_err"] == pytest.approx(err, rel=1e-6, abs=1e-12)


def test_human_output_shows_the_stack_and_clocks():
    code, out, _ = run("compose", "--vendor", "rocm-like", "--spec", "tiny")
    assert code == 0
    for text in ("framework", "compiler", "library", "runtime", "driver", "hsaco-like",
                 "gfx90a", "rocblas-like", "simulated device time", "host wall time"):
        assert text in out


def test_progress_display_on_a_terminal_only_without_json():
    """compose shows a transient progress display on a terminal's stderr; --json and pipes
    get nothing on stderr."""
    tty = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}
    r = CliRunner().invoke(main, ["compose", "--vendor", "rocm-like", "--spec", "tiny"], env=tty)
    assert r.exit_code == 0 and "running mlp on rocm-like on tiny" in r.stderr
    r = CliRunner().invoke(main, ["compose", "--vendor", "rocm-like", "--spec", "tiny", "--json"], env=tty)
    assert r.exit_code == 0 and r.stderr == "" and json.loads(r.stdout)["schema"] == "fornax.report/1"
    r = CliRunner().invoke(main, ["compose", "--vendor", "rocm-like", "--spec", "tiny"])
    assert r.exit_code == 0 and r.stderr == ""


@pytest.mark.parametrize("workload", sorted(w for w in WORKLOADS if not WORKLOADS[w].meta_only))
def test_every_workload_runs_within_tolerance(workload):
    code, out, _ = run("compose", "--vendor", "cuda-like", "--spec", "tiny", "--workload", workload, "--json")
    assert code == 0
    assert all(n["ok"] for n in json.loads(out)["numerics"])


def test_mixed_library_names_incompatible_formats():
    code, out, err = run("compose", "--vendor", "cuda-like", "--seam", "library=xpu-like", "--no-translate", "--json")
    assert code != 0 and out == ""
    line = err.strip()
    assert "\n" not in line
    assert "spirv-like" in line and "ptx-like" in line


def test_mixed_runtime_runs():
    code, out, _ = run("compose", "--vendor", "cuda-like", "--seam", "runtime=rocm-like",
                       "--seam", "framework=xpu-like", "--spec", "tiny", "--json")
    assert code == 0
    rep = json.loads(out)
    assert rep["manifest"]["stack"]["runtime"] == "rocm-like"
    assert rep["seams"]["framework"]["device_type"] == "xpu"
    assert all(n["ok"] for n in rep["numerics"])


@pytest.mark.parametrize("args, needle", [
    (["--vendor", "nonsense"], "valid vendors: cuda-like, rocm-like, xpu-like (null is a template)"),
    (["--vendor", "null"], "is the template vendor: every hook raises"),
    (["--vendor", "cuda-like", "--seam", "kernel=cuda-like"], "valid seams"),
    (["--vendor", "cuda-like", "--seam", "compiler"], "SEAM=VENDOR"),
    (["--vendor", "cuda-like", "--workload", "resnet9000"], "unknown workload"),
    (["--vendor", "cuda-like", "--spec", "a100"], "unknown chip spec"),
    (["--config", "/nonexistent/stack.toml"], "does not exist"),
    ([], "no stack given"),
    (["--vendor", "cuda-like", "--seam", "driver=rocm-like", "--no-translate"], "hsaco-like"),
])
def test_bad_input_is_one_line_and_nonzero(args, needle):
    code, out, err = run("compose", *args)
    assert code == 2
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("content, needle", [
    ("[stack\nvendor = 'cuda-like'", "not valid TOML"),
    ("[stack]\nvendor = 'cuda-like'\ncolour = 'red'\n", "unknown key(s) colour"),
    ("[stack]\nvendor = 'cuda-like'\n[stack.seams]\nlinker = 'cuda-like'\n", "unknown seam"),
    ("[stack]\nvendor = 'cuda-like'\ndevices = 'two'\n", "devices must be a positive integer"),
    ("[stack]\nvendor = \"__import__('os').system('echo pwned')\"\n", "unknown vendor"),
    ("[other]\nx = 1\n", "unknown table"),
])
def test_bad_config_files(tmp_path, content, needle):
    path = tmp_path / "stack.toml"
    path.write_text(content)
    code, out, err = run("compose", "--config", str(path))
    assert code == 2 and needle in err and "Traceback" not in err


def test_config_file_with_override(tmp_path):
    path = tmp_path / "stack.toml"
    path.write_text('[stack]\nvendor = "rocm-like"\nspec = "tiny"\nseed = 5\n'
                    '[stack.seams]\nruntime = "cuda-like"\n')
    code, out, _ = run("compose", "--config", str(path), "--seam", "framework=xpu-like", "--json")
    assert code == 0
    m = json.loads(out)["manifest"]
    assert m["stack"]["driver"] == "rocm-like" and m["stack"]["runtime"] == "cuda-like"
    assert m["stack"]["framework"] == "xpu-like" and m["seed"] == 5 and m["spec"] == "tiny"


def test_specs_and_workloads_commands():
    code, out, _ = run("specs")
    assert code == 0 and "h200-like" in out and "tiny" in out
    code, out, _ = run("specs", "h200-like")
    assert code == 0 and "132" in out
    code, _, err = run("specs", "nope")
    assert code == 2 and "unknown chip spec" in err
    code, out, _ = run("workloads")
    assert code == 0 and all(name in out for name in WORKLOADS)


def test_console_script_has_no_traceback():
    """The installed entry point, as a user runs it: one line, non-zero, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "fornax.cli", "compose", "--vendor", "nonsense"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("fornax: error: unknown vendor 'nonsense'")
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


# ---- --framework jax ------------------------------------------------------------------------------
def test_compose_jax_json_has_a_jax_section():
    code, out, err = run("compose", "--framework", "jax", "--workload", "mlp", "--vendor", "rocm-like",
                         "--spec", "tiny", "--seed", "2", "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["manifest"]["framework"] == "jax" and rep["manifest"]["workload"] == "mlp"
    assert rep["manifest"]["stack"]["driver"] == "rocm-like" and rep["errors"] == []
    (num,) = rep["numerics"]
    assert num["output"] == "y" and num["shape"] == [64, 128] and num["ok"]
    # recomputed independently: the torch twin's module (same seed) in float64 on the CPU
    from fornax.scenarios.torch_workloads import mlp as torch_mlp
    prog = torch_mlp(2)
    ref = prog.model.double()(prog.inputs[0].double()).detach().numpy()
    assert 0 < num["max_rel_err"] < 1e-4
    assert num["max_abs_err"] / num["max_rel_err"] == pytest.approx(np.abs(ref).max(), rel=1e-9)
    sec = rep["jax"]
    assert sec["stack"] == "rocm-like on tiny" and sec["platform"] == "rocm" == sec["plugin"]
    assert sec["platform_version"].startswith("hip ")
    assert set(sec["routes"]) >= {"native", "fallback", "control"}
    for route, n in sec["routes"].items():
        assert n == sum(r["count"] for r in sec["primitives"] if r["route"] == route)
    assert sec["fallbacks"] == [{"primitive": r["primitive"], "count": r["count"], "reason": r["reason"]}
                                for r in sec["primitives"] if r["route"] == "fallback"]
    assert all(f["reason"] for f in sec["fallbacks"])
    assert sec["routes"]["native"] > 0 and rep["costs"]["kernels"] > 0
    assert sec["counts"]["executions"] == 1 and sec["counts"]["host_loop_iterations"] == 0
    assert sec["counts"]["d2h_bytes"] >= 64 * 128 * 4 and sec["losses"] == []


def test_compose_jax_training_human_output():
    code, out, err = run("compose", "--framework", "jax", "--workload", "mlp-train", "--vendor", "xpu-like",
                         "--spec", "tiny")
    assert code == 0, err
    for text in ("jax front end (xpu, xpu-like on tiny): jaxpr equations by route", "scan x1",
                 "loop iterations (host-driven)", "training loss per step",
                 "numerics vs float64 reference"):
        assert text in out, text
    assert "torch front end" not in out


def test_compose_jax_failed_run_reports_what_ran():
    """A fault during the run: exit 1, the error in the report, and the jax section says what the
    run's client did until then."""
    code, out, _ = run("compose", "--framework", "jax", "--workload", "mlp", "--vendor", "cuda-like",
                       "--spec", "tiny", "--inject", "page_fault@1", "--json")
    assert code == 1
    rep = json.loads(out)
    (error,) = rep["errors"]
    assert error["kind"] == "memory_fault" and error["code"]["name"] == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert rep["numerics"] == []
    sec = rep["jax"]
    assert sec["counts"]["executions"] == 1 and sec["counts"]["h2d_bytes"] > 0
    assert sec["counts"]["d2h_bytes"] == 0 and sec["routes"]["native"] > 0


@pytest.mark.parametrize("args, fragment", [
    (["--framework", "jax", "--workload", "nope"],
     "unknown jax workload 'nope'; available: mlp, mlp-train, transformer-block"),
    (["--framework", "jax", "--workload", "conv-net"], "unknown jax workload 'conv-net'"),
    (["--framework", "jax", "--meta"], "--framework jax computes real values"),
    (["--framework", "nope"], "unknown framework 'nope'; available: graph, torch, jax"),
    (["--workload", "mlp-train"], "mlp-train is a torch and jax workload: add --framework torch or "
                                  "--framework jax"),
])
def test_compose_jax_bad_input_is_one_line_exit_2(args, fragment):
    code, out, err = run("compose", "--vendor", "cuda-like", *args)
    assert code == 2 and out == ""
    assert err.startswith("fornax: error: ") and err.count("\n") == 1 and fragment in err


def test_workloads_lists_jax():
    code, out, _ = run("workloads")
    assert code == 0
    jax_rows = [line for line in out.splitlines() if line.startswith("│ jax ")]
    assert [line.split("│")[2].strip() for line in jax_rows] == ["mlp", "mlp-train", "transformer-block"]


@pytest.mark.parametrize("args, needle", [
    (["compose", "--bogus"], "No such option '--bogus'"),
    (["nosuch"], "No such command 'nosuch'"),
    (["compose", "--devices", "abc"], "'abc' is not a valid integer"),
    (["cost", "gemm", "--m", "2"], "Missing option '--n'"),
    (["specs", "--json", "--bogus"], "No such option '--bogus'"),
    (["devices", "--vendor"], "requires an argument"),
])
def test_click_usage_errors_are_one_line_exit_2(args, needle):
    """click's own usage errors, from any subcommand, end like every fornax error: one line on
    stderr naming the help to read, exit 2, nothing on stdout."""
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.startswith("fornax: error: ") and needle in r.stderr and r.stderr.count("\n") == 1
    assert "--help)" in r.stderr


def test_usage_error_in_a_real_process():
    p = subprocess.run([sys.executable, "-m", "fornax.cli", "compose", "--bogus"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and p.stderr.count("\n") == 1
    assert p.stderr.startswith("fornax: error: No such option '--bogus'")
