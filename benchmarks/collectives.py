"""All-reduce bus bandwidth over 8 simulated H200-like devices, nccl-tests style.

For each fabric (switch, mesh, ring) and message size, one all-reduce per
algorithm (ring, tree, and the library's own choice) runs in shape-only mode
on the cuda-like stack (the schedule and costs are shared policy; the
families differ in names and codes).  Columns follow nccl-tests: size, time,
algbw = S/t and busbw = algbw * 2(N-1)/N, in GB/s of simulated time.  On real
systems busbw rises with size until the fabric's link bandwidth bounds it.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from fornax.stack import compose, make_config

from .results import Figures

DEVICES = 8
SIZES = [1 << k for k in range(10, 29, 2)]          # 1 KiB .. 256 MiB
FABRICS = ("switch", "mesh", "ring")
FIGURES = Figures("collectives.wall_s[{fabric}]", "collectives.{what}[{fabric}: {size}: {algorithm}]",
                  choices={"fabric": FABRICS, "what": ("time_s", "busbw"),
                           "algorithm": ("ring", "tree", "auto")})


def _fmt(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def sweep(fabric: str, vendor: str = "cuda-like", spec: str = "h200-like") -> list[dict]:
    stack = compose(make_config(vendor, spec=spec, devices=DEVICES, topology=fabric, meta=True))
    comm = stack.communicator()
    rows = []
    for nbytes in SIZES:
        bufs = [comm.malloc(r, nbytes) for r in range(DEVICES)]
        row = {"bytes": nbytes}
        for algo in ("ring", "tree", None):
            for r in range(DEVICES):
                comm.rank(r).all_reduce(bufs[r], bufs[r], nbytes // 4, "float32", algorithm=algo)
            rec = comm.records[-1]
            row[algo or "auto"] = rec
        rows.append(row)
        for r in range(DEVICES):
            stack.runtime.set_device(r)
            stack.runtime.free(bufs[r])
        stack.runtime.set_device(0)
    return rows


def main() -> None:
    console = Console()
    for fabric in FABRICS:
        t0 = time.perf_counter()
        rows = sweep(fabric)
        wall = time.perf_counter() - t0
        FIGURES.record(f"collectives.wall_s[{fabric}]", wall, "s", note="host wall of the sweep")
        for row in rows:
            for algo in ("ring", "tree", "auto"):
                rec, where = row[algo], f"{fabric}: {_fmt(row['bytes'])}: {algo}"
                note = f"simulated; chosen: {rec.algorithm}" if algo == "auto" else "simulated"
                FIGURES.record(f"collectives.time_s[{where}]", rec.time_s, "s", note=note)
                FIGURES.record(f"collectives.busbw[{where}]", rec.busbw / 1e9, "GB/s", note=note)
        table = Table(title=f"all-reduce float32 sum, {DEVICES} x h200-like, {fabric} fabric, "
                            f"shape-only (host wall {wall:.2f} s)")
        for col in ("size", "ring time", "ring busbw", "tree time", "tree busbw", "chosen",
                    "algbw", "busbw"):
            table.add_column(col, justify="right", no_wrap=True)
        for row in rows:
            ring, tree, auto = row["ring"], row["tree"], row["auto"]
            table.add_row(_fmt(row["bytes"]), f"{ring.time_s * 1e6:.1f} us",
                          f"{ring.busbw / 1e9:.2f} GB/s", f"{tree.time_s * 1e6:.1f} us",
                          f"{tree.busbw / 1e9:.2f} GB/s", auto.algorithm,
                          f"{auto.algbw / 1e9:.2f} GB/s", f"{auto.busbw / 1e9:.2f} GB/s")
        console.print(table)


if __name__ == "__main__":
    main()
