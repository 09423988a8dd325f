"""The compatibility policy (docs/compatibility.md), enforced: every shipped schema names its
own kind and major version, every `--json` command prints a document with a shipped schema,
and no required key of a shipped schema is removed or retyped without a major version bump
(against the recorded snapshot tests/release/schema_snapshot.json).

After a deliberate, compatible change (a key added) or a major bump, re-record the snapshot:

    FORNAX_RECORD_SCHEMAS=1 .venv/bin/pytest -q tests/release/test_compatibility.py
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.schemas import INPUT_SCHEMAS, kinds, load, validate

SNAPSHOT = Path(__file__).with_name("schema_snapshot.json")
ROOT = Path(__file__).resolve().parents[2]

#: every command with --json and the document kind it prints (cost and trace merge print
#: plain figures: their kinds are named here too)
JSON_COMMANDS = {
    "compose": "report", "specs": "specs", "workloads": "workloads", "conform": "conform",
    "cost gemm": "cost", "cost copy": "cost", "cost allreduce": "cost", "cost attention": "cost",
    "compare": "compare", "devices": "devices", "drill": "drill", "qualify": "qualify",
    "serve": "serve", "trace merge": "trace-summary", "media": "media",
    "baseline check": "regression", "matrix": "matrix", "lab list": "labs", "lab check": "lab-check",
    "profile": "profile",
}


def _type(node: dict[str, Any]) -> str:
    if "$ref" in node:
        return f"ref:{node['$ref']}"
    if "const" in node:
        return f"const:{json.dumps(node['const'])}"
    if "enum" in node:
        return "enum"
    t = node.get("type")
    if isinstance(t, list):
        return "|".join(sorted(t))
    if t:
        return str(t)
    return "anyOf" if "anyOf" in node else "oneOf" if "oneOf" in node else "any"


def required_keys(schema: dict[str, Any]) -> dict[str, str]:
    """Every required key of a schema, by path (``costs.device_time_s``, ``rows[].verdict``,
    ``$defs.fallback.op``), with its declared type."""
    out: dict[str, str] = {}

    def walk(node: Any, path: str) -> None:
        if not isinstance(node, dict):
            return
        props = node.get("properties", {})
        for key in node.get("required", []):
            out[f"{path}{key}"] = _type(props.get(key, {}))
        for key, sub in props.items():
            walk(sub, f"{path}{key}.")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path.rstrip('.')}[].")
        for alt in node.get("anyOf", []) + node.get("oneOf", []):
            walk(alt, path)

    walk(schema, "")
    for name, sub in schema.get("$defs", {}).items():
        walk(sub, f"$defs.{name}.")
    return out


def _snapshot_now() -> dict[str, Any]:
    return {kind: {"schema": load(kind)["properties"]["schema"]["const"], "required": required_keys(load(kind))}
            for kind in kinds()}


def test_every_shipped_schema_names_its_own_kind_and_a_major_version():
    for path in sorted((ROOT / "fornax" / "schemas").glob("*.schema.json")):
        kind = path.name.removesuffix(".schema.json")
        if kind in INPUT_SCHEMAS:
            continue
        schema = json.loads(path.read_text())
        const = schema["properties"]["schema"]["const"]
        assert re.fullmatch(rf"fornax\.{re.escape(kind)}/[1-9][0-9]*", const), (path.name, const)
        assert "schema" in schema["required"], path.name


def test_no_required_key_is_removed_or_retyped_without_a_major_bump():
    if os.environ.get("FORNAX_RECORD_SCHEMAS"):
        SNAPSHOT.write_text(json.dumps(_snapshot_now(), indent=1, sort_keys=True) + "\n")
    recorded = json.loads(SNAPSHOT.read_text())
    now = _snapshot_now()
    problems = []
    for kind, old in sorted(recorded.items()):
        if kind not in now:
            problems.append(f"{kind}: the schema is gone (documents of fornax.{kind} can no longer be "
                            "validated); removing a document kind is a breaking change")
            continue
        if now[kind]["schema"] != old["schema"]:
            continue                                  # a major bump: anything may change
        for key, typ in old["required"].items():
            got = now[kind]["required"].get(key)
            if got is None:
                problems.append(f"{old['schema']}: required key {key!r} was removed")
            elif got != typ:
                problems.append(f"{old['schema']}: required key {key!r} changed type {typ} -> {got}")
    assert not problems, (
        "breaking schema changes without a major version bump:\n  " + "\n  ".join(problems)
        + "\nEither keep the key (add new keys beside it: adding is compatible), or bump the "
          "schema's major version (const fornax.KIND/N+1 in fornax/schemas/KIND.schema.json and "
          "the code that writes it) and note it in docs/compatibility.md; then re-record the "
          "snapshot with FORNAX_RECORD_SCHEMAS=1 .venv/bin/pytest -q tests/release/test_compatibility.py")


def test_the_snapshot_would_catch_a_removed_and_a_retyped_key():
    schema = load("regression")
    keys = required_keys(schema)
    assert keys["rows[].verdict"] == "enum" and keys["regressions"] == "integer"
    broken = json.loads(json.dumps(schema))
    broken["required"].remove("regressions")
    broken["properties"]["ok"]["type"] = "string"
    after = required_keys(broken)
    assert "regressions" not in after and after["ok"] == "string" != keys["ok"]


def _json_commands(group: click.Group, path: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _json_commands(cmd, (*path, name))
        elif any("--json" in p.opts for p in cmd.params):
            yield " ".join((*path, name))


def test_every_json_command_prints_a_document_with_a_shipped_schema():
    found = set(_json_commands(main))
    unknown = found - set(JSON_COMMANDS)
    assert not unknown, (f"commands with --json but no recorded document kind: {sorted(unknown)}; add "
                         "each to JSON_COMMANDS with the kind of its fornax/schemas/KIND.schema.json")
    assert {JSON_COMMANDS[c] for c in found} <= set(kinds())


@pytest.mark.parametrize("args", [["specs", "tiny", "--json"], ["workloads", "--json"], ["matrix", "--json"],
                                  ["devices", "--vendor", "xpu-like", "--spec", "tiny", "--json"]])
def test_quick_json_documents_validate(args):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    validate(doc)
    assert doc["schema"] == f"fornax.{JSON_COMMANDS[args[0]]}/1"
