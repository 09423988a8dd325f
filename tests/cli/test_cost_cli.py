"""`fornax cost` and `fornax specs`: predictions as JSON or tables, one-line errors."""

import json

import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.schemas import validate
from fornax.sim.cost import gemm_cost
from fornax.sim.spec import load_spec


def run(*args):
    r = CliRunner().invoke(main, ["cost", *args])
    return r.exit_code, r.stdout, r.stderr


def cost_json(*args):
    """The command's JSON, checked against the shipped fornax.cost/1 schema."""
    code, out, err = run(*args, "--json")
    assert code == 0, err
    doc = json.loads(out)
    validate(doc)
    return doc


def test_gemm_json():
    rep = cost_json("gemm", "--m", "8192", "--n", "8192", "--k", "8192", "--dtype", "bf16",
                    "--spec", "h200-like")
    assert rep["flops"] == 2 * 8192 ** 3
    assert rep["tflops"] == pytest.approx(rep["flops"] / rep["time_s"] / 1e12)
    assert 702 <= rep["tflops"] <= 858                       # 780 TFLOP/s measured, +-10%
    assert rep["dtype"] == "bfloat16" and rep["tile"] == [128, 256, 64]
    assert rep["peak_tflops"] == 989.0


@pytest.mark.parametrize("alias, name", [("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32"),
                                         ("tf32", "tfloat32"), ("fp64", "float64"),
                                         ("fp8", "float8_e4m3fn")])
def test_dtype_aliases(alias, name):
    rep = cost_json("gemm", "--m", "512", "--n", "512", "--k", "512", "--dtype", alias, "--spec", "h100-like")
    assert rep["dtype"] == name
    assert rep["time_s"] == pytest.approx(gemm_cost(load_spec("h100-like"), 512, 512, 512, name).time_s)


def test_copy_json_by_hand():
    s = load_spec("mi300x-like")
    rep = cost_json("copy", "--bytes", "1GiB", "--kind", "h2d", "--spec", "mi300x-like")
    assert rep["time_s"] == pytest.approx(s.copy_latency_s + 2**30 / s.host_link_bandwidth)
    assert rep["gbps"] == pytest.approx(2**30 / rep["time_s"] / 1e9)
    d2d = cost_json("copy", "--bytes", "1000000000", "--kind", "d2d", "--spec", "mi300x-like")
    assert d2d["time_s"] == pytest.approx(s.copy_latency_s + 2e9 / (s.hbm_bandwidth * s.memory_efficiency))
    peer = cost_json("copy", "--bytes", "1GB", "--kind", "peer", "--spec", "mi300x-like")
    # the link's achievable rate: the datasheet figure at the spec's peer_link_efficiency
    assert peer["time_s"] == pytest.approx(s.peer_link_latency_s
                                           + 1e9 / (s.peer_link_bandwidth * s.peer_link_efficiency))


def test_allreduce_ring_on_a_switch_by_hand():
    s = load_spec("h200-like")
    n, nbytes = 8, 2**30
    rep = cost_json("allreduce", "--bytes", str(nbytes), "--devices", str(n), "--spec", "h200-like")
    expect = 2 * (n - 1) * s.peer_link_latency_s + 2 * (n - 1) / n * nbytes / s.peer_link_bandwidth
    assert rep["time_s"] == pytest.approx(expect)
    assert rep["gbps"] == pytest.approx(nbytes / expect / 1e9)
    tree = cost_json("allreduce", "--bytes", str(nbytes), "--devices", "8", "--algorithm", "tree")
    assert tree["time_s"] == pytest.approx(2 * 3 * (s.peer_link_latency_s + nbytes / s.peer_link_bandwidth))
    mesh = cost_json("allreduce", "--bytes", str(nbytes), "--devices", "8", "--topology", "mesh")
    # a ring on a full mesh is striped over N-1 channels, one per link: the whole port, as here
    assert mesh["time_s"] == pytest.approx(rep["time_s"])
    mesh_tree = cost_json("allreduce", "--bytes", str(nbytes), "--devices", "8", "--topology", "mesh",
                          "--algorithm", "tree")
    assert mesh_tree["time_s"] > tree["time_s"]                  # a tree step uses one link of B/7


def test_attention_json():
    full = cost_json("attention", "--batch", "2", "--heads", "8", "--seq", "2048", "--head-dim", "128")
    causal = cost_json("attention", "--batch", "2", "--heads", "8", "--seq", "2048", "--head-dim", "128",
                       "--causal", "--dtype", "fp16")
    assert full["flops"] == 4 * 2 * 8 * 2048 ** 2 * 128
    assert causal["flops"] == full["flops"] / 2 and causal["dtype"] == "float16"
    assert causal["time_s"] < full["time_s"]


def test_human_tables():
    code, out, _ = run("gemm", "--m", "1024", "--n", "1024", "--k", "1024", "--spec", "max1550-like")
    assert code == 0 and "TFLOP/s" in out and "max1550-like" in out
    code, out, _ = run("copy", "--bytes", "1GiB")
    assert code == 0 and "GB/s" in out


@pytest.mark.parametrize("args, fragment", [
    (["gemm", "--m", "0", "--n", "1", "--k", "1"], "--m"),
    (["gemm", "--m", "-4", "--n", "1", "--k", "1"], "--m"),
    (["gemm", "--m", "8", "--n", "8", "--k", "8", "--dtype", "fp7"], "fp7"),
    (["gemm", "--m", "8", "--n", "8", "--k", "8", "--spec", "no-such-chip"], "no-such-chip"),
    (["copy", "--bytes", "lots"], "--bytes"),
    (["copy", "--bytes", "10", "--kind", "sideways"], "sideways"),
    (["allreduce", "--bytes", "10", "--devices", "0"], "--devices"),
    (["allreduce", "--bytes", "10", "--devices", "4", "--topology", "torus"], "torus"),
    (["allreduce", "--bytes", "10", "--devices", "4", "--algorithm", "magic"], "magic"),
    (["attention", "--batch", "1", "--heads", "1", "--seq", "0", "--head-dim", "64"], "--seq"),
])
def test_bad_input_is_one_line_exit_2(args, fragment):
    code, out, err = run(*args)
    assert code == 2 and out == ""
    line = err.strip()
    assert "\n" not in line and line.startswith("fornax: error:") and fragment in line
    assert "Traceback" not in err


def test_specs_lists_and_shows_the_new_specs():
    r = CliRunner().invoke(main, ["specs"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    for name in ("h100-like", "h200-like", "mi300x-like", "max1550-like", "tiny"):
        assert name in r.stdout
    r = CliRunner().invoke(main, ["specs", "mi300x-like"])
    assert r.exit_code == 0 and "304" in r.stdout and "memory_latency_s" in r.stdout


def test_report_costs_carry_power_and_thermal():
    r = CliRunner().invoke(main, ["compose", "--vendor", "cuda-like", "--spec", "tiny", "--json"])
    assert r.exit_code == 0, r.stderr
    c = json.loads(r.stdout)["costs"]
    p = load_spec("tiny").power
    # static power over the run plus a positive dynamic part for the kernels and copies
    assert c["energy_j"] > p["static_w"] * c["device_time_s"] > 0
    assert c["avg_power_w"] == pytest.approx(c["energy_j"] / c["device_time_s"])
    assert c["throttled_s"] == 0.0 and c["peak_temp_c"] >= p["ambient_c"]
