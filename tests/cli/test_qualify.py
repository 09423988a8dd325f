"""`fornax qualify`: the support contract, levels L0-L7, each with evidence.

One full qualification (xpu-like) runs once for the module; the other families and the
broken stacks are checked on single levels.  Every --json document is validated against
its schema; expectations come from the families' published faces and from the evidence
rows' own raw data (never from the verdict the code under test computes for itself).
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import fornax.frameworks.torch as ft
from fornax import qualify as Q
from fornax.cli.main import main
from fornax.frameworks.jax import RULES
from fornax.frameworks.torch import lowering as TL
from fornax.frameworks.torch.opinfo import TOP_OPS
from fornax.schemas import validate
from fornax.sim.faults import FaultPlan, FaultSpec
from fornax.stack import compose, make_config

LEVELS = [f"L{i}" for i in range(8)]


def run(*args):
    result = CliRunner().invoke(main, ["qualify", *args])
    return result.exit_code, result.stdout, result.stderr


def doc_of(out: str) -> dict:
    doc = json.loads(out)
    validate(doc)
    return doc


def evidence(doc: dict, check: str) -> dict:
    return next(e for lv in doc["levels"] for e in lv["evidence"] if e["check"] == check)


#: the real-client evidence narrowed to one OpInfo, ModuleInfo, OptimInfo, model and JAX
#: program: these tests check its wiring (rows, verdict, JSON); the whole sets run in
#: tests/pytorch, tests/torch/test_hf_zoo.py and tests/jax/test_ecosystem.py
NARROW = {"SUITE_ONLY": ("mul", "nn.Linear", "SGD"), "ZOO_MODELS": ("gpt2",), "JAX_PROGRAMS": ("cnn",)}


@pytest.fixture(scope="module", autouse=True)
def narrow():
    from fornax import qualify_clients as QC
    with pytest.MonkeyPatch.context() as mp:
        for name, value in NARROW.items():
            mp.setattr(QC, name, value)
        yield


@pytest.fixture(scope="module")
def full(narrow):
    """``fornax qualify --vendor xpu-like --json``, once, in this process."""
    code, out, err = run("--vendor", "xpu-like", "--json")
    return code, doc_of(out), err


# -- the full qualification ------------------------------------------------------------------------
def test_full_run_lists_every_level_with_evidence(full):
    code, doc, err = full
    assert code == 0, err
    assert doc["schema"] == "fornax.qualify/1"
    assert [lv["level"] for lv in doc["levels"]] == LEVELS
    assert doc["levels_run"] == LEVELS
    for lv in doc["levels"]:
        assert lv["evidence"], lv["level"]
        assert lv["status"] == "pass", [e["detail"] for e in lv["evidence"] if not e["passed"]]
        assert lv["evidence_total"] == len(lv["evidence"]) == lv["evidence_passed"]
        assert all(e["check"].startswith(lv["level"] + ".") for e in lv["evidence"])
    assert doc["verdict"] == "L7" and doc["passed"] is True and doc["full"] is False
    assert doc["stack"] == "xpu-like on h200-like"
    assert "up to L7" in doc["verdict_text"]


def test_real_client_evidence_rows(full):
    _, doc, _ = full
    for check in ("L2.opinfo_suite", "L3.moduleinfo", "L5.optiminfo"):
        e = evidence(doc, check)
        assert e["passed"] and e["cases"], e
        for c in e["cases"]:
            assert c["run"] == c["passed"] + c["failed"] + c["known"] > 0 and c["rate"] >= c["target"]
        assert "narrowed to mul, nn.Linear, SGD" in e["detail"]
    ops = {c["group"] for c in evidence(doc, "L2.opinfo_suite")["cases"]}
    assert {"float32", "float32.backward", "int64"} <= ops
    for check, modes in (("L3.zoo_backward", {"eager"}), ("L4.zoo_compile", {"compile"}),
                         ("L5.zoo_training", {"train", "generate"})):
        e = evidence(doc, check)
        (case,) = e["cases"]
        assert case["model"] == "gpt2" and case["ok"] and set(case["modes"]) == modes, case
        assert all(m["ok"] and m["max_error"] is not None for m in case["modes"].values())
    (prog,) = evidence(doc, "L4.jax_ecosystem")["cases"]
    assert prog["program"] == "cnn" and prog["ok"] and prog["fallbacks"] == [], evidence(doc, "L4.jax_ecosystem")["detail"]
    assert "import torch registers fornax" in evidence(doc, "L0.packaging")["detail"]
    prof = evidence(doc, "L7.profiling")
    assert prof["passed"] and prof["value"] > 0 and "aten::addmm" in prof["detail"]


def _meets(e: dict) -> bool:
    v, lim = e["value"], e["limit"]
    return {"<=": v <= lim, ">=": v >= lim, "==": v == lim}[e["relation"]]


def test_every_evidence_row_is_complete_and_its_value_meets_its_limit(full):
    _, doc, _ = full
    versions = (metadata.version("torch"), metadata.version("jax"))
    for lv in doc["levels"]:
        for e in lv["evidence"]:
            assert e["build"].startswith("xpu-like on h200-like")
            assert all(f" {v}" in e["build"] for v in versions)
            assert e["vendor"] == "xpu-like" and e["detail"] and e["measured"] and e["error"] is None
            if isinstance(e["limit"], (int, float)) and isinstance(e["value"], (int, float)):
                assert _meets(e), e
    # numeric errors are real measurements: small, but not a constant zero
    for check in ("L3.mlp", "L3.cnn", "L4.torch_compile", "L4.jax_jit", "L5.float32"):
        e = evidence(doc, check)
        assert 0 < e["value"] <= 1e-5 and e["dtype"] == "float32" and e["shape"], e
    assert evidence(doc, "L6.all_reduce")["build"].startswith("xpu-like on h200-like x 2 devices")


def test_opinfo_rate_names_the_ops_and_states_the_threshold(full):
    _, doc, _ = full
    e = evidence(doc, "L2.opinfo")
    cases = e["cases"]
    assert [c["name"] for c in cases] == list(Q.OPINFO_OPS) and len(cases) == 20
    assert set(Q.OPINFO_OPS) <= set(TOP_OPS)
    run_, ok = sum(c["samples"] for c in cases), sum(c["passed"] for c in cases)
    assert all(1 <= c["samples"] <= Q.OPINFO_SAMPLES for c in cases)
    assert e["value"] == pytest.approx(ok / run_, abs=1e-4)
    assert e["limit"] == doc["opinfo_threshold"] == 0.95 and e["relation"] == ">="
    assert f"{ok}/{run_} samples" in e["detail"]


def test_family_vocabulary_and_vendor_codes_of_xpu_like(full):
    _, doc, _ = full
    assert "torch.xpu face" in evidence(doc, "L0.torch")["detail"]
    num, den = evidence(doc, "L0.torch")["value"].split("/")
    assert num == den and int(num) > 5
    assert "platform 'xpu'" in evidence(doc, "L0.jax")["detail"]
    assert evidence(doc, "L6.dist_backend")["value"] == "xccl"
    # Level-Zero-style hex codes from the driver, a sycl::errc from the runtime
    fault = evidence(doc, "L7.fault")
    assert fault["value"].startswith("ZE_RESULT_ERROR_") and "(0x" in fault["value"]
    assert evidence(doc, "L7.oom")["value"].startswith("memory_allocation")
    auto = evidence(doc, "L5.autocast")
    assert "ran in float16" in auto["detail"]       # torch.get_autocast_dtype("xpu") in torch 2.x


def test_the_stack_under_test_stays_active_and_usable(full):
    assert ft.current().describe() == "xpu-like on h200-like"
    x = torch.randn(5, 7)
    torch.testing.assert_close((x.to("fornax") @ x.T.to("fornax")).cpu(), x @ x.T)
    assert torch.fornax.face()["device_type"] == "xpu"


# -- broken stacks fail the right level -----------------------------------------------------------
def _suite_passes(monkeypatch):
    """PyTorch's suite runs in a fresh process, where a test's monkeypatch does not reach: a
    test that breaks a lowering in this process gives the suite's evidence a passing result
    instead of waiting for a run that cannot see the break."""
    from fornax.contracts.torch_suite.result import SuiteResult
    from fornax.qualify import clients

    def passing(s, kind):
        r = SuiteResult(vendor="rocm-like", full=False)
        r.add({"kind": kind, "name": "x", "dtype": "float32" if kind == "ops" else "all", "variant": "",
               "outcome": "passed", "run": 1, "passed": 1, "failed": 0, "errors": []})
        return r
    monkeypatch.setattr(clients, "suite_result", passing)


def test_a_wrong_lowering_fails_l2_and_drops_the_verdict(monkeypatch):
    # exp computed as sin: 2 of the 58 samples fail, the rate stays above 95 % and L2 passes,
    # the failing op is still named
    _suite_passes(monkeypatch)
    monkeypatch.setitem(TL._TABLE, "aten::exp.default", TL._TABLE["aten::sin.default"])
    q = Q.qualify(make_config("rocm-like"), ["L2"])
    e = next(e for e in q.levels[2].evidence if e.clause.id == "opinfo")
    exp = next(c for c in e.cases if c["name"] == "exp")
    assert exp["passed"] < exp["samples"] and "exp" in e.detail
    assert e.value >= 0.95 and e.passed
    # sigmoid computed as sin as well: below the threshold, L2 fails, the verdict is L1
    monkeypatch.setitem(TL._TABLE, "aten::sigmoid.default", TL._TABLE["aten::sin.default"])
    code, out, _ = run("--vendor", "rocm-like", "--level", "L0", "--level", "L1", "--level", "L2",
                       "--json")
    doc = doc_of(out)
    assert code == 1
    assert [lv["status"] for lv in doc["levels"][:3]] == ["pass", "pass", "fail"]
    e = evidence(doc, "L2.opinfo")
    cases = {c["name"]: c for c in e["cases"]}
    assert {n for n, c in cases.items() if c["passed"] < c["samples"]} == {"exp", "sigmoid"}
    assert e["value"] == pytest.approx(sum(c["passed"] for c in cases.values())
                                       / sum(c["samples"] for c in cases.values()), abs=1e-4)
    assert e["value"] < 0.95 and e["passed"] is False
    assert doc["verdict"] == "L1" and doc["passed"] is False


def test_a_wrong_jax_rule_fails_l4_only(monkeypatch):
    monkeypatch.setitem(RULES, "tanh", RULES["sin"])
    q = Q.qualify(make_config("cuda-like"), ["L4"])
    assert q.exit_code == 1 and q.levels[4].status == "fail"
    by = {e.clause.id: e for e in q.levels[4].evidence}
    assert by["torch_compile"].passed
    assert not by["jax_jit"].passed and by["jax_jit"].value > 1e-2
    assert [lr.status for lr in q.levels if lr.level.id != "L4"] == ["not run"] * 7
    assert q.verdict is None and "fail: L4" in q.verdict_text


def test_a_stack_with_an_injected_fault_stops_at_l0():
    stack = compose(make_config("cuda-like"))
    for d in stack.devices:
        d.inject(FaultPlan((FaultSpec("ecc_uncorrectable", probability=1.0),)))
    try:
        q = Q.qualify(stack, ["L0", "L1"])
    finally:
        ft.use_stack("cuda-like")
    assert q.levels[0].status == "pass" and q.levels[1].status == "fail"
    assert q.verdict == "L0" and q.exit_code == 1
    views = next(e for e in q.levels[1].evidence if e.clause.id == "views")
    assert not views.passed and "CUDA_ERROR_ECC_UNCORRECTABLE (214)" in views.detail


def test_a_check_that_raises_is_recorded_not_fatal(monkeypatch):
    from fornax.layers.library import LibraryBase

    def broken(self, devices=None, timeout_s=None):
        raise RuntimeError("communicator exploded")
    monkeypatch.setattr(LibraryBase, "communicator", broken)
    code, out, _ = run("--vendor", "cuda-like", "--level", "L6", "--json")
    doc = doc_of(out)
    assert code == 1
    ar, backend = evidence(doc, "L6.all_reduce"), evidence(doc, "L6.dist_backend")
    assert ar["passed"] is False and ar["error"] == "RuntimeError: communicator exploded"
    assert ar["value"] is None and "communicator exploded" in ar["detail"]
    assert backend["passed"] is True and backend["value"] == "nccl"
    assert doc["levels"][6]["status"] == "fail"


def test_a_stack_that_does_not_compose_fails_l0_with_the_reason(tmp_path):
    cfg = tmp_path / "mixed.toml"
    cfg.write_text('[stack]\nvendor = "cuda-like"\ntranslate = false\n[stack.seams]\n'
                   'compiler = "rocm-like"\n')
    code, out, _ = run("--stack", str(cfg), "--level", "L0", "--level", "L1", "--json")
    doc = doc_of(out)
    assert code == 1 and doc["verdict"] is None
    first = evidence(doc, "L0.driver")
    assert "FormatMismatchError" in first["error"] and "hsaco-like" in first["detail"]
    assert "did not compose (see L0.driver)" in evidence(doc, "L1.views")["detail"]


# -- the other families, cheaply -----------------------------------------------------------------
@pytest.mark.parametrize("vendor,face,code_api", [("cuda-like", "torch.cuda face", "cudaError"),
                                                   ("rocm-like", "torch.cuda face", "hipError")])
def test_other_families_l0_and_l7(vendor, face, code_api):
    q = Q.qualify(make_config(vendor), ["L0", "L7"])
    assert q.exit_code == 0, [e.detail for lr in q.levels for e in lr.evidence if not e.passed]
    by = {e.clause.ref: e for lr in q.levels for e in lr.evidence}
    assert face in by["L0.torch"].detail
    assert by["L7.oom"].value.startswith(code_api)
    assert ft.current().describe() == f"{vendor} on h200-like"


def test_human_table_shows_every_level():
    code, out, _ = run("--vendor", "cuda-like", "--level", "L6")
    assert code == 0
    for text in ("L0", "L7", "NOT RUN", "PASS", "all_reduce", "dist_backend", "nccl"):
        assert text in out
    assert "only L6 run" in out


# -- bad input --------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,needle", [
    ((), "exactly one of --vendor V or --stack FILE"),
    (("--vendor", "xpu-like", "--stack", "x.toml"), "exactly one of"),
    (("--vendor", "nonsense"), "unknown vendor 'nonsense'"),
    (("--vendor", "xpu-like", "--level", "L9"), "unknown level 'L9'"),
    (("--stack", "/nonexistent/stack.toml"), "does not exist"),
    (("--vendor", "xpu-like", "--bogus"), "No such option '--bogus' (see fornax qualify --help)"),
])
def test_usage_errors_exit_2_with_one_line(args, needle):
    code, out, err = run(*args)
    assert code == 2 and out == ""
    assert err.startswith("fornax: error: ") and err.count("\n") == 1 and needle in err, err


def test_a_meta_stack_is_refused(tmp_path):
    cfg = tmp_path / "meta.toml"
    cfg.write_text('[stack]\nvendor = "xpu-like"\nmeta = true\n')
    code, _, err = run("--stack", str(cfg))
    assert code == 2 and "shape-only" in err and err.count("\n") == 1


def test_subprocess_single_level_json():
    proc = subprocess.run([sys.executable, "-m", "fornax.cli", "qualify", "--vendor", "rocm-like",
                           "--level", "L1", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = doc_of(proc.stdout)
    assert doc["levels_run"] == ["L1"] and doc["levels"][1]["status"] == "pass"
    assert [lv["status"] for lv in doc["levels"]].count("not run") == 7
    rt = evidence(doc, "L1.roundtrip")
    assert rt["value"] == 0 and rt["vendor"] == "rocm-like" and "bfloat16" in rt["dtype"]


def test_normwise_error_is_measured_against_the_reference():
    ref = np.array([1.0, -2.0, 4.0])
    assert Q.normwise(ref, ref) == 0.0
    assert Q.normwise(ref + [0, 0, 0.04], ref) == pytest.approx(0.01)
    assert Q.normwise([1.0, np.nan, 4.0], ref) == float("inf")
    assert Q.normwise(ref[:2], ref) == float("inf")


def test_a_failing_real_model_lowers_the_verdict_and_names_the_tensor(monkeypatch):
    # the model's gelu computed as tanh on the device: gpt2 (gelu_new is tanh-based) still
    # builds, but its logits and gradients move; L3 fails and names the model and tensor
    monkeypatch.setitem(TL._TABLE, "aten::gelu.default", TL._TABLE["aten::tanh.default"])
    monkeypatch.setitem(TL._TABLE, "aten::tanh.default", TL._TABLE["aten::sin.default"])
    code, out, _ = run("--vendor", "cuda-like", "--level", "L3", "--json")
    doc = doc_of(out)
    e = evidence(doc, "L3.zoo_backward")
    assert code == 1 and e["passed"] is False and doc["levels"][3]["status"] == "fail"
    (case,) = e["cases"]
    eager = case["modes"]["eager"]
    assert case["model"] == "gpt2" and not eager["ok"]
    assert eager["worst_tensor"] and eager["worst_tensor"] in e["detail"] and "gpt2 eager" in e["detail"]


def test_the_suite_kinds_of_the_levels_run_together_and_each_level_reads_its_own(monkeypatch):
    """L2, L3 and L5 read the ops, modules and optims of PyTorch's suite: the qualification
    asks for the three at once (one subprocess for the sample), and each level's evidence
    counts only its own kind's failures and stale entries."""
    from fornax.contracts.torch_suite import runner
    from fornax.contracts.torch_suite.result import SuiteResult
    from fornax.qualify import clients
    calls = []

    def fake(vendor, *, full=False, kinds=(), only=(), **_):
        calls.append(tuple(kinds))
        r = SuiteResult(vendor=vendor, full=full)
        for kind, group in (("ops", "float32"), ("modules", "all"), ("optims", "all")):
            r.add({"event": "check", "kind": kind, "name": "x", "dtype": group, "variant": "",
                   "outcome": "passed", "run": 2, "passed": 2, "failed": 0, "errors": []})
        r.failures.append({"kind": "modules", "name": "nn.Broken", "dtype": "all", "variant": "",
                           "error": "wrong"})
        r.stale.append("optims:SGD:*:*")
        return r
    monkeypatch.setattr(runner, "run_suite", fake)
    monkeypatch.setattr(clients, "need", lambda *m: None)
    subject = Q.StackSubject(make_config("cuda-like"))
    subject.suite_kinds = tuple(clients.SUITE_KINDS[lv] for lv in ("L2", "L3", "L5"))
    ops, modules, optims = (clients.suite_outcome(subject, k) for k in ("ops", "modules", "optims"))
    assert calls == [("ops", "modules", "optims")]
    assert ops.passed and "nn.Broken" not in ops.detail
    assert not modules.passed and "nn.Broken" in modules.detail
    assert not optims.passed and "stale known-failure entries: optims:SGD" in optims.detail
