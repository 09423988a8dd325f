"""The rendering of a report's ``parallel`` section (``fornax compose --parallel dp|tp``):
one row per rank and one per collective, with rich."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from .report import _shown, fmt_bytes, fmt_time


def render_parallel(sec: dict[str, Any], console: Console, all_rows: bool = False) -> None:
    """Per rank its simulated time, compute and communication; every collective; the scaling."""
    nodes = f", {sec['nodes']} nodes" if sec.get("nodes", 1) > 1 else ""
    title = f"parallel: {sec['mode']} over {sec['ranks']} ranks ({sec['communicator']}{nodes})"
    rows, caption = _shown(sec["per_rank"], all_rows)
    t = Table(title=title + " — simulated device time per rank", caption=caption)
    for col in ("rank", "device", "time", "compute", "communication", "exposed comm.", "idle"):
        t.add_column(col, justify="right")
    for p in rows:
        t.add_row(str(p["rank"]), str(p["device"]), fmt_time(p["time_s"]), fmt_time(p["compute_s"]),
                  fmt_time(p["communication_s"]), fmt_time(p["exposed_communication_s"]), fmt_time(p["idle_s"]))
    console.print(t)
    crow, ccap = _shown(sec["collectives"], all_rows)
    ct = Table(title=f"collectives ({len(sec['collectives'])}, "
                     f"{fmt_bytes(sec['communication_bytes'])} in all)", caption=ccap)
    for col in ("call", "bytes", "algorithm", "start", "time"):
        ct.add_column(col, justify="left" if col in ("call", "algorithm") else "right")
    for c in crow:
        ct.add_row(c["call"], fmt_bytes(c["bytes"]), c["algorithm"], fmt_time(c["start_s"]),
                   fmt_time(c["time_s"]))
    console.print(ct)
    console.print(f"split: {sec['split']}")
    console.print(f"scaling: slowest rank {fmt_time(sec['time_s'])} vs one device "
                  f"{fmt_time(sec['single_device_time_s'])} — speedup {sec['speedup']:.2f}x on "
                  f"{sec['ranks']} devices")
