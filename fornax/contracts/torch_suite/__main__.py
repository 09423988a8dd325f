"""``python -m fornax.contracts.torch_suite``: the torch suite on each family, with a progress
bar and a per-dtype summary (what ``make conformance-torch`` runs).

    python -m fornax.contracts.torch_suite [--family F ...] [--sample] [--kinds ops,modules]
                                           [--only NAME,...] [--dtypes float32,...] [--json PATH]

Everything by default (``--sample``: the fixed sample ``make test`` takes).  Exit status 1
when a check failed that no known-failure entry covers, an entry is stale, a group is under
its pass-rate target, or a subprocess broke.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .known import FAMILIES
from .result import target
from .runner import KINDS, run_suite


def _table(results) -> Table:
    t = Table(title="PyTorch's OpInfo / ModuleInfo / OptimInfo checks on fornax (samples; modules and "
                    "optimizers: checks)")
    for col in ("family", "kind", "group", "run", "passed", "tolerated", "known", "failed", "stale", "rate", "target"):
        t.add_column(col, justify="right" if col not in ("family", "kind", "group") else "left")
    for r in results:
        for kind, groups in r.kinds.items():
            for group, c in sorted(groups.items()):
                goal = target(kind, group)
                style = "green" if c.rate >= goal and not c.failed and not c.stale else "red"
                t.add_row(r.vendor, kind, group, str(c.run), str(c.passed), str(c.tolerated), str(c.known), str(c.failed),
                          str(c.stale), f"[{style}]{c.rate:.2%}[/]", f"{goal:.1%}")
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fornax.contracts.torch_suite", description=__doc__.splitlines()[0])
    ap.add_argument("--family", action="append", choices=FAMILIES, help="repeatable; default: every family")
    ap.add_argument("--sample", action="store_true", help="the fixed sample instead of everything")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated: ops, modules, optims")
    ap.add_argument("--only", default="", help="comma-separated OpInfo / ModuleInfo / OptimInfo names")
    ap.add_argument("--dtypes", default="", help="comma-separated OpInfo dtypes (default: all six)")
    ap.add_argument("--json", help="write every family's SuiteResult.to_json() here")
    args = ap.parse_args(argv)
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    only = tuple(n for n in args.only.split(",") if n)
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
                  TimeElapsedColumn(), console=console) as bar:
        for family in args.family or FAMILIES:
            task = bar.add_task(family, total=0, note="")
            counts = {"failed": 0}

            def on_event(e, task=task, counts=counts):
                if e["event"] == "collected":
                    bar.update(task, total=bar.tasks[task].total + e["total"])
                elif e["event"] == "test":
                    bar.advance(task)
                elif e["event"] == "check" and e["outcome"] in ("failed", "stale"):
                    counts["failed"] += 1
                    bar.update(task, note=f"[red]{counts['failed']} unexpected[/]")

            results.append(run_suite(family, full=not args.sample, kinds=kinds, progress=on_event, only=only,
                                     dtypes=tuple(d for d in args.dtypes.split(",") if d)))
    console.print(_table(results))
    bad = False
    for r in results:
        for f in r.failures[:40]:
            console.print(f"[red]{r.vendor} FAILED[/] {f['kind']} {f['name']} {f['dtype']} {f['variant']}: {f['error']}")
        for s in r.stale:
            console.print(f"[red]{r.vendor} STALE[/] {s}: it passes now; remove it from the table")
        for e in r.errors:
            console.print(f"[red]{r.vendor} BROKEN[/] {e}")
        for group, (rate, goal) in r.below_target().items():
            console.print(f"[red]{r.vendor} BELOW TARGET[/] {group}: {rate:.2%} < {goal:.1%}")
        bad = bad or not r.ok or bool(r.below_target())
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.to_json() for r in results], f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
