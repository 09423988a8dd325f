"""Shape-only (meta) mode at scale: one Llama-2-70B-like training step on 8 H200-like devices.

Prints, per vendor family, the host wall time of the whole step (graph build,
compile and the simulated run), the peak host memory of the process
(``ru_maxrss``, which only grows, so later rows include earlier ones), the
simulated step time and the per-device peak HBM.  Targets: under 30 s of wall
time and 2 GiB of host memory per step.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from fornax.scenarios.llm import LlamaConfig, simulate_step
from fornax.stack import BUILTIN_FAMILIES

from .results import Figures

WALL_TARGET_S = 30.0
RSS_TARGET_BYTES = 2 * 2**30
FIGURES = Figures("shape_only.{what}[{family}]",
                  choices={"what": ("wall_s", "compile_s", "peak_host_rss", "simulated_step_s", "compute_s",
                                    "communication_s", "mfu", "peak_hbm_per_device")})


def main(vendors=BUILTIN_FAMILIES) -> None:
    cfg = LlamaConfig()
    table = Table(title=f"Llama-2-70B-like training step, shape-only, 8 x h200-like (tp=8, "
                        f"seq {cfg.seq}, micro-batch {cfg.batch}); targets: < {WALL_TARGET_S:.0f} s "
                        f"wall, < {RSS_TARGET_BYTES / 2**30:.0f} GiB host")
    for col in ("vendor", "host wall", "of which compile", "peak host RSS", "simulated step",
                "compute / comm", "MFU", "peak HBM / device"):
        table.add_column(col, justify="left" if col == "vendor" else "right")
    for vendor in vendors:
        t0 = time.perf_counter()
        rep, _, _ = simulate_step(vendor, devices=8, cfg=cfg)
        wall = time.perf_counter() - t0
        FIGURES.record(f"shape_only.wall_s[{vendor}]", wall, "s", target=WALL_TARGET_S)
        FIGURES.record(f"shape_only.compile_s[{vendor}]", rep.compile_wall_s, "s")
        FIGURES.record(f"shape_only.peak_host_rss[{vendor}]", rep.peak_host_rss_bytes, "bytes",
                       target=RSS_TARGET_BYTES, note="ru_maxrss of the process: only grows, so later "
                       "families include earlier ones")
        FIGURES.record(f"shape_only.simulated_step_s[{vendor}]", rep.step_time_s, "s")
        FIGURES.record(f"shape_only.compute_s[{vendor}]", rep.compute_s, "s")
        FIGURES.record(f"shape_only.communication_s[{vendor}]", rep.communication_s, "s")
        FIGURES.record(f"shape_only.mfu[{vendor}]", rep.mfu, "fraction")
        FIGURES.record(f"shape_only.peak_hbm_per_device[{vendor}]", rep.peak_hbm_bytes, "bytes")
        table.add_row(vendor, f"{wall:.2f} s", f"{rep.compile_wall_s:.2f} s",
                      f"{rep.peak_host_rss_bytes / 2**30:.2f} GiB", f"{rep.step_time_s:.3f} s",
                      f"{rep.compute_s:.3f} s / {rep.communication_s:.3f} s", f"{rep.mfu:.1%}",
                      f"{rep.peak_hbm_bytes / 1e9:.1f} GB")
    Console().print(table)


if __name__ == "__main__":
    main()
