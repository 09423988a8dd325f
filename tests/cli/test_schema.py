"""Every ``--json`` document the fornax command prints matches the JSON Schema it names, and a
document that breaks its schema is refused with the path of the break."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner

from fornax import report as report_mod
from fornax.cli.main import main
from fornax.contracts.library import upload_ranks
from fornax.schemas import SchemaError, kinds, load, validate
from fornax.stack import compose, make_config
from helpers import FAMILIES

VENDORS = list(FAMILIES)


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def doc_of(*args, code: int = 0) -> dict:
    """The command's JSON document, validated against the schema it names."""
    got, out, err = run(*args)
    assert got == code, (out, err)
    doc = json.loads(out)
    validate(doc)
    return doc


@pytest.fixture(scope="module")
def mlp_report() -> dict:
    return doc_of("compose", "--vendor", "cuda-like", "--spec", "tiny", "--json")


def test_every_shipped_schema_is_a_draft_2020_12_schema_for_its_own_kind():
    assert {"report", "conform", "devices", "specs", "workloads"} <= set(kinds())
    for kind in kinds():
        schema = load(kind)
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["properties"]["schema"] == {"const": f"fornax.{kind}/1"}
        assert "schema" in schema["required"]


# ---- fornax compose: the run report --------------------------------------------------------------
@pytest.mark.parametrize("vendor", VENDORS)
def test_compose_graph_report_on_each_family(vendor):
    doc = doc_of("compose", "--vendor", vendor, "--spec", "tiny", "--json")
    assert doc["manifest"]["stack"] == dict.fromkeys(("framework", "compiler", "library", "runtime",
                                                      "driver"), vendor)
    assert doc["numerics"] and all(n["ok"] for n in doc["numerics"])
    assert "torch" not in doc and "jax" not in doc and "scenario" not in doc


def test_compose_meta_report():
    doc = doc_of("compose", "--vendor", "rocm-like", "--spec", "tiny", "--meta", "--json")
    assert doc["manifest"]["meta"] is True and doc["numerics"] == []
    assert doc["kernels"] and doc["costs"]["device_time_s"] > 0


def test_compose_scenario_report(monkeypatch):
    """The scenario section of llama70b-step, through the command, on a small model (the
    70B step itself takes too long for a test) over two devices."""
    from fornax.scenarios import workloads
    from fornax.scenarios.llm import LlamaConfig, simulate_step

    def small_step(stack, seed):
        cfg = LlamaConfig(layers=1, d_model=64, heads=4, kv_heads=2, ffn=128, vocab=50, seq=8,
                          tp=stack.config.devices)
        rep, _, result = simulate_step(stack=stack, seed=seed, cfg=cfg)
        return result, rep.to_dict()

    monkeypatch.setattr(workloads, "_llama_step", small_step)
    doc = doc_of("compose", "--vendor", "cuda-like", "--spec", "tiny", "--devices", "2", "--meta",
                 "--workload", "llama70b-step", "--json")
    sc = doc["scenario"]
    assert sc["devices"] == 2 and sc["all_reduces"] > 0 and sc["config"]["tp"] == 2
    assert sc["step_time_s"] > 0 and sc["fits"] is True


def test_compose_torch_report():
    doc = doc_of("compose", "--vendor", "cuda-like", "--spec", "tiny", "--framework", "torch",
                 "--workload", "mlp", "--json")
    assert doc["manifest"]["framework"] == "torch"
    assert doc["torch"]["routes"]["native"] > 0 and doc["torch"]["mode"] == "eager"


def test_compose_jax_report():
    doc = doc_of("compose", "--vendor", "xpu-like", "--spec", "tiny", "--framework", "jax",
                 "--workload", "mlp", "--json")
    assert doc["manifest"]["framework"] == "jax"
    assert doc["jax"]["routes"]["native"] > 0 and doc["jax"]["counts"]["executions"] >= 1


def test_compose_report_with_an_injected_fault_lists_the_error():
    doc = doc_of("compose", "--vendor", "xpu-like", "--spec", "tiny", "--inject", "page_fault@1",
                 "--json", code=1)
    (err,) = doc["errors"]
    assert err["seam"] == "driver" and err["vendor"] == "xpu-like"
    assert err["code"]["api"] == "ze_result_t" and isinstance(err["code"]["value"], int)
    assert doc["numerics"] == []


def test_compose_report_with_a_trace(tmp_path):
    path = tmp_path / "run.trace.json"
    doc = doc_of("compose", "--vendor", "rocm-like", "--spec", "tiny", "--trace", str(path), "--json")
    trace = json.loads(path.read_text())
    # each packet is drawn on its engine's track and on its queue's: names once per track
    kernels = [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    assert sorted(kernels) == sorted(2 * [k["name"] for k in doc["kernels"]])


def test_races_and_collectives_in_a_hand_made_report():
    """The two row kinds a plain workload leaves empty: a data race (a copy in and a copy out
    of one buffer on two unordered queues) and an executed all-reduce over two devices."""
    stack = compose(make_config("cuda-like", spec="tiny", devices=2))
    drv, ctx = stack.driver, stack.runtime.context()
    qa, qb = drv.create_queue(ctx), drv.create_queue(ctx)
    buf = drv.allocate(ctx, 256)
    qa.copy_h2d(buf, np.ones(64, np.float32))
    qb.copy_d2h(np.zeros(64, np.float32), buf)
    qa.synchronize()
    qb.synchronize()
    comm = stack.communicator()
    xs = [np.full(16, r + 1, np.float32) for r in range(2)]
    send = upload_ranks(comm, xs)
    recv = [comm.malloc(r, 64) for r in range(2)]
    for r in range(2):
        comm.rank(r).all_reduce(send[r], recv[r], 16, "float32", "sum")
    np.testing.assert_array_equal(comm.download(0, recv[0], 16, "float32"), np.full(16, 3.0))
    rep = json.loads(json.dumps(report_mod.build(stack, "hand-made")))
    validate(rep)
    assert rep["races"] and rep["races"][0]["kind"] == "read-write"
    assert rep["seams"]["library"]["collectives"][0]["op"] == "all_reduce"


# ---- the other commands -------------------------------------------------------------------------
def test_conform_document():
    doc = doc_of("conform", "runtime", "--vendor", "rocm-like", "--json")
    assert doc["seam"] == "runtime" and doc["failed"] == 0
    assert doc["passed"] == len(doc["clauses"]) and all(c["id"].startswith("R") for c in doc["clauses"])


def test_specs_and_workloads_documents():
    from fornax.sim.spec import available_specs, load_spec
    every = doc_of("specs", "--json")
    assert [s["name"] for s in every["specs"]] == available_specs()
    (tiny,) = doc_of("specs", "tiny", "--json")["specs"]
    spec = load_spec("tiny")
    assert tiny["hbm_bytes"] == spec.hbm_bytes and tiny["max_grid"] == list(spec.max_grid)
    assert tiny["power"] == spec.power
    rows = doc_of("workloads", "--json")["workloads"]
    by = {(r["framework"], r["name"]): r for r in rows}
    assert by[("graph", "llama70b-step")]["meta_only"] and by[("graph", "llama70b-step")]["scenario"]
    assert by[("graph", "mlp")]["default"] and not by[("graph", "mlp")]["meta_only"]
    assert {"graph", "torch", "jax", "max"} == {r["framework"] for r in rows}
    assert sum(r["default"] for r in rows) == 4          # one default per front end


def test_unknown_spec_is_one_line_and_exit_2():
    code, out, err = run("specs", "no-such-chip", "--json")
    assert code == 2 and out == ""
    assert err.startswith("fornax: error: unknown chip spec 'no-such-chip'") and err.count("\n") == 1


def test_devices_document():
    doc = doc_of("devices", "--vendor", "rocm-like", "--spec", "tiny", "--devices", "2", "--json")
    assert [d["index"] for d in doc["devices"]] == [0, 1] and doc["tool"] == "rocm-smi-like"


def test_a_document_from_a_subprocess_validates():
    out = subprocess.run([sys.executable, "-m", "fornax.cli", "specs", "h200-like", "--json"], check=False,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    validate(doc)
    assert doc["specs"][0]["compute_units"] == 132


# ---- documents that break their schema ----------------------------------------------------------
def refused(doc: dict) -> str:
    with pytest.raises(SchemaError) as info:
        validate(doc)
    return str(info.value)


def test_a_missing_required_key_is_named_with_its_path(mlp_report):
    doc = copy.deepcopy(mlp_report)
    del doc["costs"]["device_time_s"]
    msg = refused(doc)
    assert "fornax.report/1: at costs:" in msg and "'device_time_s' is a required property" in msg
    doc = copy.deepcopy(mlp_report)
    del doc["seams"]["driver"]["api"]
    assert "at seams/driver:" in refused(doc)
    doc = copy.deepcopy(mlp_report)
    del doc["races"]
    assert "'races' is a required property" in refused(doc)


def test_a_wrong_type_is_named_with_its_path(mlp_report):
    doc = copy.deepcopy(mlp_report)
    doc["kernels"][0]["grid"] = "8x1x1"
    assert "at kernels/0/grid:" in refused(doc)
    doc = copy.deepcopy(mlp_report)
    doc["numerics"][0]["ok"] = "yes"
    assert "at numerics/0/ok:" in refused(doc)
    doc = copy.deepcopy(mlp_report)
    doc["manifest"]["framework"] = "tensorflow"
    assert "at manifest/framework:" in refused(doc)
    doc = copy.deepcopy(mlp_report)
    doc["errors"] = [{"kind": "hang", "message": "m", "seam": "driver", "vendor": "cuda-like",
                      "op": "cuStreamSynchronize", "hint": None, "address": None,
                      "code": {"api": "CUresult", "name": "CUDA_ERROR_LAUNCH_FAILED", "value": "719"}}]
    assert "at errors/0/code:" in refused(doc)


def test_unknown_keys_are_refused_outside_the_seams_and_allowed_inside(mlp_report):
    doc = copy.deepcopy(mlp_report)
    doc["costs"]["bogus_s"] = 1.0
    assert "at costs:" in refused(doc) and "bogus_s" in refused(doc)
    doc = copy.deepcopy(mlp_report)
    doc["extra"] = {}
    assert "at (top level):" in refused(doc)
    doc = copy.deepcopy(mlp_report)
    doc["seams"]["driver"]["my_family_counter"] = 3        # a family's own counter
    validate(doc)


def test_a_document_naming_another_version_or_none_is_refused(mlp_report):
    doc = copy.deepcopy(mlp_report)
    doc["schema"] = "fornax.report/2"
    assert "is not the shipped 'fornax.report/1'" in refused(doc)
    doc.pop("schema")
    assert "names no fornax schema" in refused(doc)


def test_the_other_kinds_refuse_broken_documents():
    conform = doc_of("conform", "driver", "--vendor", "cuda-like", "--json")
    conform["clauses"][0]["passed"] = "yes"
    assert "fornax.conform/1: at clauses/0/passed:" in refused(conform)
    devices = doc_of("devices", "--vendor", "cuda-like", "--spec", "tiny", "--json")
    devices["devices"][0]["utilization_pct"] = 150.0
    assert "at devices/0/utilization_pct:" in refused(devices)
    specs = doc_of("specs", "tiny", "--json")
    del specs["specs"][0]["power"]["static_w"]
    assert "at specs/0/power:" in refused(specs)
