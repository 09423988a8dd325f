"""Real clients on every family: PyTorch's own test databases and real models.

Per family: the pass rates of PyTorch's OpInfo (per dtype, and float32 backward), ModuleInfo
and OptimInfo databases run through PyTorch's device-generic harness
(:func:`fornax.contracts.torch_suite.run_suite`: the deterministic sample, or everything
with ``FORNAX_BENCH_FULL=1``); the ``transformers`` zoo (eager, compiled, generate, AdamW
training, against CPU); the equinox/optax programs (against ``jax.jit``).

The run is recorded in ``docs/evidence/real-clients.json`` and rendered into the section of
``docs/torch.md`` between the ``real-clients`` markers, so the figures the docs quote come
from this run, never typed by hand (``tests/test_docs_evidence.py`` checks the page is the
rendering of the record).
"""

from __future__ import annotations

import json
import os
import platform
import time
from importlib import metadata
from pathlib import Path

from rich.console import Console
from rich.table import Table
from fornax.stack import BUILTIN_FAMILIES

from .results import Figures

VENDORS = BUILTIN_FAMILIES
ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "evidence" / "real-clients.json"
PAGE = ROOT / "docs" / "torch.md"
BEGIN = "<!-- real-clients:begin (rendered by make bench from docs/evidence/real-clients.json) -->"
END = "<!-- real-clients:end -->"
GROUPS = ("float32", "float16", "bfloat16", "int64", "bool", "complex64", "float32.backward")
ZOO_MODES = ("eager", "compile", "generate", "train")
FIGURES = Figures("real_clients.opinfo_pass_rate[{family}: {group}]", "real_clients.{db}_pass_rate[{family}]",
                  "real_clients.zoo_modes_ok[{family}]", "real_clients.jax_programs_ok[{family}]",
                  "real_clients.wall_s[{family}: {part}]",
                  choices={"group": GROUPS, "db": ("moduleinfo", "optiminfo"), "part": ("suite", "zoo", "jax")})


def measure(vendors=VENDORS, full: bool = False) -> dict:
    """Run everything and return the record (a JSON-able dict)."""
    from fornax.contracts.torch_suite.runner import run_suite
    from fornax.scenarios import hf_zoo, jax_zoo

    record: dict = {"versions": {d: metadata.version(d) for d in
                                 ("fornax", "torch", "jax", "transformers", "equinox", "optax")},
                    "python": platform.python_version(), "full": full,
                    "suite": {}, "zoo": {}, "jax": {}, "wall_s": {}}
    for vendor in vendors:
        t0 = time.perf_counter()
        res = run_suite(vendor, full=full)
        record["suite"][vendor] = res.to_json()
        t1 = time.perf_counter()
        record["zoo"][vendor] = [r.to_json() for r in hf_zoo.run_zoo((vendor,))]
        t2 = time.perf_counter()
        record["jax"][vendor] = [jax_zoo.run_program(name, vendor).to_json() for name in jax_zoo.ZOO]
        record["wall_s"][vendor] = {"suite": round(t1 - t0, 1), "zoo": round(t2 - t1, 1),
                                    "jax": round(time.perf_counter() - t2, 1)}
    return record


def _rate(c: dict | None) -> str:
    if not c or not c["run"]:
        return "–"
    notes = [f"{c['tolerated']} tolerated" for _ in (0,) if c.get("tolerated")] + \
        [f"{c['known']} known" for _ in (0,) if c["known"]]
    return f"{100 * c['passed'] / c['run']:.2f} % of {c['run']}" + (f" ({', '.join(notes)})" if notes else "")


def render(record: dict) -> str:
    """The markdown section docs/torch.md carries (deterministic for a given record)."""
    v = record["versions"]
    scope = "every check" if record["full"] else "the deterministic sample (`make conformance-torch` runs everything)"
    lines = [BEGIN, "",
             f"Recorded by `make bench` with fornax {v['fornax']}, torch {v['torch']}, jax {v['jax']}, "
             f"transformers {v['transformers']}, equinox {v['equinox']}, optax {v['optax']} "
             f"(Python {record['python']}); PyTorch's databases: {scope}.", "",
             "PyTorch's own test databases on the device (passed / run; *tolerated*: passed only "
             "within a tolerance the family's known-failure table states with its cause; *known*: "
             "failures the table lists with a reason):", "",
             "| family | " + " | ".join(f"OpInfo {g}" for g in GROUPS) + " | ModuleInfo | OptimInfo |",
             "|---" * (len(GROUPS) + 3) + "|"]
    for vendor, suite in record["suite"].items():
        ops = suite["kinds"].get("ops", {})
        cells = [_rate(ops.get(g)) for g in GROUPS]
        cells += [_rate(suite["kinds"].get(k, {}).get("all")) for k in ("modules", "optims")]
        lines.append(f"| {vendor} | " + " | ".join(cells) + " |")
    lines += ["", "Real `transformers` models against the same model on the CPU (✓: outputs, "
              "every gradient, losses and parameters within tolerance, tokens identical; "
              "–: the model does not generate):", "",
              "| model | " + " | ".join(record["zoo"]) + " |", "|---" * (len(record["zoo"]) + 1) + "|"]
    models = [m["model"] for m in next(iter(record["zoo"].values()), [])]
    for name in models:
        cells = []
        for vendor, results in record["zoo"].items():
            r = next(x for x in results if x["model"] == name)
            cells.append(" ".join(f"{mode} {'✓' if r['modes'][mode]['ok'] else '✗'}"
                                  if mode in r["modes"] else f"{mode} –" for mode in ZOO_MODES))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "equinox/optax programs through `fornax.frameworks.jax.jit` against `jax.jit` "
              "(largest normwise error of any output; host fallbacks):", "",
              "| program | " + " | ".join(record["jax"]) + " |", "|---" * (len(record["jax"]) + 1) + "|"]
    programs = [p["program"] for p in next(iter(record["jax"].values()), [])]
    for name in programs:
        cells = []
        for vendor, results in record["jax"].items():
            r = next(x for x in results if x["program"] == name)
            worst = max((e["normwise"] for e in r["errors"].values()), default=float("nan"))
            mark = "✓" if r["ok"] else "✗"
            cells.append(f"{mark} {worst:.1e}, {len(r['fallbacks'])} fallbacks")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", END]
    return "\n".join(lines)


def write(record: dict) -> None:
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    text = PAGE.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    PAGE.write_text(text[:start] + render(record) + text[end:], encoding="utf-8")


def _record_figures(record: dict) -> None:
    """Pass rates (passed / run) and walls of the record, into bench.json."""
    def rate(name: str, c: dict | None, note: str = "") -> None:
        if c and c["run"]:
            FIGURES.record(name, c["passed"] / c["run"], "fraction", note=f"{c['passed']} of {c['run']}{note}")
    for vendor, suite in record["suite"].items():
        ops = suite["kinds"].get("ops", {})
        for g in GROUPS:
            rate(f"real_clients.opinfo_pass_rate[{vendor}: {g}]", ops.get(g))
        for db, kind in (("moduleinfo", "modules"), ("optiminfo", "optims")):
            rate(f"real_clients.{db}_pass_rate[{vendor}]", suite["kinds"].get(kind, {}).get("all"))
    for vendor, results in record["zoo"].items():
        modes = [m for r in results for m in r["modes"].values()]
        if modes:
            ok = sum(m["ok"] for m in modes)
            FIGURES.record(f"real_clients.zoo_modes_ok[{vendor}]", ok / len(modes), "fraction",
                           note=f"{ok} of {len(modes)} (model, mode) runs match the CPU")
    for vendor, results in record["jax"].items():
        if results:
            ok = sum(r["ok"] for r in results)
            FIGURES.record(f"real_clients.jax_programs_ok[{vendor}]", ok / len(results), "fraction",
                           note=f"{ok} of {len(results)} programs match jax.jit")
    for vendor, parts in record["wall_s"].items():
        for part, seconds in parts.items():
            FIGURES.record(f"real_clients.wall_s[{vendor}: {part}]", seconds, "s")


def main(vendors=VENDORS) -> None:
    full = os.environ.get("FORNAX_BENCH_FULL") == "1"
    record = measure(vendors, full)
    _record_figures(record)
    console = Console(width=max(Console().width, 140))
    t = Table(title="PyTorch's test databases on fornax (pass rate per family and dtype; "
                    + ("everything)" if full else "deterministic sample)"))
    t.add_column("family")
    for g in (*GROUPS, "ModuleInfo", "OptimInfo"):
        t.add_column(g, justify="right")
    for vendor, suite in record["suite"].items():
        ops = suite["kinds"].get("ops", {})
        t.add_row(vendor, *[_rate(ops.get(g)) for g in GROUPS],
                  *[_rate(suite["kinds"].get(k, {}).get("all")) for k in ("modules", "optims")])
    console.print(t)
    z = Table(title="transformers zoo vs CPU (eager / compile / generate / train)")
    z.add_column("model")
    for vendor in record["zoo"]:
        z.add_column(vendor)
    for name in [m["model"] for m in next(iter(record["zoo"].values()))]:
        row = []
        for results in record["zoo"].values():
            r = next(x for x in results if x["model"] == name)
            row.append(" ".join(("ok" if m["ok"] else f"[red]{mode} FAIL[/]") for mode, m in r["modes"].items()))
        z.add_row(name, *row)
    console.print(z)
    j = Table(title="equinox/optax programs vs jax.jit")
    j.add_column("program")
    for vendor in record["jax"]:
        j.add_column(vendor)
    for name in [p["program"] for p in next(iter(record["jax"].values()))]:
        row = []
        for results in record["jax"].values():
            r = next(x for x in results if x["program"] == name)
            row.append("ok" if r["ok"] else f"[red]FAIL[/] {r['error'][:60]}")
        j.add_row(name, *row)
    console.print(j)
    write(record)
    console.print(f"recorded in {RECORD.relative_to(ROOT)}; {PAGE.relative_to(ROOT)} re-rendered")
