"""The PyTorch front end: eager per-op cost through all five seams, and compiled
forward+backward wall time, each against PyTorch CPU eager measured in the same run.

Targets: (P2) an eager 64x64 add at most 30 µs median per op on every family; (P1) a
compiled transformer block's forward+backward at most 2x PyTorch CPU eager, with 1.25x
shown beside it as the moonshot.  The table prints the measured figures beside the
targets and records them (``benchmarks.results``); nothing here asserts them.
"""

from __future__ import annotations

import statistics
import time

from rich.console import Console
from rich.table import Table

from . import best
from .results import Figures
from fornax.stack import BUILTIN_FAMILIES

VENDORS = BUILTIN_FAMILIES
ADD_TARGET_US = 30.0            # P2: eager 64x64 add, median µs per op, every family
COMPILE_TARGET = 2.0            # P1: compiled block forward+backward, x torch CPU eager
COMPILE_MOONSHOT = 1.25         # P1 moonshot, shown beside the target

CPU = "torch CPU eager"
FIGURES = Figures("torch.eager_add_us[{device}]", "torch.eager_add_vs_cpu[{family}]",
                  "torch.compiled_block_s[{device}]", "torch.compiled_block_vs_cpu[{family}]",
                  "torch.compiled_block_vs_cpu_moonshot[{family}]",
                  choices={"device": (CPU, *VENDORS), "family": VENDORS})


def _median_us(fn, n: int = 300, sync=None) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    if sync is not None:
        sync()
    return statistics.median(times) * 1e6


def eager_add() -> list[tuple[str, float]]:
    import torch

    import fornax.frameworks.torch as ft
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    rows = [(CPU, _median_us(lambda: a + b))]
    for vendor in VENDORS:
        ft.use_stack(vendor)
        da, db = a.to("fornax"), b.to("fornax")
        # per op: dispatch, routing, cached compile, allocation, launch; the simulated kernel
        # itself runs when the stream is drained (synchronize), amortised over the batch
        batch = 50

        def run():
            for _ in range(batch):
                da + db
            torch.fornax.synchronize()
        us = _median_us(run, n=20) / batch
        rows.append((vendor, us))
    return rows


def compiled_block(vendors=VENDORS, repeats: int = 5) -> list[tuple[str, float]]:
    """Forward + backward of the transformer block (the graph workload's sizes: seq 64,
    d_model 256, 4 heads, d_ff 512) compiled with ``backend="fornax"`` on fornax tensors,
    best wall time of ``repeats``, against the same step in PyTorch CPU eager."""
    import copy

    import torch

    import fornax.frameworks.torch as ft
    from fornax.scenarios.torch_workloads import Block

    torch.manual_seed(0)
    model = Block(256, 4, 512)
    x = torch.randn(1, 64, 256)

    def step(m, inp):
        m.zero_grad(set_to_none=True)
        m(inp).square().mean().backward()

    def warm_best(fn):
        fn()
        return best(fn, repeats)
    rows = [(CPU, warm_best(lambda: step(model, x)))]
    for vendor in vendors:
        ft.use_stack(vendor)
        torch._dynamo.reset()
        dev = copy.deepcopy(model).to("fornax")
        compiled = torch.compile(dev, backend="fornax")
        xd = x.to("fornax")

        def run():
            step(compiled, xd)
            torch.fornax.synchronize()
        rows.append((vendor, warm_best(run)))
    return rows


def main() -> None:
    console = Console()
    rows = eager_add()
    base = rows[0][1]
    table = Table(title=f"torch eager: 64x64 float32 add, median µs per op through all five seams "
                        f"(target ≤ {ADD_TARGET_US:.0f} µs)")
    for col in ("device", "µs / op", "vs torch CPU eager", "target met"):
        table.add_column(col, justify="left" if col == "device" else "right")
    for name, us in rows:
        if name == CPU:
            FIGURES.record(f"torch.eager_add_us[{name}]", us, "us")
            met = "—"
        else:
            fig = FIGURES.record(f"torch.eager_add_us[{name}]", us, "us", target=ADD_TARGET_US)
            FIGURES.record(f"torch.eager_add_vs_cpu[{name}]", us / base, "x")
            met = "yes" if fig["met"] else "no"
        table.add_row(name, f"{us:.1f}", f"{us / base:.1f}x", met)
    console.print(table)
    rows = compiled_block()
    base = rows[0][1]
    table = Table(title="torch.compile(backend='fornax'): transformer block 1x64x256 forward + "
                        f"backward, best wall time (target ≤ {COMPILE_TARGET:g}x torch CPU eager; "
                        f"moonshot ≤ {COMPILE_MOONSHOT:g}x)")
    for col in ("device", "wall", "vs torch CPU eager", "target met", "moonshot met"):
        table.add_column(col, justify="left" if col == "device" else "right")
    for name, s in rows:
        FIGURES.record(f"torch.compiled_block_s[{name}]", s, "s")
        if name == CPU:
            met = moon = "—"
        else:
            fig = FIGURES.record(f"torch.compiled_block_vs_cpu[{name}]", s / base, "x", target=COMPILE_TARGET)
            shot = FIGURES.record(f"torch.compiled_block_vs_cpu_moonshot[{name}]", s / base, "x",
                                  target=COMPILE_MOONSHOT, note="the moonshot beside the 2x target")
            met, moon = ("yes" if fig["met"] else "no"), ("yes" if shot["met"] else "no")
        table.add_row(name, f"{s * 1e3:.2f} ms", f"{s / base:.2f}x", met, moon)
    console.print(table)


if __name__ == "__main__":
    main()
