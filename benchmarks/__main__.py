"""Skeleton benchmarks: host wall time of a fornax run against PyTorch CPU eager and jax.jit.

Every figure is measured in the same process and run, and reported as a
ratio to the framework baselines; the simulated device time of the same
run is shown beside it (a different clock — never compared with wall time).

Besides the printed tables, every figure the run measured is written to
``bench.json`` (``--json PATH``, else ``$FORNAX_BENCH_JSON``, else ./bench.json in the
working directory; schema ``benchmarks/bench.schema.json``, see ``benchmarks.results``);
``python -m benchmarks.summary bench.json`` renders it as a markdown table.
``--only NAME,...`` / ``--skip NAME,...`` pick benchmarks (``--list`` names them); the
all-combinations compare is opt-in (``FORNAX_BENCH_COMBOS=1``, or ``--only all_combos``).
A benchmark that raises is reported and recorded in the document's ``meta.errors``, the
others still run, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
import traceback

import numpy as np
from rich.console import Console
from rich.table import Table

from fornax.layers.graph import DType
from fornax.scenarios.workloads import mlp
from fornax.stack import compose, make_config

from . import (all_combos, calibration, churn, collectives, compile_times, ddp_scaling, gemm_sweep, gpt2_step,
               jax_frontend, opinfo, real_clients, scale_out, shape_only, sparse_sweep, torch_frontend)

from . import REPEATS
from . import best as _best
from . import results
from fornax.stack import BUILTIN_FAMILIES

FIGURES = results.Figures("mlp.wall_s[{stack}]", "mlp.device_s[{family}]", "mlp.vs_torch[{family}]",
                          "mlp.vs_jax[{family}]",
                          choices={"stack": ("torch CPU eager", "jax.jit CPU", *BUILTIN_FAMILIES),
                                   "family": BUILTIN_FAMILIES})

#: the 1 GiB create + sum (benchmarks/big_tensor.py measures it; its own constants win where it has them)
BIG_TENSOR_TARGET_S = 2.0
BIG_TENSOR_RSS_TARGET_BYTES = int(1.5 * 2**30)
BIG_TENSOR = results.Figures("big_tensor.seconds[{vendor}: {variant}]",
                             "big_tensor.rss_growth[{vendor}: {variant}]", module="benchmarks.big_tensor")


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


def mlp_main() -> None:
    console = Console()
    graph, feeds = mlp(0, dtype=DType.FLOAT32)
    torch_s = _best(_torch_mlp(graph, feeds))
    jax_s = _best(_jax_mlp(graph, feeds))
    FIGURES.record("mlp.wall_s[torch CPU eager]", torch_s, "s")
    FIGURES.record("mlp.wall_s[jax.jit CPU]", jax_s, "s")
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
        device = statistics.median(device_times)
        FIGURES.record(f"mlp.wall_s[{vendor}]", wall, "s")
        FIGURES.record(f"mlp.vs_torch[{vendor}]", wall / torch_s, "x")
        FIGURES.record(f"mlp.vs_jax[{vendor}]", wall / jax_s, "x")
        FIGURES.record(f"mlp.device_s[{vendor}]", device, "s", note="simulated device time")
        table.add_row(vendor, f"{wall * 1e3:.3f} ms", f"{wall / torch_s:.1f}x", f"{wall / jax_s:.1f}x",
                      f"{device * 1e6:.1f} µs")
    console.print(table)


def big_tensor_main() -> None:
    """The 1 GiB create + sum of ``benchmarks.big_tensor`` on every family, recorded; nothing
    (a line saying why) where the module or its ``measure`` is missing."""
    console = Console()
    try:
        big_tensor = importlib.import_module("benchmarks.big_tensor")
    except ImportError as exc:
        missing = isinstance(exc, ModuleNotFoundError) and exc.name == "benchmarks.big_tensor"
        reason = ("benchmarks/big_tensor.py does not exist yet" if missing
                  else f"benchmarks/big_tensor.py is not importable ({exc})")
        console.print(f"{reason}; no big-tensor figure recorded")
        results.current().skip("big_tensor", reason)
        return
    # every variant (device factory, host copy) where the module measures them all
    measure = getattr(big_tensor, "measure_all", None) or getattr(big_tensor, "measure", None)
    if not callable(measure):
        reason = "benchmarks/big_tensor.py has no measure(vendor)"
        console.print(f"{reason}; no big-tensor figure recorded")
        results.current().skip("big_tensor", reason)
        return
    target_s = getattr(big_tensor, "TARGET_S", BIG_TENSOR_TARGET_S)
    rss_target = getattr(big_tensor, "RSS_TARGET_BYTES", BIG_TENSOR_RSS_TARGET_BYTES)
    table = Table(title=f"1 GiB tensor create + sum (targets ≤ {target_s:g} s, ≤ {rss_target / 2**30:g} GiB "
                        "host RSS growth)")
    for col in ("family", "variant", "tensor", "wall", "RSS growth", "targets met"):
        table.add_column(col, justify="left" if col in ("family", "variant") else "right")
    for vendor in BUILTIN_FAMILIES:
        got = measure(vendor)
        for row in (got if isinstance(got, list) else [got]):
            where = f"{row.get('vendor', vendor)}: {row.get('variant') or 'default'}"
            note = f"{row['tensor_bytes'] / 2**30:g} GiB tensor" if row.get("tensor_bytes") else None
            t = BIG_TENSOR.record(f"big_tensor.seconds[{where}]", row["seconds"], "s", target=target_s, note=note)
            r = BIG_TENSOR.record(f"big_tensor.rss_growth[{where}]", row["rss_growth_bytes"], "bytes",
                                  target=rss_target, note=note)
            table.add_row(row.get("vendor", vendor), str(row.get("variant") or "default"),
                          f"{row.get('tensor_bytes', 0) / 2**30:g} GiB", f"{row['seconds']:.2f} s",
                          f"{row['rss_growth_bytes'] / 2**30:.2f} GiB",
                          "yes" if t["met"] and r["met"] else "no")
    console.print(table)


#: every benchmark in run order: (name, what runs it)
BENCHMARKS = {
    "mlp": mlp_main, "calibration": calibration.main, "compile_times": compile_times.main,
    "shape_only": shape_only.main, "scale_out": scale_out.main, "ddp_scaling": ddp_scaling.main,
    "gemm_sweep": gemm_sweep.main, "sparse_sweep": sparse_sweep.main, "collectives": collectives.main, "torch_frontend": torch_frontend.main,
    "jax_frontend": jax_frontend.main, "gpt2_step": gpt2_step.main, "opinfo": opinfo.main,
    "real_clients": real_clients.main, "churn": churn.main, "big_tensor": big_tensor_main,
    "all_combos": all_combos.main,
}
#: opt-in benchmarks: run where their variable is set or --only names them
OPT_IN = {"all_combos": all_combos.ENV}


def _names(text: str | None) -> list[str]:
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="PATH", help=f"where to write the figures (default: ${results.JSON_ENV} "
                                                  f"or ./{results.DEFAULT_JSON})")
    p.add_argument("--only", metavar="NAME,...", help="run only these benchmarks")
    p.add_argument("--skip", metavar="NAME,...", help="run all but these benchmarks")
    p.add_argument("--list", action="store_true", help="name the benchmarks and exit")
    args = p.parse_args(argv)
    if args.list:
        print("\n".join(BENCHMARKS))
        return 0
    only, skip = _names(args.only), _names(args.skip)
    chosen = [n for n in BENCHMARKS if (not only or n in only) and n not in skip]
    t0 = time.perf_counter()
    with results.collecting() as collector:
        for name in list(chosen):
            env = OPT_IN.get(name)
            if env and name not in only and os.environ.get(env) != "1":
                reason = f"opt-in: set {env}=1 (slow)"
                Console().print(f"{name} skipped ({reason})")
                collector.skip(name, reason)
                chosen.remove(name)
                continue
            try:
                BENCHMARKS[name]()
            except Exception as exc:                  # noqa: BLE001 - reported, the rest still run
                traceback.print_exc()
                collector.error(name, f"{type(exc).__name__}: {exc}"[:2000])
        doc = collector.to_doc(results.metadata_of_run(time.perf_counter() - t0, chosen))
    path = results.write(doc, results.json_path(args.json))
    targets = [f for f in doc["figures"] if "target" in f]
    print(f"{len(doc['figures'])} figures ({sum(f['met'] for f in targets)} of {len(targets)} targets met) "
          f"in {doc['meta']['wall_s']:.0f} s written to {path}"
          + (f"; {len(collector.errors)} benchmark(s) failed: "
             + ", ".join(e["module"] for e in collector.errors) if collector.errors else ""))
    return 1 if collector.errors else 0


if __name__ == "__main__":
    sys.exit(main())
