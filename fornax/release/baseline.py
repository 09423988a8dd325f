"""Pinned baselines of reports: save a matrix of runs, rerun it later, compare metric by metric.

:func:`save` runs every run of a :class:`~fornax.release.plan.Matrix` (each exactly as
``fornax compose`` runs it: :func:`fornax.compare.prepare` and :func:`~fornax.compare.execute`)
and stores ``NAME/baseline.json`` (``fornax.baseline/1``): the software manifest, the matrix,
and per run its status and the metrics of :mod:`fornax.release.metrics`, plus the figures
of a ``bench.json`` when one is given.  :func:`check` reruns the stored matrix and returns
the ``fornax.regression/1`` document: one row per run and metric with its verdict, the
software differences, and the counts.  A run that errors is a regression; so is a metric
that disappears; a software difference is shown, never a regression by itself::

    from fornax.release import baseline, plan
    baseline.save("nightly", plan.load(), root)          # root: the baselines folder
    doc = baseline.check("nightly", root)
    doc["regressions"], [r for r in doc["rows"] if r["verdict"] == "regression"]
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..compare import execute, prepare
from ..layers.errors import ConfigError, FornaxError
from ..schemas import SchemaError, validate
from . import metrics as m
from . import plan

SCHEMA = "fornax.baseline/1"
CHECK_SCHEMA = "fornax.regression/1"
FILE = "baseline.json"
#: where baselines live, under the current directory, unless ``--dir`` says otherwise
DEFAULT_DIR = Path(".fornax") / "baselines"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: called as each run starts: (index, count, run)
OnRun = Callable[[int, int, plan.Run], None]


def folder(name: str, root: str | Path | None = None) -> Path:
    """The folder of baseline ``name`` under ``root`` (default :data:`DEFAULT_DIR`)."""
    if not _NAME.fullmatch(name):
        raise ConfigError(f"baseline name {name!r} is not a plain name",
                          hint="use letters, digits, '.', '_' and '-' (at most 64), e.g. nightly")
    return Path(root if root is not None else DEFAULT_DIR) / name


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_all(matrix: plan.Matrix, *, strict: bool, on_run: OnRun | None = None
            ) -> tuple[list[dict[str, Any]], dict[str, str | None]]:
    """Run every run of ``matrix``: per run its key, status (``ok``, ``numerics``: an output
    outside its tolerance, ``error``), error and metrics, and the software manifest.
    ``strict``: a run that cannot be prepared is a :class:`ConfigError` (at save time);
    otherwise it is a run in error (at check time: a run that no longer composes)."""
    runs = matrix.runs()
    rows: list[dict[str, Any]] = []
    software: dict[str, str | None] = {}
    for i, run in enumerate(runs):
        if on_run is not None:
            on_run(i, len(runs), run)
        try:
            prep = prepare(matrix.config(run), run.framework, run.workload, origin=f"fornax baseline {run.key}")
        except FornaxError as exc:
            if strict:
                raise ConfigError(f"run {run.key}: {exc.message}", hint=exc.hint) from None
            rows.append({**run.to_json(), "status": "error", "error": str(exc), "metrics": {}})
            continue
        out = execute(prep)
        software = software or m.software(out.report)
        status = "error" if out.failed else ("ok" if out.numerics_ok else "numerics")
        rows.append({**run.to_json(), "status": status, "error": out.failed,
                     "metrics": {} if out.failed else m.extract(out.report)})
    return rows, software


def save(name: str, matrix: plan.Matrix, root: str | Path | None = None, *,
         bench: str | Path | None = None, force: bool = False, on_run: OnRun | None = None) -> dict[str, Any]:
    """Run ``matrix`` and store it as baseline ``name``; returns the stored document.  An
    existing baseline is kept unless ``force``."""
    where = folder(name, root)
    if (where / FILE).exists() and not force:
        raise ConfigError(f"baseline {name!r} already exists in {where}",
                          hint="check against it with `fornax baseline check`, or replace it with --force")
    figures = m.bench_figures(bench) if bench is not None else None
    rows, software = run_all(matrix, strict=True, on_run=on_run)
    doc: dict[str, Any] = {"schema": SCHEMA, "name": name, "created": _now(), "software": software,
                           "matrix": matrix.to_json(), "runs": rows,
                           "bench": None if figures is None else {"source": str(bench), "figures": figures}}
    validate(doc)
    try:
        where.mkdir(parents=True, exist_ok=True)
        (where / FILE).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write baseline {name!r} to {where}: {exc.strerror or exc}") from None
    return doc


def load(name: str, root: str | Path | None = None) -> dict[str, Any]:
    """The stored ``fornax.baseline/1`` document of baseline ``name``, validated."""
    path = folder(name, root) / FILE
    if not path.is_file():
        here = sorted(p.parent.name for p in path.parent.parent.glob(f"*/{FILE}"))
        raise ConfigError(f"no baseline {name!r} in {path.parent.parent}",
                          hint=(f"baselines there: {', '.join(here)}" if here else
                                f"save one first: fornax baseline save {name}"))
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        validate(doc)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, SchemaError) as exc:
        raise ConfigError(f"baseline file {path} is unreadable or damaged: {exc}",
                          hint="save the baseline again with --force") from None
    return dict(doc)


def check(name: str, root: str | Path | None = None, *, bench: str | Path | None = None,
          on_run: OnRun | None = None) -> dict[str, Any]:
    """Rerun baseline ``name``'s matrix and compare: the ``fornax.regression/1`` document."""
    base = load(name, root)
    matrix = plan.from_json(base["matrix"])
    if base["bench"] is not None and bench is None:
        raise ConfigError(f"baseline {name!r} was saved with --bench {base['bench']['source']}",
                          hint="give this run's bench.json with --bench FILE")
    if base["bench"] is None and bench is not None:
        raise ConfigError(f"baseline {name!r} was saved without --bench: nothing to compare it with",
                          hint="save a baseline with --bench FILE first")
    figures = m.bench_figures(bench) if bench is not None else None
    rows, software = run_all(matrix, strict=False, on_run=on_run)
    table: list[dict[str, Any]] = []
    now = {r["key"]: r for r in rows}
    for old in base["runs"]:
        table.extend(_run_rows(old, now.get(old["key"]), matrix))
    if figures is not None:
        table.extend(_bench_rows(base["bench"]["figures"], figures, matrix))
    counts = {v: sum(r["verdict"] == v for r in table) for v in m.VERDICTS}
    diffs = [{"key": k, "baseline": base["software"].get(k), "now": software.get(k)}
             for k in sorted(set(base["software"]) | set(software))
             if software and base["software"].get(k) != software.get(k)]
    doc = {"schema": CHECK_SCHEMA, "baseline": name, "folder": str(folder(name, root)),
           "created": base["created"], "checked": _now(), "matrix": base["matrix"],
           "software": {"baseline": base["software"], "now": software, "differences": diffs},
           "runs": len(base["runs"]), "rows": table, "counts": counts,
           "regressions": counts["regression"], "ok": counts["regression"] == 0}
    validate(doc)
    return doc


def _row(run: str, d: m.MetricDef, old: m.Value | str, new: m.Value | str, j: m.Judgement) -> dict[str, Any]:
    change = j.change if j.change is not None and math.isfinite(j.change) else None
    return {"run": run, "metric": d.key, "label": d.label, "unit": d.unit, "better": d.better,
            "baseline": old, "now": new, "change": change, "verdict": j.verdict, "why": j.why}


_STATUS = m.MetricDef("run", "run status", "status", "lower")


def _run_rows(old: dict[str, Any], new: dict[str, Any] | None, matrix: plan.Matrix) -> list[dict[str, Any]]:
    """The rows of one run: its status, then every metric the baseline or the rerun has."""
    key = old["key"]
    if new is None or new["status"] == "error":
        why = "the run is no longer in the matrix" if new is None else f"the run failed: {new['error']}"
        return [{**_row(key, _STATUS, old["status"], "error", m.Judgement("regression", None, why))}]
    if old["status"] == "error":
        return [_row(key, _STATUS, "error", new["status"],
                     m.Judgement("improvement", None, "the run failed in the baseline and runs now"))]
    status = m.Judgement("same", None, "") if old["status"] == new["status"] else (
        m.Judgement("regression", None, "an output is now outside its tolerance") if new["status"] == "numerics"
        else m.Judgement("improvement", None, "every output is within its tolerance now"))
    rows = [_row(key, _STATUS, old["status"], new["status"], status)]
    names = list(old["metrics"]) + [k for k in new["metrics"] if k not in old["metrics"]]
    for name in names:
        d = m.definition(name)
        if name != d.key:                   # one output's metric: max_abs_err[y]
            d = m.MetricDef(name, f"{d.label} ({name[len(d.key) + 1:-1]})", d.unit, d.better)
        missing = name not in new["metrics"]
        o, n = old["metrics"].get(name), new["metrics"].get(name)
        j = (m.Judgement("new", None, "the baseline had no such metric") if name not in old["metrics"]
             else m.judge(d.better, o, n, matrix.tolerance(name), missing=missing))
        rows.append(_row(key, d, o, n, j))
    return rows


def _bench_rows(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]],
                matrix: plan.Matrix) -> list[dict[str, Any]]:
    rows = []
    for name in list(old) + [k for k in new if k not in old]:
        o, n = old.get(name), new.get(name)
        d = m.bench_definition(name, o or n or {})
        if o is None:
            j = m.Judgement("new", None, "the baseline's bench.json had no such figure")
        else:
            j = m.judge(d.better, o["value"], None if n is None else n["value"], matrix.tolerance(d.key),
                        missing=n is None, met=(o.get("met"), None if n is None else n.get("met")))
        rows.append(_row("bench", d, None if o is None else o["value"], None if n is None else n["value"], j))
    return rows
