"""Lab 1: the support contract -- what "supports PyTorch" means, level by level.

Experiments: ``fornax qualify``'s cheap levels (L0 device discovered, L1 allocation, copies,
views) run live on each family through the Python API with the level selection
``fornax qualify --level`` uses; the higher levels (L2-L7: OpInfo, autograd, compile,
numerics, distributed, failure handling; about 90 s a family) are read from the stored
``fornax.qualify/1`` documents in ``docs/evidence/qualify/``.

Exercise 1.4 loads the student's own ``stack.toml`` (data, through fornax.stack.load_config)
and qualifies that stack live at the level of the evidence row the student names.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..layers.errors import ConfigError
from .lab import Exercise, Lab, Section, Table, answer, figure, number_fact, text_fact

FAMILIES = ("cuda-like", "rocm-like", "xpu-like")
LIVE = ("L0", "L1")                    # the cheap levels, run live


def _rows(q: Any) -> list[dict[str, Any]]:
    """The evidence rows of a live Qualification, as the stored documents spell them."""
    return [{"level": lr.level.id, "check": f"{lr.level.id}.{e.clause.id}", "passed": bool(e.passed),
             "value": e.value, "measured": e.clause.measure.measured if e.clause.measure else "",
             "detail": e.detail}
            for lr in q.levels if lr.ran for e in lr.evidence]


@lru_cache(maxsize=1)
def _live() -> dict[str, dict[str, Any]]:
    """L0 and L1 qualified live on each family's stack."""
    from fornax.qualify import qualify
    from fornax.stack import make_config
    out = {}
    for fam in FAMILIES:
        q = qualify(make_config(fam), list(LIVE))
        out[fam] = {"stack": q.stack, "verdict": q.verdict or "none", "rows": _rows(q),
                    "status": {lr.level.id: lr.status for lr in q.levels if lr.ran}}
    return out


@lru_cache(maxsize=1)
def _stored() -> dict[str, dict[str, Any]]:
    """Each family's stored fornax.qualify/1 document (every level, recorded by `fornax qualify
    --vendor V --json`)."""
    from fornax.qualify_clients import source_root
    root = source_root()
    folder = root / "docs" / "evidence" / "qualify" if root is not None else None
    out = {}
    for fam in FAMILIES:
        path = folder / f"{fam}.json" if folder is not None else None
        if path is None or not path.is_file():
            raise ConfigError(f"no stored qualification for {fam} (docs/evidence/qualify/{fam}.json)",
                              hint="lab 1 reads the checkout's stored evidence; run it from a fornax checkout")
        out[fam] = json.loads(path.read_text(encoding="utf-8"))
    return out


def _level_order() -> tuple[str, ...]:
    from fornax.qualify import LEVEL_IDS
    return tuple(LEVEL_IDS)


def experiments(out: Path) -> list[Section]:
    live, stored = _live(), _stored()
    _picture(stored, out / "evidence-per-level.png")
    live_rows = []
    for fam, d in live.items():
        for r in d["rows"]:
            live_rows.append([fam, r["check"], "pass" if r["passed"] else "FAIL",
                              f"{r['measured']}: {r['value']}"])
    first = stored[FAMILIES[0]]
    level_rows = [[lv["level"], lv["title"], ", ".join(e["check"].split(".", 1)[1] for e in lv["evidence"])]
                  for lv in first["levels"]]
    verdict_rows = [[fam, doc["stack"], doc["verdict"] or "none",
                     " ".join(f"{lv['level']}:{lv['status']}" for lv in doc["levels"]),
                     str(sum(len(lv["evidence"]) for lv in doc["levels"]))] for fam, doc in stored.items()]
    return [
        Section("L0 and L1, live",
                "`qualify(make_config(family), ['L0', 'L1'])` -- the Python API with the level selection "
                "`fornax qualify --vendor V --level L0 --level L1` uses -- on each family's stack, run "
                "live now. L0 asks the driver to enumerate and describe the device, PyTorch's "
                "`torch.fornax` face and the JAX client to see it in the family's vocabulary, and a fresh "
                "interpreter's `import torch` to register it; L1 sends five dtypes to the device and back "
                "bit for bit, compares eight views with CPU's sizes, strides and offsets, and watches "
                "`memory_allocated()` follow a 4 MiB tensor. A level passes when every evidence row does.",
                [Table("live evidence rows (L0, L1)", ["family", "evidence row", "result", "measured"],
                       live_rows),
                 Table("live verdicts", ["family", "stack", "L0", "L1", "verdict over L0-L1"],
                       [[fam, d["stack"], d["status"]["L0"], d["status"]["L1"], d["verdict"]]
                        for fam, d in live.items()])]),
        Section("Every level, from the stored evidence",
                "A full qualification runs the real clients too (PyTorch's OpInfo, ModuleInfo and "
                "OptimInfo databases, eight `transformers` models, JAX programs) and takes about a minute "
                "and a half per family, too slow for a lab run. These rows are read from the stored "
                "documents `fornax qualify --vendor V --json` wrote into docs/evidence/qualify/ "
                "(schema fornax.qualify/1), not run now. The verdict is the highest level L such that "
                "L0 .. L all pass.",
                [Table("the levels and their evidence rows", ["level", "title", "evidence rows"],
                       level_rows),
                 Table("stored verdicts", ["family", "stack", "verdict", "levels", "evidence rows"],
                       verdict_rows)], ["evidence-per-level.png"]),
        Section("Breaking a level on purpose",
                "A level is only a promise if a stack can fail it. Exercise 1.4 asks for a stack config "
                "(stack.toml: [stack] vendor, [stack.seams] per seam) that composes a stack which fails L0 "
                "or L1 when qualified live, and for the evidence row that catches it. Read what each "
                "cheap level checks (fornax/qualify/l0_device.py, l1_memory.py): which seam answers each "
                "question, and what happens when the seam that asks and the seam that answers come from "
                "different families.", []),
    ]


def _picture(stored: dict[str, dict[str, Any]], path: Path) -> None:
    fig = figure(7, 3.2)
    ax = fig.subplots()
    levels = [lv["level"] for lv in stored[FAMILIES[0]]["levels"]]
    width = 0.26
    for i, (fam, doc) in enumerate(stored.items()):
        by = {lv["level"]: lv for lv in doc["levels"]}
        xs = [j + (i - 1) * width for j in range(len(levels))]
        ok = [sum(e["passed"] for e in by[lv]["evidence"]) if lv in by else 0 for lv in levels]
        bad = [len(by[lv]["evidence"]) - o if lv in by else 0 for lv, o in zip(levels, ok)]
        ax.bar(xs, ok, width, color=f"C{i}", label=f"{fam} (passed)")
        ax.bar(xs, bad, width, bottom=ok, color="C3", hatch="//")
    ax.set_xticks(range(len(levels)), levels)
    top = max(len(lv["evidence"]) for doc in stored.values() for lv in doc["levels"])
    ax.set_ylim(0, top + 1.6)
    ax.set_ylabel("evidence rows")
    ax.set_title("stored qualification: evidence rows per level (red: failed)")
    ax.legend(fontsize=7, ncols=3, loc="upper left")
    fig.savefig(path, format="png", dpi=90)


def facts() -> dict[str, Any]:
    live, stored = _live(), _stored()
    order = _level_order()
    verdicts = [doc["verdict"] for doc in stored.values()]
    common = "none" if None in verdicts else min(verdicts, key=order.index)
    autocast = next(lv["level"] for lv in stored["xpu-like"]["levels"]
                    for e in lv["evidence"] if e["check"].endswith(".autocast"))
    face = next(r["value"] for r in live["rocm-like"]["rows"] if r["check"] == "L0.torch")
    return {"common_verdict": common, "autocast_level": autocast,
            "rocm_face_fields": int(str(face).split("/")[0])}


def _check_break(answers: dict[str, Any], folder: Path, facts: dict[str, Any]) -> tuple[bool, str, str]:
    """stack.toml composes a stack that fails L0 or L1 live, caught by the named evidence row."""
    from fornax.qualify import EVIDENCE, qualify
    from fornax.stack import load_config
    known = [f"{lv}.{c.id}" for lv in LIVE for c in EVIDENCE.get(lv, [])]
    row = str(answer(answers, "1.4")).strip()
    want = f"a stack.toml whose stack fails L0 or L1 live, and ex1_4 naming a failing row ({', '.join(known)})"
    if row not in known:
        return False, want, f"ex1_4 = {row!r}, not an evidence row of L0 or L1" if row else "ex1_4 is blank"
    path = folder / "stack.toml"
    if not path.is_file():
        return False, want, "no stack.toml"
    cfg = load_config(str(path))
    level = row.split(".", 1)[0]
    try:
        q = qualify(cfg, [level])
    except ConfigError:
        raise
    except Exception as exc:     # noqa: BLE001 - qualify should not raise; say what happened if it does
        return False, want, f"qualifying the stack raised {type(exc).__name__}: {str(exc)[:160]}"
    rows = _rows(q)
    failing = [r for r in rows if not r["passed"]]
    if not failing:
        return False, f"{level} fails on your stack, caught by {row}", \
            f"{level} passes on {q.stack}: every evidence row ({', '.join(r['check'] for r in rows)}) passed"
    hit = next((r for r in failing if r["check"] == row), None)
    if hit is None:
        return False, f"{level} fails on your stack, caught by {row}", \
            (f"{level} fails on {q.stack}, but {row} passed; the failing rows: "
             f"{', '.join(r['check'] for r in failing)}")
    return True, f"{level} fails, caught by {row}", f"{level} fails on {q.stack}: {row}: {hit['detail'][:200]}"


LAB = Lab(
    number=1, slug="01-support-contract", title="The support contract", part="Part 1",
    goal="Read `fornax qualify`'s answer to \"does this stack support PyTorch?\": eight levels, each a "
         "promise backed by evidence rows; run the cheap levels live on each family, read the rest from "
         "the stored evidence, and break a level on purpose.",
    minutes=25, experiments=experiments, facts=facts,
    exercises=[
        Exercise("1.1", "From the stored evidence, what is the highest verdict every family reaches "
                 "(a level id, e.g. L3)?", text_fact("1.1", "common_verdict"),
                 "docs/evidence/qualify/*.json: each document's verdict (fornax/qualify/report.py)"),
        Exercise("1.2", "Which level holds the evidence row that checks autocast picks the family's "
                 "dtype (a level id)?", text_fact("1.2", "autocast_level"),
                 "docs/qualify.md, the levels table, and fornax/qualify/l5_numerics.py"),
        Exercise("1.3", "In the live run, how many property fields does L0.torch find on rocm-like's "
                 "torch face (the number before the slash)?", number_fact("1.3", "rocm_face_fields"),
                 "the framework seam's torch face: [framework.torch] properties in rocm_like/vendor.toml"),
        Exercise("1.4", "Write stack.toml (in this folder): a stack that fails L0 or L1 when qualified "
                 "live, and answer with the evidence row that catches it (e.g. L1.views). The check "
                 "loads your stack.toml as data and qualifies that stack live at that row's level.",
                 _check_break, "fornax/qualify/l0_device.py and l1_memory.py: which seam answers each "
                 "check, and what a seam of another family gives it", points=2),
    ],
    starter_files={"stack.toml": "# a stack config: [stack] vendor = ..., [stack.seams] framework = ..., "
                                 "driver = ...\n"})
