"""The ecosystem matrix: which front end x family x chip spec x dtype is at which
qualification level, read from stored evidence (``fornax matrix``).

Nothing is run here.  The levels come from stored ``fornax.qualify/1`` documents (what
``fornax qualify --json`` prints) found in the evidence folders: by default the checkout's
``docs/evidence/`` (recursively), or the files and folders given.  A combination with no
stored qualification is ``not qualified``; a level is never inferred from anything else.

* The qualification contract (docs/qualify.md) measures PyTorch support, so a stored
  document gives levels to the ``torch`` front end of its stack's family and chip spec;
  a stack that mixes families qualifies no family and is listed as ignored.
* Per dtype, the level is the highest ``L`` such that ``L0`` .. ``L`` ran and every evidence
  row of them that applies to the dtype passed; a row applies to a dtype when its ``dtype``
  names it, or names none of :data:`DTYPES` (a device or configuration check).  With every
  row passing this is the document's verdict.  Two documents for one combination: the
  lower level counts, and both are named.
* ``real-clients.json`` (``make bench``'s record of PyTorch's test databases and the JAX
  programs per family) is shown as evidence beside the combinations it ran on (each
  family's default chip spec, float32 and the OpInfo dtype groups), never as a level.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..compare import FRAMEWORKS
from ..layers.errors import ConfigError
from ..qualify.levels import LEVELS
from ..qualify.levels import SCHEMA as QUALIFY_SCHEMA
from ..qualify_clients import source_root
from ..schemas import SchemaError, validate
from ..sim.spec import available_specs
from ..stack import DEFAULT_SPEC, runnable_vendors

SCHEMA = "fornax.matrix/1"
DTYPES = ("float32", "float16", "bfloat16")
NOT_QUALIFIED = "not qualified"
REAL_CLIENTS = "real-clients.json"
_TOKENS = re.compile(r"[a-z0-9]+")


def default_dirs() -> list[Path]:
    """The checkout's ``docs/evidence`` (none for an install from a wheel)."""
    root = source_root()
    return [root / "docs" / "evidence"] if root is not None and (root / "docs" / "evidence").is_dir() else []


@dataclass
class Evidence:
    """What the evidence folders hold: qualification documents, the real-client record, and
    the files that were skipped (with why)."""

    places: list[str]
    qualifications: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    real_clients: tuple[str, dict[str, Any]] | None = None
    ignored: list[dict[str, str]] = field(default_factory=list)


def gather(paths: list[str] | None = None) -> Evidence:
    """Read every JSON file of ``paths`` (files, or folders searched recursively; default
    :func:`default_dirs`).  A named file that is not evidence is a :class:`ConfigError`; a
    file in a folder that is not is skipped and listed."""
    places = [Path(p) for p in paths] if paths else default_dirs()
    ev = Evidence([str(p) for p in places])
    for place in places:
        if not place.exists():
            raise ConfigError(f"--evidence {place} does not exist")
        files = sorted(place.rglob("*.json")) if place.is_dir() else [place]
        for f in files:
            reason = _read(f, ev)
            if reason is not None:
                if not place.is_dir():
                    raise ConfigError(f"--evidence {f}: {reason}",
                                      hint="give fornax.qualify/1 documents (fornax qualify --json) "
                                           f"or {REAL_CLIENTS}")
                ev.ignored.append({"path": str(f), "reason": reason})
    return ev


def _read(f: Path, ev: Evidence) -> str | None:
    """File ``f`` into ``ev``; why it is not evidence, or None."""
    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"not a readable JSON document ({exc})"
    if f.name == REAL_CLIENTS and isinstance(doc, dict) and isinstance(doc.get("suite"), dict):
        ev.real_clients = (str(f), doc)
        return None
    if not isinstance(doc, dict) or doc.get("schema") != QUALIFY_SCHEMA:
        return f"not a {QUALIFY_SCHEMA} document (schema {doc.get('schema') if isinstance(doc, dict) else None!r})"
    try:
        validate(doc)
    except SchemaError as exc:
        return f"a damaged {QUALIFY_SCHEMA} document: {exc}"
    families = sorted(set(doc["config"]["seams"].values()))
    if len(families) != 1:
        return f"qualifies a mixed stack ({doc['stack']}), not one family"
    ev.qualifications.append((str(f), doc))
    return None


def _applies(row_dtype: str | None, dtype: str) -> bool:
    words = set(_TOKENS.findall((row_dtype or "").lower()))
    return dtype in words or not words & set(DTYPES)


def level_for(doc: dict[str, Any], dtype: str) -> str | None:
    """The highest level L of a ``fornax.qualify/1`` document such that L0 .. L ran and
    every evidence row of them that applies to ``dtype`` passed (None: not even L0)."""
    best = None
    by_id = {lv["level"]: lv for lv in doc["levels"]}
    for level in LEVELS:
        lv = by_id.get(level.id)
        if lv is None or lv["status"] == "not run":
            break
        rows = [e for e in lv["evidence"] if _applies(e.get("dtype"), dtype)]
        if not rows or not all(e["passed"] for e in rows):
            break
        best = level.id
    return best


def _client_notes(ev: Evidence, front_end: str, family: str, spec: str, dtype: str) -> list[str]:
    """The real-client record's figures for one combination (its family's default spec)."""
    if ev.real_clients is None or spec != DEFAULT_SPEC:
        return []
    path, doc = ev.real_clients
    notes = []
    if front_end == "torch":
        group = doc["suite"].get(family, {}).get("kinds", {}).get("ops", {}).get(dtype)
        if isinstance(group, dict) and "run" in group:
            notes.append(f"PyTorch OpInfo {dtype}: {group['passed']}/{group['run']} passed ({path})")
    if front_end == "jax" and dtype == "float32":
        progs = doc.get("jax", {}).get(family, [])
        if progs:
            ok = sum(bool(p.get("ok")) for p in progs)
            notes.append(f"JAX programs: {ok}/{len(progs)} match jax.jit ({path})")
    return notes


def matrix(paths: list[str] | None = None) -> dict[str, Any]:
    """The ``fornax.matrix/1`` document: every front end x family x spec x dtype with its
    level from stored evidence, or ``not qualified``."""
    ev = gather(paths)
    by_stack: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = {}
    for path, doc in ev.qualifications:
        key = (doc["config"]["seams"]["framework"], doc["config"]["spec"])
        by_stack.setdefault(key, []).append((path, doc))
    order = [lv.id for lv in LEVELS]
    rows: list[dict[str, Any]] = []
    for fe in FRAMEWORKS:
        for family in runnable_vendors():
            for spec in available_specs():
                for dtype in DTYPES:
                    docs = by_stack.get((family, spec), []) if fe == "torch" else []
                    levels = [level_for(d, dtype) for _, d in docs]
                    level = (None if not docs or None in levels
                             else min((lv for lv in levels if lv is not None), key=order.index))
                    rows.append({"front_end": fe, "family": family, "spec": spec, "dtype": dtype,
                                 "level": level,
                                 "status": NOT_QUALIFIED if not docs else
                                 ("qualified" if level is not None else "fails L0"),
                                 "sources": [p for p, _ in docs],
                                 "evidence": _client_notes(ev, fe, family, spec, dtype)})
    counts: dict[str, int] = {}
    for r in rows:
        name = str(r["level"] or r["status"])
        counts[name] = counts.get(name, 0) + 1
    return {"schema": SCHEMA, "levels": order, "front_ends": list(FRAMEWORKS),
            "families": runnable_vendors(), "specs": available_specs(), "dtypes": list(DTYPES),
            "evidence": {"places": ev.places,
                         "qualifications": [{"path": p, "stack": d["stack"], "verdict": d["verdict"]}
                                            for p, d in ev.qualifications],
                         "real_clients": ev.real_clients[0] if ev.real_clients else None,
                         "ignored": ev.ignored},
            "rows": rows, "counts": counts}
