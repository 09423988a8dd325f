"""The JAX front end: host wall time of one call of ``fornax.frameworks.jax.jit`` (upload,
compiled segments on the simulated device, download) against ``jax.jit`` on the CPU measured in
the same run, for the MLP forward pass and its loss gradient, with the simulated device time of
the same call beside it (a different clock).  Target: each program's call at most 2x ``jax.jit``
on every family (``JIT_TARGET``); the figures are recorded (``benchmarks.results``), not asserted.
"""

from __future__ import annotations

import statistics

import numpy as np
from rich.console import Console
from rich.table import Table

from . import REPEATS, best
from .results import Figures
from fornax.stack import BUILTIN_FAMILIES

VENDORS = BUILTIN_FAMILIES
JIT_TARGET = 2.0                # MLP forward and loss gradient: at most 2x jax.jit, every family
FIGURES = Figures("jax.{program}_s[jax.jit CPU]", "jax.{program}_s[{family}]",
                  "jax.{program}_vs_jit[{family}]", "jax.{program}_device_s[{family}]",
                  choices={"program": ("forward", "loss_gradient"), "family": VENDORS})


def _programs():
    import jax
    import jax.numpy as jnp

    from fornax.layers.graph import DType
    from fornax.scenarios.workloads import mlp
    graph, feeds = mlp(0, dtype=DType.FLOAT32)
    params = tuple(np.asarray(v.const) for v in graph.constants)
    x = feeds["x"]

    def forward(p, x):
        w1, b1, w2, b2 = p
        return jax.nn.relu(x @ w1 + b1) @ w2 + b2

    def grad(p, x):
        return jax.grad(lambda q: jnp.mean(forward(q, x) ** 2))(p)
    return {"forward": forward, "loss gradient": grad}, (params, x)


def main() -> None:
    import jax

    import fornax.frameworks.jax as fj
    programs, args = _programs()
    table = Table(title=f"fornax.frameworks.jax.jit: MLP 64x256-512-128 float32, host wall time per "
                        f"call (best of {REPEATS}) against jax.jit on the CPU (target ≤ {JIT_TARGET:g}x), and "
                        "simulated device time")
    for col in ("program", "stack", "wall", "vs jax.jit", "target met", "simulated device time"):
        table.add_column(col, justify="left" if col in ("program", "stack") else "right")
    for name, fn in programs.items():
        ref = jax.jit(fn)
        jax.block_until_ready(ref(*args))
        base = best(lambda: jax.block_until_ready(ref(*args)))
        key = name.replace(" ", "_")
        FIGURES.record(f"jax.{key}_s[jax.jit CPU]", base, "s")
        table.add_row(name, "jax.jit CPU", f"{base * 1e3:.3f} ms", "1.0x", "—", "—")
        for vendor in VENDORS:
            client = fj.Client.for_vendor(vendor)
            f = fj.jit(fn, stack=client, numpy=True)
            f(*args)                                  # trace and compile once
            timeline = client.stack.devices[0].timeline
            device = []

            def run():
                before = timeline.busy_time
                f(*args)
                device.append(timeline.busy_time - before)
            wall = best(run)
            dev = statistics.median(device)
            FIGURES.record(f"jax.{key}_s[{vendor}]", wall, "s")
            fig = FIGURES.record(f"jax.{key}_vs_jit[{vendor}]", wall / base, "x", target=JIT_TARGET)
            FIGURES.record(f"jax.{key}_device_s[{vendor}]", dev, "s", note="simulated device time")
            table.add_row(name, vendor, f"{wall * 1e3:.3f} ms", f"{wall / base:.1f}x",
                          "yes" if fig["met"] else "no", f"{dev * 1e6:.1f} µs")
    Console().print(table)


if __name__ == "__main__":
    main()
