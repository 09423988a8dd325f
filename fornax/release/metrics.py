"""The metrics a baseline holds per run, and how two values of one are judged.

Each run's metrics are read from its ``fornax.report/1`` document (:func:`extract`): the
simulated figures :func:`fornax.compare.metrics` reads (device time, energy, kernels,
launches, copies and bytes, peak device memory, CPU fallbacks, the largest normwise error),
the largest absolute error of each output against the float64 reference
(``max_abs_err[OUTPUT]``) and the set of ops that fell back to the CPU (``fallback_ops``).
Host wall time is never a metric: it is a measurement of the machine, not of the stack.

A ``bench.json`` (``benchmarks.bench/1``) adds every figure it holds as ``bench.NAME``
(:func:`bench_figures`), judged by the side of its own target that is good (``max``: lower
is better, ``min``: higher); a figure that met its target and now misses it is a regression
whatever the tolerance.

:func:`judge` compares one metric: a change beyond its tolerance in the bad direction is a
``regression``, in the good direction an ``improvement``; a smaller change is ``within``
tolerance, no change ``same``; a metric the baseline had and the rerun lacks is a
regression, one the baseline lacked is ``new``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

from ..compare import fmt_value
from ..compare import metrics as report_metrics
from ..layers.errors import ConfigError

#: a stored metric value: a number, none (nothing to measure: a shape-only run has no
#: numerics), or a sorted list of names (the ops that fell back)
Value = Union[float, int, None, list[str]]
Verdict = Literal["regression", "improvement", "within", "same", "new"]
#: the verdicts, worst first
VERDICTS: tuple[Verdict, ...] = ("regression", "improvement", "within", "new", "same")
BENCH_SCHEMA = "benchmarks.bench/1"


@dataclass(frozen=True)
class MetricDef:
    """A metric: its key, label, unit and which direction is better (``lower``, ``higher``,
    or ``fewer`` for a set of names: a name that appears is worse)."""

    key: str
    label: str
    unit: str
    better: Literal["lower", "higher", "fewer"]


#: the per-run metrics, in the order tables show them (``max_abs_err`` stands for one row per
#: output, ``max_abs_err[OUTPUT]``)
METRICS: tuple[MetricDef, ...] = (
    MetricDef("max_abs_err", "max abs error vs float64", "abs", "lower"),
    MetricDef("max_rel_err", "max rel. error vs float64", "ratio", "lower"),
    MetricDef("kernels", "kernels", "count", "lower"),
    MetricDef("launches", "launches", "count", "lower"),
    MetricDef("fallbacks", "CPU fallbacks", "count", "lower"),
    MetricDef("fallback_ops", "ops that fell back", "ops", "fewer"),
    MetricDef("device_time_s", "device time (simulated)", "s", "lower"),
    MetricDef("energy_j", "energy (simulated)", "J", "lower"),
    MetricDef("copies", "copies", "count", "lower"),
    MetricDef("h2d_bytes", "bytes copied H2D", "bytes", "lower"),
    MetricDef("d2h_bytes", "bytes copied D2H", "bytes", "lower"),
    MetricDef("peak_device_bytes", "peak device memory", "bytes", "lower"),
)
_BY_KEY = {m.key: m for m in METRICS}
#: the metrics read through :func:`fornax.compare.metrics` (the rest are read here)
_FROM_COMPARE = tuple(m.key for m in METRICS if m.key not in ("max_abs_err", "fallback_ops"))


def definition(metric: str) -> MetricDef:
    """The definition of a metric key (``max_abs_err[y]`` is ``max_abs_err``'s; a bench
    figure's direction comes from its own target, see :func:`bench_definition`)."""
    return _BY_KEY[metric.split("[", 1)[0]]


def known_metric(name: str) -> bool:
    """Whether ``name`` may be given a tolerance: a metric key, a metric of one output, or
    ``bench`` / ``bench.FIGURE``."""
    return name == "bench" or name.startswith("bench.") or name.split("[", 1)[0] in _BY_KEY


def extract(report: dict[str, Any]) -> dict[str, Value]:
    """The metrics of one ``fornax.report/1`` document."""
    read = report_metrics(report)
    out: dict[str, Value] = {k: read[k] for k in _FROM_COMPARE}
    for n in report["numerics"]:
        out[f"max_abs_err[{n['output']}]"] = float(n["max_abs_err"])
    front = (report.get("torch") or report.get("jax") or {}).get("fallbacks", [])
    out["fallback_ops"] = sorted({f["op"] for f in report["fallbacks"]}
                                 | {f.get("op") or f.get("primitive", "?") for f in front})
    return out


def software(report: dict[str, Any]) -> dict[str, str | None]:
    """The software manifest of a run: the fornax, Python, numpy, torch, jax and jaxlib versions."""
    m = report["manifest"]
    return {k: m.get(k) for k in ("fornax", "python", "numpy", "torch", "jax", "jaxlib")}


@dataclass(frozen=True)
class Tolerance:
    """How far a metric may move: ``|new - old| <= max(absolute, relative * |old|)``."""

    relative: float = 0.0
    absolute: float = 0.0

    def allows(self, old: float, new: float) -> bool:
        return abs(new - old) <= max(self.absolute, self.relative * abs(old))

    def to_json(self) -> dict[str, float]:
        return {"relative": self.relative, "absolute": self.absolute}

    def describe(self) -> str:
        parts = [f"±{self.relative:.3g}×" if self.relative else "",
                 f"±{self.absolute:.3g}" if self.absolute else ""]
        return " or ".join(p for p in parts if p) or "exact"


EXACT = Tolerance()


# ---- bench.json ----------------------------------------------------------------------------------
def bench_figures(path: str | Path) -> dict[str, dict[str, Any]]:
    """Every figure of a ``benchmarks.bench/1`` file, by name: value, unit, target, kind, met."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"--bench {p}: cannot read it: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--bench {p} is not a JSON document: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != BENCH_SCHEMA or not isinstance(doc.get("figures"), list):
        raise ConfigError(f"--bench {p} is not a {BENCH_SCHEMA} document",
                          hint="give the bench.json `python -m benchmarks` writes")
    out: dict[str, dict[str, Any]] = {}
    for i, f in enumerate(doc["figures"]):
        ok = (isinstance(f, dict) and isinstance(f.get("name"), str)
              and isinstance(f.get("value"), (int, float)) and not isinstance(f.get("value"), bool)
              and isinstance(f.get("unit"), str) and f.get("kind", "max") in ("max", "min"))
        if not ok:
            raise ConfigError(f"--bench {p}: figure {i} needs a name, a numeric value and a unit, "
                              f"got {f!r}")
        out[f["name"]] = {"value": f["value"], "unit": f["unit"], "target": f.get("target"),
                          "kind": f.get("kind", "max") if f.get("target") is not None else None,
                          "met": f.get("met")}
    return out


def bench_definition(name: str, figure: dict[str, Any]) -> MetricDef:
    """A bench figure as a metric: lower is better unless its target is a minimum."""
    return MetricDef(f"bench.{name}", name, figure["unit"],
                     "higher" if figure.get("kind") == "min" else "lower")


# ---- judging one metric --------------------------------------------------------------------------
@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    change: float | None           # relative change (new - old) / |old|, None where undefined
    why: str


def judge(better: str, old: Value, new: Value, tol: Tolerance, *, missing: bool = False,
          met: tuple[Any, Any] = (None, None)) -> Judgement:
    """Compare one metric's baseline value ``old`` with the rerun's ``new``.  ``missing``: the
    rerun has no such metric; ``met``: a bench figure's target met (baseline, rerun)."""
    if missing:
        return Judgement("regression", None, "metric disappeared from the rerun")
    if isinstance(old, list) or isinstance(new, list):
        before = set(old) if isinstance(old, list) else set()
        after = set(new) if isinstance(new, list) else set()
        if after - before:
            return Judgement("regression", None, f"now falls back: {', '.join(sorted(after - before))}")
        if before - after:
            return Judgement("improvement", None, f"no longer falls back: {', '.join(sorted(before - after))}")
        return Judgement("same", None, "")
    if old is None or new is None:
        if old is None and new is None:
            return Judgement("same", None, "")
        if old is None:
            return Judgement("new", None, "the baseline had no value")
        return Judgement("regression", None, "the rerun has no value")
    change = (new - old) / abs(old) if old else (0.0 if new == old else math.copysign(math.inf, new - old))
    worse = new > old if better == "lower" else new < old
    if met[0] is True and met[1] is False:
        return Judgement("regression", change, "target met in the baseline, missed now")
    if new == old:
        return Judgement("same", 0.0, "")
    if tol.allows(float(old), float(new)):
        flip = " (target now met)" if met[0] is False and met[1] is True else ""
        return Judgement("improvement" if flip else "within", change, f"within {tol.describe()}{flip}")
    return Judgement("regression" if worse else "improvement", change,
                     f"beyond {tol.describe()}, {better} is better")


def fmt_row_value(row: dict[str, Any], key: str) -> str:
    """A compared row's ``baseline`` or ``now`` value in words: a list of ops, a status, or a
    number in the row's unit (``—`` where there is none)."""
    v = row[key]
    if isinstance(v, list):
        return ", ".join(v) or "none"
    if v is None or isinstance(v, str):
        return v or "—"
    if row["unit"] in ("s", "bytes", "J"):
        return fmt_value(row["unit"], v)
    return f"{v:.4g}" if isinstance(v, float) else str(v)
