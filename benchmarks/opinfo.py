"""PyTorch OpInfo coverage of the eager ``fornax`` device, per vendor (issue 7, item 5).

The float32 ``sample_inputs`` of the 150 most used ops (``fornax.frameworks.torch.opinfo.
TOP_OPS``, OpInfos of PyTorch's ``op_db``) run on each family's stack and on CPU eager and
are compared with PyTorch's tolerances.  Per vendor: samples run and passed, the pass rate
(target: at least 95 %), the ops the framework seam claims as native (no ATen op of theirs
fell back to the CPU) and their pass rate, and the worst ops with their first error.

Every op runs its first ``MAX_SAMPLES`` samples (about 1500 per vendor, 30-60 s each on two
cores); ``main(max_samples=None)`` runs every sample (~3100, ~2.5 min per vendor, most of
it in ``max_pool2d``'s 1440 samples).
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from fornax.stack import BUILTIN_FAMILIES

from .results import Figures

VENDORS = BUILTIN_FAMILIES
MAX_SAMPLES = 32
TARGET = 0.95
WORST = 8
FIGURES = Figures("opinfo.{what}[{family}]",
                  choices={"what": ("pass_rate", "native_pass_rate", "samples", "native_ops", "wall_s")})


def sweep(vendors=VENDORS, max_samples: int | None = MAX_SAMPLES) -> dict:
    """``{vendor: (Summary, wall seconds)}`` of the OpInfo run on each family's stack."""
    import fornax.frameworks.torch as ft
    from fornax.frameworks.torch import opinfo

    opinfo.op_db()
    out = {}
    for vendor in vendors:
        ft.use_stack(vendor)
        t0 = time.perf_counter()
        out[vendor] = (opinfo.run_opinfo(max_samples=max_samples), time.perf_counter() - t0)
    return out


def main(vendors=VENDORS, max_samples: int | None = MAX_SAMPLES) -> None:
    console = Console(width=max(Console().width, 120))
    results = sweep(vendors, max_samples)
    cap = "all samples" if max_samples is None else f"first {max_samples} samples per op"
    table = Table(title=f"PyTorch OpInfo float32 samples of the 150 most used ops on fornax vs CPU eager "
                        f"({cap}; target ≥ {TARGET:.0%})")
    for col in ("stack", "samples", "passed", "pass rate", "native ops", "native pass rate", "target met",
                "wall"):
        table.add_column(col, justify="left" if col == "stack" else "right")
    for vendor, (s, wall) in results.items():
        FIGURES.record(f"opinfo.pass_rate[{vendor}]", s.rate, "fraction", target=TARGET, kind="min",
                       note=f"{s.passed} of {s.run} samples ({cap})")
        FIGURES.record(f"opinfo.native_pass_rate[{vendor}]", s.native_rate, "fraction")
        FIGURES.record(f"opinfo.samples[{vendor}]", s.run, "count")
        FIGURES.record(f"opinfo.native_ops[{vendor}]", len(s.native), "count", note=f"of {len(s.results)}")
        FIGURES.record(f"opinfo.wall_s[{vendor}]", wall, "s")
        table.add_row(vendor, str(s.run), str(s.passed), f"{s.rate:.1%}", f"{len(s.native)}/{len(s.results)}",
                      f"{s.native_rate:.1%}", "yes" if s.rate >= TARGET else "[red]no[/red]", f"{wall:.0f} s")
    console.print(table)
    worst = Table(title="worst ops (failed samples per stack, first error)")
    for col in ("stack", "op", "failed", "first error"):
        worst.add_column(col, justify="right" if col == "failed" else "left", overflow="fold")
    rows = 0
    for vendor, (s, _) in results.items():
        for r in s.failing()[:WORST]:
            worst.add_row(vendor, r.name, f"{r.failed}/{r.run}", escape(r.first_error[:200]))
            rows += 1
    if rows:
        console.print(worst)
    else:
        console.print("[green]no failing samples on any stack[/green]")
    host = Table(title=f"ops not claimed native on {next(iter(results))}: the ATen ops that fell back "
                       "to the CPU, and why")
    for col in ("op", "fell back", "why (first)"):
        host.add_column(col, overflow="fold")
    first = next(iter(results.values()))[0]
    for r in first.results:
        if not r.native and r.run:
            host.add_row(r.name, ", ".join(f.removeprefix("aten::") for f in r.fallbacks),
                         escape(r.why_not_native[:120]))
    console.print(host)

if __name__ == "__main__":
    main()
