"""torch.nn workloads on the fornax device: numerics against CPU runs, training losses, the
per-run route accounting, and ``fornax compose --framework torch``."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import fornax.frameworks.torch as ft
from fornax.cli.main import main
from fornax.scenarios import torch_workloads as tw
from fornax.scenarios.workloads import mlp as graph_mlp
from fornax.stack import compose, make_config

#: small shapes: every kernel really executes in the simulator
SMALL = {
    "mlp": dict(batch=8, d_in=32, hidden=64, d_out=16),
    "mlp-train": dict(batch=8, d_in=32, hidden=64, d_out=16, steps=4),
    "transformer-block": dict(batch=2, seq=8, d_model=16, heads=2, d_ff=32),
    "conv-net": dict(batch=4, channels=3, size=6, width=3, classes=5),
}


@pytest.fixture(scope="module")
def cuda_stack():
    return compose(make_config("cuda-like", spec="tiny"))


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    return float((got - ref).abs().max() / ref.abs().max())


def cli(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("name", list(tw.WORKLOADS))
def test_workload_matches_cpu(name, cuda_stack):
    """Every output within its tolerance of the float64 CPU run, and (independently of the
    module's own numerics) close to a float32 CPU eager run of the same program."""
    run = tw.run(name, cuda_stack, seed=1, **SMALL[name])
    assert run.ok and run.numerics, run.numerics
    assert [n["output"] for n in run.numerics] == list(run.outputs)
    for n in run.numerics:
        ref = run.reference[n["output"]]
        assert n["max_rel_err"] == pytest.approx(_rel(run.outputs[n["output"]], ref), rel=1e-6, abs=1e-12)
        assert n["max_rel_err"] <= n["tol"] == 1e-4
    prog = tw.WORKLOADS[name].build(1, **SMALL[name])
    cpu32, _ = prog.step(copy.deepcopy(prog.model), prog.inputs)
    for key, want in cpu32.items():
        assert run.outputs[key].dtype == torch.float32 and run.outputs[key].shape == want.shape
        assert _rel(run.outputs[key], want.detach()) < 1e-4, key
    assert run.routes["totals"]["native"] > 0 and run.host_wall_s > 0
    assert run.stack == "cuda-like on tiny"


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_training_loss_falls_and_matches_cpu(optimizer, cuda_stack):
    run = tw.run("mlp-train", cuda_stack, seed=2, optimizer=optimizer, **SMALL["mlp-train"])
    assert len(run.losses) == 4
    assert all(b < a for a, b in zip(run.losses, run.losses[1:])), run.losses
    assert run.losses[-1] < 0.95 * run.losses[0]
    np.testing.assert_allclose(run.losses, run.reference_losses, rtol=1e-5)
    assert run.ok, run.numerics
    # backward and optimizer ops really went through the device
    ops = {r["op"].split(".")[0] for r in run.routes["ops"]}       # any overload (out= included)
    assert "aten::threshold_backward" in ops and "aten::mse_loss_backward" in ops


def test_torch_mlp_is_the_graph_mlp():
    """Same seed, same numbers: the torch mlp's float64 reference equals the graph workload's."""
    shape = SMALL["mlp"]
    prog = tw.mlp(5, **shape)
    ref, _ = prog.step(copy.deepcopy(prog.model).double(), (prog.inputs[0].double(),))
    graph, feeds = graph_mlp(5, **shape)
    (want,) = graph.reference(feeds)
    np.testing.assert_allclose(ref["y"].numpy(), want, rtol=1e-12, atol=1e-12)


def test_routes_cover_one_run_only(cuda_stack):
    """Two runs on one session: each run's accounting is its own, the session has both."""
    first = tw.run("mlp", cuda_stack, **SMALL["mlp"])
    session_id = ft.current().id
    second = tw.run("mlp", None, **SMALL["mlp"])           # the active session again
    assert ft.current().id == session_id
    assert second.routes["ops"] == first.routes["ops"] and first.routes["ops"]
    session = {(r["op"], r["route"]): r["count"] for r in ft.report()["ops"]}
    for r in first.routes["ops"]:
        assert session[(r["op"], r["route"])] == 2 * r["count"]


def test_bad_parameters_are_config_errors(cuda_stack):
    from fornax.layers.errors import ConfigError
    with pytest.raises(ConfigError, match="no parameter width"):
        tw.run("mlp", cuda_stack, width=3)
    with pytest.raises(ConfigError, match="unknown torch mode 'compiled'"):
        tw.run("mlp", cuda_stack, mode="compiled")
    with pytest.raises(ConfigError, match="unknown optimizer 'lbfgs'"):
        tw.run("mlp-train", cuda_stack, optimizer="lbfgs")
    with pytest.raises(ConfigError, match="shape-only"):
        tw.run("mlp", compose(make_config("cuda-like", spec="tiny", meta=True)))


def _session_fallbacks() -> list[dict]:
    return [{"op": r["op"], "count": r["count"], "reason": r["reason"]} for r in ft.report()["fallbacks"]]


def test_cli_torch_mlp_json():
    code, out, err = cli("compose", "--framework", "torch", "--workload", "mlp", "--vendor", "rocm-like",
                         "--spec", "tiny", "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["schema"] == "fornax.report/1"
    assert rep["manifest"]["framework"] == "torch" and rep["manifest"]["workload"] == "mlp"
    assert rep["manifest"]["stack"]["driver"] == "rocm-like"
    assert [n["output"] for n in rep["numerics"]] == ["y"] and rep["numerics"][0]["ok"]
    sec = rep["torch"]
    assert sec["mode"] == "eager" and sec["stack"] == "rocm-like on tiny"
    assert set(sec["routes"]) >= {"native", "decomposed", "fallback", "view"}
    # the CLI ran in a fresh front-end session: its accounting is the session's
    session = ft.report()
    assert session["stack"] == "rocm-like on tiny"
    assert sec["fallbacks"] == _session_fallbacks()
    assert {(r["op"], r["route"]): r["count"] for r in sec["ops"]} == \
        {(r["op"], r["route"]): r["count"] for r in session["ops"]}
    assert sec["routes"]["native"] == session["totals"]["native"] > 0
    assert {r["op"].split(".")[0] for r in sec["ops"] if r["route"] == "native"} >= \
        {"aten::addmm", "aten::relu"}
    assert rep["costs"]["kernels"] > 0 and rep["costs"]["device_time_s"] > 0
    assert sec["losses"] == [] and rep["errors"] == []


def test_cli_torch_conv_net_fallbacks_match_session():
    code, out, err = cli("compose", "--framework", "torch", "--workload", "conv-net", "--vendor",
                         "cuda-like", "--spec", "tiny", "--json")
    assert code == 0, err
    sec = json.loads(out)["torch"]
    assert sec["fallbacks"] == _session_fallbacks()
    assert sec["routes"]["fallback"] == sum(f["count"] for f in sec["fallbacks"])
    assert len(sec["losses"]) == 1 and sec["losses"][0] == pytest.approx(sec["reference_losses"][0], rel=1e-5)


def test_cli_torch_conv_net_human_output():
    """Library convolution choices (7 sizes, not a GEMM's 4) render in the seam tree."""
    code, out, err = cli("compose", "--framework", "torch", "--workload", "conv-net", "--vendor",
                         "rocm-like", "--spec", "tiny")
    assert code == 0, err
    assert "torch front end (eager, rocm-like on tiny)" in out
    assert "training loss per step" in out


def test_cli_torch_training_human_output():
    code, out, err = cli("compose", "--framework", "torch", "--workload", "mlp-train", "--vendor",
                         "xpu-like", "--spec", "tiny")
    assert code == 0, err
    assert "torch front end (eager, xpu-like on tiny)" in out
    assert "training loss per step" in out and "numerics vs float64 reference" in out


@pytest.mark.parametrize("args, fragment", [
    (["--framework", "torch", "--workload", "nope"],
     "unknown torch workload 'nope'; available: mlp, mlp-train, transformer-block, conv-net"),
    (["--framework", "nope"], "unknown framework 'nope'; available: graph, torch, jax"),
    (["--workload", "conv-net"], "conv-net is a torch workload: add --framework torch"),
    (["--framework", "torch", "--meta"], "shape-only (--meta) stack cannot back it"),
])
def test_cli_bad_input_is_one_line_exit_2(args, fragment):
    code, _, err = cli("compose", "--vendor", "cuda-like", *args)
    assert code == 2
    assert err.startswith("fornax: error: ") and err.count("\n") == 1 and fragment in err


def test_workloads_lists_both_kinds():
    code, out, _ = cli("workloads")
    assert code == 0
    for name in ("mlp-train", "conv-net", "llama70b-step", "softmax"):
        assert name in out
    assert "torch" in out and "graph" in out
