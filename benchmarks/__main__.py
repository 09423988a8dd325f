"""Skeleton benchmarks: host wall time of a fornax run against PyTorch CPU eager and jax.jit.

Every figure is measured in the same process and run, and reported as a
ratio to the framework baselines; the simulated device time of the same
run is shown beside it (a different clock — never compared with wall time).
"""

from __future__ import annotations

import statistics

import numpy as np
from rich.console import Console
from rich.table import Table

from fornax.layers.graph import DType
from fornax.scenarios.workloads import mlp
from fornax.stack import compose, make_config

from . import (calibration, churn, collectives, compile_times, ddp_scaling, gemm_sweep, jax_frontend, opinfo,
               real_clients, scale_out, shape_only, torch_frontend)

from . import REPEATS
from . import best as _best
from fornax.stack import BUILTIN_FAMILIES


def _torch_mlp(graph, feeds):
    import torch
    w1, b1, w2, b2 = (torch.from_numpy(np.asarray(v.const)) for v in graph.constants)
    x = torch.from_numpy(feeds["x"])

    def run():
        with torch.no_grad():
            return torch.relu(x @ w1 + b1) @ w2 + b2
    return run


def _jax_mlp(graph, feeds):
    import jax
    import jax.numpy as jnp
    w1, b1, w2, b2 = (jnp.asarray(v.const) for v in graph.constants)
    x = jnp.asarray(feeds["x"])
    f = jax.jit(lambda x: jax.nn.relu(x @ w1 + b1) @ w2 + b2)
    f(x).block_until_ready()
    return lambda: f(x).block_until_ready()


def main() -> None:
    console = Console()
    graph, feeds = mlp(0, dtype=DType.FLOAT32)
    torch_s = _best(_torch_mlp(graph, feeds))
    jax_s = _best(_jax_mlp(graph, feeds))
    table = Table(title="MLP 64x256-512-128 float32: host wall time per run (best of "
                        f"{REPEATS}) and simulated device time")
    for col in ("stack", "fornax wall", "vs torch eager", "vs jax.jit", "simulated device time"):
        table.add_column(col, justify="right" if col != "stack" else "left")
    table.add_row("torch CPU eager", f"{torch_s * 1e3:.3f} ms", "1.0x", f"{torch_s / jax_s:.1f}x", "—")
    table.add_row("jax.jit CPU", f"{jax_s * 1e3:.3f} ms", f"{jax_s / torch_s:.1f}x", "1.0x", "—")
    for vendor in BUILTIN_FAMILIES:
        stack = compose(make_config(vendor))
        stack.run(graph, feeds)                       # warm: compile cache, module cache
        device_times = []

        def run():
            before = stack.devices[0].timeline.busy_time
            stack.run(graph, feeds)
            device_times.append(stack.devices[0].timeline.busy_time - before)
        wall = _best(run)
        table.add_row(vendor, f"{wall * 1e3:.3f} ms", f"{wall / torch_s:.1f}x", f"{wall / jax_s:.1f}x",
                      f"{statistics.median(device_times) * 1e6:.1f} µs")
    console.print(table)
    calibration.main()
    compile_times.main()
    shape_only.main()
    scale_out.main()
    ddp_scaling.main()
    gemm_sweep.main()
    collectives.main()
    torch_frontend.main()
    jax_frontend.main()
    opinfo.main()
    real_clients.main()
    churn.main()


if __name__ == "__main__":
    main()
