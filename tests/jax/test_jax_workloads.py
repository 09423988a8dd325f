"""JAX workloads on fornax: numerics against float64 references (jax.jit x64 and the torch twin
run in float64 on the CPU), the training loss, agreement with the torch front end's runs, the
per-run route accounting, and the three vendor families."""

from __future__ import annotations

import copy

import jax
import numpy as np
import pytest
import torch

import fornax.frameworks.jax as fj
from fornax.layers.errors import ConfigError
from fornax.scenarios import jax_workloads as jw
from fornax.scenarios import torch_workloads as tw
from fornax.stack import compose, make_config

#: small shapes: every kernel really executes in the simulator
SMALL = {
    "mlp": dict(batch=8, d_in=32, hidden=64, d_out=16),
    "mlp-train": dict(batch=8, d_in=32, hidden=64, d_out=16, steps=4),
    "transformer-block": dict(batch=2, seq=8, d_model=16, heads=2, d_ff=32),
}
TORCH_BUILD = {"mlp": tw.mlp, "mlp-train": tw.mlp_train, "transformer-block": tw.transformer_block}


@pytest.fixture(scope="module")
def cuda_stack():
    return compose(make_config("cuda-like", spec="tiny"))


def _rel(got, ref) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _torch_float64(name: str, seed: int) -> dict[str, np.ndarray]:
    """The torch twin's program run in float64 on the CPU: an independent implementation."""
    prog = TORCH_BUILD[name](seed, **SMALL[name])
    out, _ = prog.step(copy.deepcopy(prog.model).double(), tuple(x.double() for x in prog.inputs))
    return {k: v.detach().numpy() for k, v in out.items()}


def _equations(closed) -> int:
    """Equations of a jaxpr with calls inlined and a scan's body counted inside it (the
    program builder records each: a primitive as native/fallback, a scan as control)."""
    n = 0
    for eqn in closed.jaxpr.eqns:
        inner = eqn.params.get("jaxpr") if eqn.primitive.name in ("pjit", "jit", "scan") else \
            eqn.params.get("call_jaxpr")
        if inner is not None:
            n += _equations(inner) + (eqn.primitive.name == "scan")
        else:
            n += 1
    return n


@pytest.mark.parametrize("name", list(jw.WORKLOADS))
def test_workload_matches_float64_references(name, cuda_stack):
    run = jw.run(name, cuda_stack, seed=1, **SMALL[name])
    assert run.ok and [n["output"] for n in run.numerics] == sorted(run.outputs) == sorted(run.reference)
    torch64 = _torch_float64(name, 1)
    assert sorted(torch64) == sorted(run.outputs)
    for n in run.numerics:
        key = n["output"]
        got, ref = run.outputs[key], run.reference[key]
        assert got.dtype == np.float32 and ref.dtype == np.float64 and got.shape == ref.shape
        assert n["max_rel_err"] == pytest.approx(_rel(got, ref), rel=1e-6, abs=1e-12)
        assert n["max_rel_err"] <= n["tol"] == 1e-4
        # the JAX program is the torch program: same weights, inputs and computation
        assert _rel(ref, torch64[key]) < 1e-10, key
        assert _rel(got, torch64[key]) < 1e-4, key
    assert run.stack == "cuda-like on tiny" and run.platform == "cuda"
    assert run.host_wall_s > 0 and run.reference_wall_s > 0


def test_training_loss_falls(cuda_stack):
    run = jw.run("mlp-train", cuda_stack, seed=2, **SMALL["mlp-train"])
    assert len(run.losses) == 4
    assert all(b < a for a, b in zip(run.losses, run.losses[1:])), run.losses
    assert run.losses[-1] < 0.95 * run.losses[0]
    np.testing.assert_allclose(run.losses, run.reference_losses, rtol=1e-5)
    torch_losses = _torch_float64("mlp-train", 2)["loss"]
    np.testing.assert_allclose(run.losses, torch_losses, rtol=1e-5)
    # the steps are one scan driven from the host: one control equation, one iteration per step
    assert {"primitive": "scan", "route": "control", "count": 1, "reason": ""} in run.routes["primitives"]
    assert run.routes["counts"]["host_loop_iterations"] == 4


@pytest.mark.parametrize("name", ["mlp", "transformer-block"])
def test_jax_and_torch_front_ends_agree(name, cuda_stack):
    jrun = jw.run(name, cuda_stack, seed=4, **SMALL[name])
    trun = tw.run(name, cuda_stack, seed=4, **SMALL[name])
    assert jrun.ok and trun.ok
    ty = trun.outputs["y"].numpy()
    assert jrun.outputs["y"].shape == ty.shape and jrun.outputs["y"].dtype == ty.dtype == np.float32
    assert _rel(jrun.outputs["y"], ty) < 1e-4


@pytest.mark.parametrize("vendor, platform", [("cuda-like", "cuda"), ("rocm-like", "rocm"),
                                              ("xpu-like", "xpu")])
def test_mlp_on_each_vendor(vendor, platform):
    client = fj.Client(compose(make_config(vendor, spec="tiny")), "test")
    run = jw.run("mlp", client, seed=3, **SMALL["mlp"])
    assert run.ok and run.stack == f"{vendor} on tiny" and run.platform == platform
    assert _rel(run.outputs["y"], _torch_float64("mlp", 3)["y"]) < 1e-4
    # every equation of the jaxpr is accounted for once, on the device or on the host
    prog = jw.mlp(3, **SMALL["mlp"])
    closed = jax.make_jaxpr(prog.fn)(prog.params, *prog.inputs)
    r = run.routes
    assert r["totals"]["native"] + r["totals"]["fallback"] == _equations(closed)
    assert r["totals"]["control"] == 0
    assert all(f["reason"] for f in r["fallbacks"])
    c = r["counts"]
    assert c["executions"] == 1
    # the MLP's primitives (dot_general, add, max, ...) have device lowerings: compiled kernels ran
    assert r["totals"]["native"] > 0 and c["segments_run"] >= 1
    nbytes = sum(a.nbytes for a in (*prog.params.values(), *prog.inputs))
    assert c["h2d_bytes"] >= nbytes and c["d2h_bytes"] >= run.outputs["y"].nbytes
    # the run left no buffer of its own behind (arguments, results, constants freed)
    assert client.live_buffers() == 0 and client.live_bytes() == 0


def test_routes_cover_one_run_only(cuda_stack):
    client = fj.Client(cuda_stack, "test")
    first = jw.run("mlp", client, **SMALL["mlp"])
    second = jw.run("mlp", client, **SMALL["mlp"])
    assert first.routes == second.routes and first.routes["primitives"]
    recorded = {(r["primitive"], r["route"]): r["count"] for r in client.report()["primitives"]}
    for row in first.routes["primitives"]:
        assert recorded[(row["primitive"], row["route"])] == 2 * row["count"]
    assert client.report()["executions"] == 2


def test_delta_keeps_reasons_and_drops_unchanged_rows():
    before = {"primitives": [{"primitive": "sin", "route": "fallback", "count": 2, "reason": "why"},
                             {"primitive": "add", "route": "native", "count": 3, "reason": ""}],
              "executions": 1, "h2d_bytes": 10}
    after = {"primitives": [{"primitive": "sin", "route": "fallback", "count": 5, "reason": "why"},
                            {"primitive": "add", "route": "native", "count": 3, "reason": ""},
                            {"primitive": "while", "route": "control", "count": 1, "reason": ""}],
             "executions": 2, "h2d_bytes": 30, "host_loop_iterations": 7}
    d = jw.route_delta(before, after)
    assert d["primitives"] == [{"primitive": "sin", "route": "fallback", "count": 3, "reason": "why"},
                               {"primitive": "while", "route": "control", "count": 1, "reason": ""}]
    assert d["totals"] == {"native": 0, "fallback": 3, "control": 1}
    assert d["fallbacks"] == d["primitives"][:1]
    assert d["counts"]["executions"] == 1 and d["counts"]["h2d_bytes"] == 20
    assert d["counts"]["host_loop_iterations"] == 7 and d["counts"]["segments_run"] == 0


def test_bad_input_is_a_config_error(cuda_stack):
    with pytest.raises(ConfigError, match="unknown jax workload 'conv-net'; available: mlp, mlp-train, "
                                          "transformer-block"):
        jw.run("conv-net", cuda_stack)
    with pytest.raises(ConfigError, match="jax workload mlp has no parameter width; it takes batch"):
        jw.run("mlp", cuda_stack, width=3)
    with pytest.raises(ConfigError, match="steps must be at least 2"):
        jw.run("mlp-train", cuda_stack, steps=1)
    with pytest.raises(ConfigError, match="shape-only"):
        jw.run("mlp", compose(make_config("cuda-like", spec="tiny", meta=True)))


def test_torch_state_is_untouched():
    """Building a workload draws torch's initialisation from its own seed only."""
    state = torch.random.get_rng_state()
    a = jw.transformer_block(7, **SMALL["transformer-block"])
    b = jw.transformer_block(7, **SMALL["transformer-block"])
    assert torch.equal(torch.random.get_rng_state(), state)
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
    assert a.params["qkv.weight"].dtype == np.float32 and a.params["qkv.weight"].shape == (48, 16)
