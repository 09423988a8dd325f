"""`fornax matrix`: levels come only from stored fornax.qualify/1 documents (per dtype, the
rows that apply), everything else is "not qualified", and nothing is run."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from fornax.cli.matrix import matrix
from fornax.qualify.levels import LEVELS
from fornax.release import ecosystem
from fornax.schemas import validate


def cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(click.Group(commands={"matrix": matrix}), ["matrix", *args])
    return r.exit_code, r.stdout, r.stderr


def row(check: str, dtype: str | None, passed: bool = True) -> dict:
    return {"check": check, "title": "t", "build": "b", "seam": "framework", "vendor": "rocm-like",
            "dtype": dtype, "shape": None, "measured": "m", "value": 0, "relation": "==", "limit": 0,
            "passed": passed, "detail": "d", "error": None, "wall_s": 0.0}


def qualification(vendor: str, spec: str, failing_bf16_at: str | None = None) -> dict:
    """A fornax.qualify/1 document: every level run, each with a dtype-neutral row and a
    float32 row; a bfloat16 row fails at ``failing_bf16_at``."""
    levels = []
    for lv in LEVELS:
        ev = [row(f"{lv.id}.a", None), row(f"{lv.id}.b", "float32")]
        if lv.id == failing_bf16_at:
            ev.append(row(f"{lv.id}.c", "bfloat16", passed=False))
        levels.append({"level": lv.id, "title": lv.title, "promise": lv.promise,
                       "status": "fail" if lv.id == failing_bf16_at else "pass",
                       "evidence_passed": sum(e["passed"] for e in ev), "evidence_total": len(ev),
                       "wall_s": 0.0, "evidence": ev})
    verdict = "L7" if failing_bf16_at is None else f"L{int(failing_bf16_at[1]) - 1}"
    doc = {"schema": "fornax.qualify/1", "stack": f"{vendor} on {spec}",
           "config": {"seams": dict.fromkeys(("framework", "compiler", "library", "runtime", "driver"), vendor),
                      "spec": spec, "devices": 1, "seed": 0},
           "build": {"fornax": "0.1.0", "torch": "x", "jax": "y", "python": "3", "numpy": "2"},
           "levels_run": [lv.id for lv in LEVELS], "verdict": verdict, "verdict_text": "v",
           "passed": failing_bf16_at is None, "full": False, "opinfo_threshold": 0.95, "wall_s": 1.0,
           "levels": levels}
    validate(doc)                       # shaped as `fornax qualify --json` prints it
    return doc


@pytest.fixture
def evidence(tmp_path):
    q = tmp_path / "evidence" / "qualify"
    q.mkdir(parents=True)
    (q / "rocm.json").write_text(json.dumps(qualification("rocm-like", "mi300x-like", failing_bf16_at="L5")))
    (q / "notes.json").write_text(json.dumps({"hello": 1}))
    mixed = qualification("rocm-like", "h200-like")
    mixed["config"]["seams"]["driver"] = "cuda-like"
    (q / "mixed.json").write_text(json.dumps(mixed))
    return tmp_path / "evidence"


def test_levels_come_from_stored_documents_per_dtype(evidence):
    code, out, err = cli("--evidence", str(evidence), "--json")
    assert code == 0, err
    doc = json.loads(out)
    validate(doc)
    cells = {(r["front_end"], r["family"], r["spec"], r["dtype"]): r for r in doc["rows"]}
    assert cells[("torch", "rocm-like", "mi300x-like", "float32")]["level"] == "L7"
    assert cells[("torch", "rocm-like", "mi300x-like", "float16")]["level"] == "L7"
    assert cells[("torch", "rocm-like", "mi300x-like", "bfloat16")]["level"] == "L4"    # fails L5
    assert cells[("torch", "rocm-like", "mi300x-like", "float32")]["sources"][0].endswith("rocm.json")
    # the JAX and graph front ends, other families and chips: no stored qualification
    for key in [("jax", "rocm-like", "mi300x-like", "float32"), ("graph", "rocm-like", "mi300x-like", "float32"),
                ("torch", "cuda-like", "mi300x-like", "float32"), ("torch", "rocm-like", "h200-like", "float32")]:
        assert cells[key]["level"] is None and cells[key]["status"] == "not qualified"
    assert len(doc["rows"]) == len(doc["front_ends"]) * len(doc["families"]) * len(doc["specs"]) * 3
    assert doc["counts"]["not qualified"] == len(doc["rows"]) - 3
    ignored = {i["path"].rsplit("/", 1)[-1]: i["reason"] for i in doc["evidence"]["ignored"]}
    assert "not a fornax.qualify/1" in ignored["notes.json"] and "mixed stack" in ignored["mixed.json"]


def test_the_table_says_not_qualified_and_names_the_evidence(evidence):
    code, out, _ = cli("--evidence", str(evidence))
    assert code == 0
    assert "not qualified" in out and "L7" in out and "L4" in out
    assert "rocm-like on mi300x-like" in " ".join(out.split())


def test_level_rule_stops_at_the_first_level_not_run():
    doc = qualification("xpu-like", "tiny")
    doc["levels"][3]["status"] = "not run"
    doc["levels"][3]["evidence"] = []
    assert ecosystem.level_for(doc, "float32") == "L2"
    doc["levels"][0]["evidence"][0]["passed"] = False
    assert ecosystem.level_for(doc, "float16") is None


def test_the_shipped_evidence_qualifies_the_torch_rows_it_covers_and_nothing_else():
    """docs/evidence/qualify/ holds one fornax qualify --json document per family (the default
    chip): exactly those torch rows carry levels, each the level the document's rows give."""
    import json
    from pathlib import Path

    shipped = sorted((Path(__file__).parents[2] / "docs" / "evidence" / "qualify").glob("*.json"))
    docs = [json.loads(p.read_text()) for p in shipped]
    assert docs, "no stored qualification evidence"
    doc = ecosystem.matrix()
    validate(doc)
    assert sorted(q["verdict"] for q in doc["evidence"]["qualifications"]) == sorted(d["verdict"] for d in docs)
    covered = {(d["config"]["seams"]["framework"], d["config"]["spec"]) for d in docs}
    for r in doc["rows"]:
        if r["front_end"] == "torch" and (r["family"], r["spec"]) in covered:
            q = next(d for d in docs if (d["config"]["seams"]["framework"], d["config"]["spec"])
                     == (r["family"], r["spec"]))
            assert r["level"] == ecosystem.level_for(q, r["dtype"])
            assert r["level"] is not None and r["status"] != "not qualified"
        else:
            assert r["status"] == "not qualified" and r["level"] is None, r
    # the real-client record is shown as evidence, never as a level
    assert doc["evidence"]["real_clients"] and doc["evidence"]["real_clients"].endswith("real-clients.json")


def test_a_named_file_that_is_not_evidence_is_exit_2(tmp_path):
    (tmp_path / "x.json").write_text("[1, 2]")
    code, _, err = cli("--evidence", str(tmp_path / "x.json"))
    assert code == 2 and "not a fornax.qualify/1 document" in err
    code, _, err = cli("--evidence", str(tmp_path / "missing"))
    assert code == 2 and "does not exist" in err
