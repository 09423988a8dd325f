"""Churn: 10^4 cycles of every runtime handle on every family (``fornax.scenarios.churn``).

Each cycle allocates and frees, creates and destroys a stream and an event, loads and
unloads a module, captures, replays and destroys a graph.  After the run the device's
memory statistics are zero, the handle tables hold only the primary context, and the
host's resident set grew by at most the stated bound (the timeline's and the kernel
log's bounded histories and the power model's bounded samples; everything else is
returned).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fornax.scenarios.churn import churn
from fornax.stack import compose, make_config
from fornax.stack import BUILTIN_FAMILIES

from .results import Figures

CYCLES = 10_000
RSS_BOUND = 64 << 20           # host bytes a 10^4-cycle churn may add
FIGURES = Figures("churn.{what}[{family}]",
                  choices={"what": ("wall_s", "per_cycle_s", "rss_growth", "device_bytes_after", "clean")})


def main(cycles: int = CYCLES) -> list[dict]:
    console = Console()
    table = Table(title=f"Churn: {cycles:,} cycles per family (alloc/free, stream, event, module, "
                        f"graph); host RSS bound {RSS_BOUND >> 20} MiB")
    for col in ("family", "wall", "per cycle", "handles after", "device bytes", "RSS growth", "clean"):
        table.add_column(col, justify="left" if col in ("family", "handles after") else "right")
    rows = []
    for vendor in BUILTIN_FAMILIES:
        r = churn(compose(make_config(vendor)), cycles)
        ok = r.clean and r.rss_growth <= RSS_BOUND
        live = {k: v for k, v in r.handles_after.items() if v}
        table.add_row(vendor, f"{r.wall_s:.1f} s", f"{r.wall_s / cycles * 1e3:.2f} ms",
                      ", ".join(f"{k} {v}" for k, v in live.items()) or "none",
                      str(r.device_used_after), f"{r.rss_growth / 2**20:.1f} MiB",
                      "yes" if ok else "NO")
        rows.append({**r.to_dict(), "within_bound": ok})
        FIGURES.record(f"churn.wall_s[{vendor}]", r.wall_s, "s", note=f"{cycles:,} cycles")
        FIGURES.record(f"churn.per_cycle_s[{vendor}]", r.wall_s / cycles, "s")
        FIGURES.record(f"churn.rss_growth[{vendor}]", r.rss_growth, "bytes", target=RSS_BOUND)
        FIGURES.record(f"churn.device_bytes_after[{vendor}]", r.device_used_after, "bytes", target=0)
        FIGURES.record(f"churn.clean[{vendor}]", int(r.clean), "bool", target=1, kind="min",
                       note="device memory statistics zero and only the primary context left")
    console.print(table)
    return rows


if __name__ == "__main__":
    main()
