"""Cold and warm compile times of the transformer block, per family.

Cold: a fresh compiler with the disk cache off compiles the graph from
scratch (every pass, code generation and encoding).  Warm: the same
compiler asked again for the same graph, target and options (a compile-cache
hit).  Targets: under 2 s cold, under 100 ms warm.
"""

from __future__ import annotations

import os
import time

from rich.console import Console
from rich.table import Table

from fornax.scenarios.workloads import get_workload
from fornax.stack import compose, make_config
from fornax.stack import BUILTIN_FAMILIES

from .results import Figures

COLD_TARGET_S, WARM_TARGET_S = 2.0, 0.1
FIGURES = Figures("compile.cold_s[{family}]", "compile.warm_s[{family}]", "compile.kernels[{family}]",
                  choices={"family": BUILTIN_FAMILIES})


def measure(vendor: str) -> tuple[float, float, int]:
    stack = compose(make_config(vendor))
    graph, _ = get_workload("transformer-block").build(0)
    routines = stack.library.ops()
    t0 = time.perf_counter()
    plan = stack.compiler.compile(graph, stack.target, routines)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = stack.compiler.compile(graph, stack.target, routines)
    warm = time.perf_counter() - t0
    assert again.binary == plan.binary
    return cold, warm, plan.stats["kernels"]


def main() -> None:
    previous = os.environ.get("FORNAX_CACHE_DIR")
    os.environ["FORNAX_CACHE_DIR"] = "off"            # cold means cold: no disk entry from a prior run
    try:
        table = Table(title=f"transformer-block compile time (targets: cold < {COLD_TARGET_S:g} s, "
                            f"warm < {WARM_TARGET_S * 1e3:g} ms)")
        for col in ("vendor", "kernels", "cold", "warm (cache hit)", "within targets"):
            table.add_column(col, justify="left" if col == "vendor" else "right")
        for vendor in BUILTIN_FAMILIES:
            cold, warm, kernels = measure(vendor)
            ok = cold < COLD_TARGET_S and warm < WARM_TARGET_S
            FIGURES.record(f"compile.cold_s[{vendor}]", cold, "s", target=COLD_TARGET_S)
            FIGURES.record(f"compile.warm_s[{vendor}]", warm, "s", target=WARM_TARGET_S)
            FIGURES.record(f"compile.kernels[{vendor}]", kernels, "count")
            table.add_row(vendor, str(kernels), f"{cold * 1e3:.1f} ms", f"{warm * 1e3:.3f} ms",
                          "yes" if ok else "no")
        Console().print(table)
    finally:
        if previous is None:
            os.environ.pop("FORNAX_CACHE_DIR", None)
        else:
            os.environ["FORNAX_CACHE_DIR"] = previous


if __name__ == "__main__":
    main()
