"""Lab 10: qualification and release -- a regression baseline, a deliberate regression
caught, and the ecosystem matrix.

Experiments: a baseline of a tiny matrix (mlp and softmax on the three families, graph
front end, h200-like) saved and checked unchanged; the same matrix rerun as a release
candidate with fusion switched off, and the regressions ``fornax baseline check`` names
(metric, old, new); the ecosystem matrix's rows for the torch front end on h200-like, read
from the stored evidence in ``docs/evidence/qualify/`` (``fornax matrix``).
"""

from __future__ import annotations

import json
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from .lab import Exercise, Lab, Section, Table, figure, number_fact, text_fact

FAMILIES = ("cuda-like", "rocm-like", "xpu-like")
WORKLOADS = ("mlp", "softmax")
SPEC = "h200-like"
#: the metric exercise 10.4's matrix must catch when fusion is switched off
TARGET = "peak_device_bytes"
#: the most runs a student's matrix may hold (the check runs it twice, live)
MAX_RUNS = 6
_NAME = "lab10"
_SHORT = {"cuda-like": "cuda", "rocm-like": "rocm", "xpu-like": "xpu"}


def _matrix() -> Any:
    from fornax.release import plan
    return plan.parse({"matrix": {"vendors": list(FAMILIES), "frameworks": ["graph"],
                                  "workloads": list(WORKLOADS), "specs": [SPEC]},
                       "stack": {"fuse": True},
                       "tolerances": {"device_time_s": {"relative": 0.001}, "energy_j": {"relative": 0.001},
                                      "max_abs_err": {"relative": 0.5, "absolute": 1e-6}}}, "lab 10")


def rerun_unfused(matrix: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Save ``matrix`` as a baseline (in a temporary folder), check it unchanged, then rerun it
    as a release candidate whose stack has fusion switched off: the ``[stack] fuse`` switch
    of the stored matrix is set to false, so ``baseline.check`` composes every run unfused
    and compares it with the fused numbers.  Returns (saved, unchanged check, unfused check)."""
    from fornax.release import baseline
    with tempfile.TemporaryDirectory(prefix="fornax-lab10-") as tmp:
        saved = baseline.save(_NAME, matrix, tmp)
        same = baseline.check(_NAME, tmp)
        path = baseline.folder(_NAME, tmp) / baseline.FILE
        doc = json.loads(path.read_text(encoding="utf-8"))
        doc["matrix"]["stack"] = {**doc["matrix"]["stack"], "fuse": False}
        path.write_text(json.dumps(doc), encoding="utf-8")
        off = baseline.check(_NAME, tmp)
    return saved, same, off


@lru_cache(maxsize=1)
def _runs() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    return rerun_unfused(_matrix())


def _regressions(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in doc["rows"] if r["verdict"] == "regression"]


def _row(doc: dict[str, Any], run: str, metric: str) -> dict[str, Any]:
    return next(r for r in doc["rows"] if r["run"] == run and r["metric"] == metric)


@lru_cache(maxsize=1)
def _ecosystem() -> tuple[tuple[str, str, str, str, str], ...]:
    from fornax.release import ecosystem
    doc = ecosystem.matrix()
    rows = []
    for r in doc["rows"]:
        if r["front_end"] == "torch" and r["spec"] == SPEC:
            source = ", ".join(f"qualify/{Path(p).name}" for p in r["sources"]) or "—"
            notes = "; ".join(n.rsplit(" (", 1)[0] for n in r["evidence"]) or "—"
            rows.append((r["family"], r["dtype"], str(r["level"] or r["status"]), source, notes))
    return tuple(rows)


def _key(workload: str, vendor: str) -> str:
    return f"graph/{workload}/{vendor}/{SPEC}"


def experiments(out: Path) -> list[Section]:
    from fornax.release.metrics import fmt_row_value
    saved, same, off = _runs()
    bad = _regressions(off)
    eco = _ecosystem()
    kernels = {(r["workload"], r["vendor"]): (r["metrics"]["kernels"], _row(off, r["key"], "kernels")["now"])
               for r in saved["runs"]}
    _picture(kernels, out / "kernels.png")
    return [
        Section("A baseline, checked unchanged",
                f"The matrix: the graph front end's {' and '.join(WORKLOADS)} workloads on the three "
                f"families, on {SPEC}, with fusion on ([stack] fuse = true); device time and energy may "
                "move by 0.1%, every other metric must not move at all. `fornax baseline save` runs "
                "each run as `fornax compose` does and stores its metrics (simulated figures only: host "
                "wall time is a measurement of the machine, never a metric); `fornax baseline check` "
                "reruns the stored matrix and judges every metric (here the baseline lives in a "
                "temporary folder; the command keeps it in .fornax/baselines/NAME/baseline.json). "
                "Rerun unchanged, every metric is the same: the simulated device is deterministic.",
                [Table("the saved baseline (fusion on)", ["run", "kernels", "launches", "device time",
                                                          "peak device memory"],
                       [[r["key"], str(r["metrics"]["kernels"]), str(r["metrics"]["launches"]),
                         fmt_row_value(_row(same, r["key"], "device_time_s"), "baseline"),
                         fmt_row_value(_row(same, r["key"], "peak_device_bytes"), "baseline")]
                        for r in saved["runs"]]),
                 Table("checked unchanged", ["runs", "rows judged", "same", "regressions"],
                       [[str(same["runs"]), str(len(same["rows"])), str(same["counts"]["same"]),
                         str(same["regressions"])]])]),
        Section("A deliberate regression: fusion switched off",
                "The release candidate is the same matrix with [stack] fuse = false (the switch a "
                "compiler change that stops fusing amounts to). The check reruns every run unfused "
                "and compares it with the fused baseline: each fused group becomes separate kernels "
                "again, so kernels, launches, device time and energy regress on every run; where the "
                "fused kernel kept an intermediate on chip, the unfused one writes it to device "
                "memory, and peak device memory regresses too.",
                [Table(f"regressions caught ({off['regressions']} of {len(off['rows'])} rows)",
                       ["run", "metric", "baseline", "now", "change"],
                       [[r["run"], r["metric"], fmt_row_value(r, "baseline"), fmt_row_value(r, "now"),
                         "—" if r["change"] is None else f"{r['change']:+.1%}"] for r in bad])],
                ["kernels.png"]),
        Section(f"The ecosystem matrix: torch on {SPEC}",
                "`fornax matrix` runs nothing: it reads the stored fornax.qualify/1 documents in "
                "docs/evidence/ and gives each front end x family x chip x dtype the highest level L "
                "such that L0 .. L ran and every evidence row that applies to the dtype passed; a "
                "combination with no stored qualification is not qualified. The qualification "
                "contract measures PyTorch support, so only the torch front end gets levels; the "
                "real-client record (PyTorch's OpInfo database) is shown beside them, never as a level.",
                [Table(f"torch on {SPEC}", ["family", "dtype", "level", "evidence file", "real clients"],
                       [list(r) for r in eco])]),
    ]


def _picture(kernels: dict[tuple[str, str], tuple[int, int]], path: Path) -> None:
    fig = figure(6, 3.2)
    ax = fig.subplots()
    labels = [f"{w}\n{_SHORT[v]}" for w, v in kernels]
    xs = list(range(len(labels)))
    ax.bar([x - 0.2 for x in xs], [k[0] for k in kernels.values()], 0.4, label="baseline (fused)", color="C0")
    ax.bar([x + 0.2 for x in xs], [k[1] for k in kernels.values()], 0.4, label="fusion off", color="C3")
    ax.set_xticks(xs, labels)
    ax.set_ylabel("kernels launched")
    ax.set_title(f"graph front end on {SPEC}: kernels before and after")
    ax.set_ylim(0, 1.3 * max(max(k) for k in kernels.values()))
    ax.legend(loc="upper center", ncols=2)
    fig.savefig(path, format="png", dpi=90)


def facts() -> dict[str, Any]:
    _, _, off = _runs()
    bad = _regressions(off)
    per = {w: {r["metric"] for r in bad if r["run"].startswith(f"graph/{w}/")} for w in WORKLOADS}
    only = sorted(per["softmax"] - per["mlp"])
    levels = {(f, d): lv for f, d, lv, _, _ in _ecosystem()}
    return {"xpu_unfused_kernels": _row(off, _key("mlp", "xpu-like"), "kernels")["now"],
            "softmax_only_metric": ", ".join(only),
            "xpu_time_tolerance": _row(off, _key("mlp", "xpu-like"), "device_time_s")["change"],
            "rocm_float16_level": levels[("rocm-like", "float16")]}


def _check_matrix(answers: dict[str, Any], folder: Path, facts: dict[str, Any]) -> tuple[bool, str, str]:
    """matrix.toml: a matrix whose rerun with fusion off regresses peak device memory."""
    from fornax.release import plan
    want = f"a matrix whose rerun with fusion off is a regression on {TARGET}"
    path = folder / "matrix.toml"
    if not path.is_file():
        return False, want, "no matrix.toml"
    matrix = plan.load(path)            # a ConfigError names the first mistake
    runs = matrix.runs()
    if len(runs) > MAX_RUNS:
        return False, f"{want}, in at most {MAX_RUNS} runs", f"{len(runs)} runs"
    _, _, off = rerun_unfused(matrix)
    bad = _regressions(off)
    hit = sorted({r["run"] for r in bad if r["metric"] == TARGET})
    seen = ", ".join(sorted({r["metric"] for r in bad})) or "none"
    fuse = matrix.stack.get("fuse")
    where = f"{len(runs)} run(s), [stack] fuse = {'unset' if fuse is None else str(fuse).lower()}"
    if not hit:
        return False, want, f"{where}: fusion off regressed {seen}, not {TARGET}"
    return True, want, f"{where}: fusion off regressed {TARGET} on {', '.join(hit)}"


LAB = Lab(
    number=10, slug="10-qualification-and-release", title="Qualification and release", part="Part 10",
    goal="Hold a stack to a regression baseline: save one, check it unchanged, catch a deliberate "
         "regression (fusion switched off) metric by metric, and read which front end x family x "
         "chip x dtype is qualified at which level from stored evidence.",
    minutes=30, experiments=experiments, facts=facts,
    exercises=[
        Exercise("10.1", "With fusion switched off, how many kernels does the graph mlp launch on "
                 "xpu-like (the check's 'now' value)?", number_fact("10.1", "xpu_unfused_kernels"),
                 "the compiler seam's fusion pass (docs/regression.md: what a baseline holds)"),
        Exercise("10.2", "Which metric regresses for softmax but not for mlp when fusion is switched "
                 "off (its key, as the check names it)?", text_fact("10.2", "softmax_only_metric"),
                 "fornax/release/metrics.py: METRICS, and what a fused kernel keeps on chip"),
        Exercise("10.3", "The matrix lets device_time_s move by a relative 0.001. What is the smallest "
                 "relative tolerance (a fraction, e.g. 0.05) on device_time_s under which xpu-like "
                 "mlp's unfused device time would still pass? (within 2%)",
                 number_fact("10.3", "xpu_time_tolerance", rel=0.02),
                 "fornax/release/metrics.py: Tolerance.allows, |new - old| <= relative x |old|"),
        Exercise("10.4", "From the stored evidence, which level does the torch front end reach on "
                 f"rocm-like, {SPEC}, float16 (e.g. L3)?", text_fact("10.4", "rocm_float16_level"),
                 "fornax/release/ecosystem.py: level_for, per dtype, over docs/evidence/qualify/"),
        Exercise("10.5", f"Write matrix.toml (in this folder; at most {MAX_RUNS} runs): a matrix whose "
                 f"rerun with fusion switched off is flagged as a regression on {TARGET}.",
                 _check_matrix, "fornax/release/plan.py (the matrix TOML) and docs/regression.md",
                 points=2),
    ],
    starter_files={"matrix.toml": "# a regression matrix (data only): [matrix] vendors = [...], frameworks = "
                                  "[...], workloads = [...], specs = [...]; optional [stack] and "
                                  "[tolerances]\n"})
