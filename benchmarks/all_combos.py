"""All 243 seam combinations (``fornax compare --all-combos``) in one command, timed end to end.

Opt-in (slow): ``python -m benchmarks`` runs it only with ``FORNAX_BENCH_COMBOS=1``;
``python -m benchmarks.all_combos`` runs it always.  The command is run as a user runs it, in
a fresh process (``python -m fornax.cli compare --all-combos --json``, the default workload,
front end and chip spec, ``--jobs`` one worker per CPU), and its host wall time — start-up,
every combination and its strict-mode twin, the native baselines — is the figure.  Target:
under ``WALL_TARGET_S`` (5 minutes) on a 2-core machine.  The document's own sweep time,
the number of combinations and of failed ones are recorded beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .results import Figures

ENV = "FORNAX_BENCH_COMBOS"
WALL_TARGET_S = 300.0          # 243 combinations under 5 minutes on 2 cores
FRAMEWORK = "graph"
FIGURES = Figures("combos.{what}[{framework}]",
                  choices={"what": ("wall_s", "sweep_s", "combinations", "failed"),
                           "framework": ("graph", "torch", "jax")})


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


def run(framework: str = FRAMEWORK, jobs: int | None = None) -> tuple[float, dict]:
    """(host wall seconds, the ``fornax.combos/1`` document) of one ``--all-combos`` run."""
    jobs = jobs or os.cpu_count() or 1
    cmd = [sys.executable, "-m", "fornax.cli", "compare", "--all-combos", "--json",
           "--framework", framework, "--jobs", str(jobs)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                          cwd=Path(__file__).resolve().parents[1])
    wall = time.perf_counter() - t0
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"{' '.join(cmd[1:])} exited {proc.returncode} without a document:\n"
                           f"{proc.stderr[-2000:]}") from None
    return wall, doc


def main(framework: str = FRAMEWORK) -> None:
    wall, doc = run(framework)
    rows = doc["rows"]
    failed = sum(r["status"] != "ok" for r in rows)
    fig = FIGURES.record(f"combos.wall_s[{framework}]", wall, "s", target=WALL_TARGET_S,
                         note=f"fornax compare --all-combos --framework {framework} --jobs {doc['jobs']}, "
                              "a fresh process")
    FIGURES.record(f"combos.sweep_s[{framework}]", doc["elapsed_s"], "s", note="the document's elapsed_s")
    FIGURES.record(f"combos.combinations[{framework}]", len(rows), "count")
    FIGURES.record(f"combos.failed[{framework}]", failed, "count", target=0)
    table = Table(title=f"fornax compare --all-combos ({framework}, {doc['jobs']} workers): every seam "
                        f"combination; target < {WALL_TARGET_S:.0f} s wall")
    for col in ("combinations", "failed", "host wall", "of which the sweep", "target met"):
        table.add_column(col, justify="right")
    table.add_row(str(len(rows)), str(failed), f"{wall:.1f} s", f"{doc['elapsed_s']:.1f} s",
                  "yes" if fig["met"] else "no")
    Console().print(table)


if __name__ == "__main__":
    main()
