"""The ``fornax`` command (click + rich).

Every user error ends in one line on stderr and a non-zero exit: 2 for a
usage or configuration mistake, 1 for a failure while running.  ``--debug``
shows the traceback instead (:mod:`.errors`, shared by every subcommand).
"""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from .. import report as report_mod
from ..compare import execute, prepare
from ..layers.errors import ConfigError
from ..layers.profiler import Recorder
from ..scenarios.workloads import DEFAULT_WORKLOAD, WORKLOADS
from ..sim.faults import FaultPlan, FaultPlanError
from ..sim.spec import available_specs, load_spec
from ..sim.trace import chrome_trace
from ..stack import load_config, make_config, parse_seam_overrides
from .baseline import baseline
from .compare import compare_cmd
from .compile import compile_cmd
from .conform import conform
from .cost import cost
from .devices import devices
from .drill import drill
from .errors import FornaxGroup, _fail, debug_option, handle_errors
from .matrix import matrix
from .options import stack_options
from .profile import profile_cmd
from .lab import lab
from .media import media_cmd
from .qualify import qualify
from .serve import serve_cmd
from .trace import trace_cmd


@click.group(name="fornax", cls=FornaxGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fornax")
def main() -> None:
    """fornax — a comparative accelerator software stack on a simulated device."""


@main.command()
@stack_options
@click.option("--workload", default=None, metavar="NAME",
              help=f"Workload to run (default {DEFAULT_WORKLOAD}; see `fornax workloads`).")
@click.option("--framework", default="graph", metavar="NAME",
              help="Where the workload comes from: graph (built in fornax's graph IR, default), "
                   "torch (a torch.nn program on torch.device('fornax')), jax (a JAX function "
                   "compiled by fornax.frameworks.jax.jit) or max (a MAX-style graph loaded in a "
                   "fornax.frameworks.max InferenceSession).")
@click.option("--spec", default=None, metavar="NAME", help="Chip spec (see `fornax specs`).")
@click.option("--seed", type=int, default=None, help="Seed for weights and inputs.")
@click.option("--devices", type=int, default=None, metavar="N",
              help="Simulated devices joined by the topology (default 1, at most 1024, 64 in a "
                   "mesh; the run uses device 0 unless --parallel splits it over all of them).")
@click.option("--parallel", default=None, metavar="MODE",
              help="Run the workload on every device, one rank each, their results joined by the "
                   "library's collectives: dp (split the batch, gather the outputs) or tp (split "
                   "the weights Megatron-style, all-reduce after each row-parallel layer); needs "
                   "--devices N >= 2 and workload mlp or transformer-block.")
@click.option("--topology", default=None, metavar="KIND",
              help="Fabric between the devices: switch (default), mesh or ring.")
@click.option("--nodes", type=int, default=None, metavar="N",
              help="Spread the devices over N nodes (equal blocks): the topology joins a node's "
                   "devices, the chip spec's NIC tier joins the nodes (default 1).")
@click.option("--partition", default=None, metavar="LAYOUT",
              help="Split the chip into partitions, each a device of the stack (the run uses "
                   "partition 0): MIG-like profiles (3g.40gb,4g.40gb; 1g.10gb:7), a compute mode "
                   "(cpx, cpx/nps4) or a device hierarchy (flat); docs/partitioning.md.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON report on stdout.")
@click.option("--all", "all_rows", is_flag=True, default=False,
              help="Show every row of the long tables (kernels, races); default: the first 20 and "
                   "how many more there are.")
@click.option("--meta", is_flag=True, default=None,
              help="Shape-only mode: shapes, memory and costs, no data (no numerics).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write a Chrome/Perfetto trace of the simulated timeline to FILE.")
@click.option("--no-translate", "no_translate", is_flag=True, default=False,
              help="No cross-family paths: no cross-compilation, binary translation or library marshalling between families (formats must meet).")
@click.option("--path", "paths", multiple=True, metavar="NAME",
              help="Carry each crossing that declares portability path NAME by it instead of the "
                   "default (repeatable), e.g. --path hipify-like; the compose tree lists each "
                   "crossing's other paths.")
@click.option("--no-fuse", "no_fuse", is_flag=True, default=False,
              help="Switch compiler fusion off: one kernel per op (to compare with fusion on).")
@click.option("--dump-ir", "dump_ir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Write the compiler's IR after every pass to DIR (FORNAX_LOG=compiler: to stderr).")
@click.option("--no-replay", "no_replay", is_flag=True, default=False,
              help="Run every kernel launch through the tile-ISA interpreter (the reference) instead "
                   "of replaying recordings and fast paths, and every compiled plan run through its "
                   "steps instead of replaying a captured run's runtime calls: the same results, "
                   "device times and traces, more host time.")
@click.option("--inject", default=None, metavar="KIND[@N]", hidden=True,
              help="Fault drill: inject faults (comma-separated KIND[@N]) on every device.")
@debug_option
@handle_errors
def compose_cmd(vendor, seams, config_path, workload, spec, seed, devices, topology, as_json, debug,
                inject=None, trace_path=None, meta=None, no_translate=False, no_fuse=False,
                dump_ir=None, framework="graph", all_rows=False, paths=(), nodes=None, parallel=None,
                no_replay=False, partition=None):
    """Compose a stack seam by seam, run a workload through it, and report."""
    base = load_config(config_path) if config_path else None
    if base is None and vendor is None and not seams:
        raise ConfigError("no stack given: use --vendor V, --seam SEAM=V for every seam, or --config FILE")
    cfg = make_config(vendor, parse_seam_overrides(seams), spec=spec, seed=seed, base=base,
                      devices=devices, topology=topology, meta=meta,
                      translate=False if no_translate else None,
                      fuse=False if no_fuse else None, dump_ir=dump_ir, paths=paths, nodes=nodes,
                      parallel=parallel, replay=False if no_replay else None, partition=partition)
    prep = prepare(cfg, framework, workload, origin="fornax compose")
    plan = None
    if inject:
        try:
            plan = FaultPlan.parse(inject, seed=cfg.seed)
        except FaultPlanError as exc:
            raise ConfigError(f"--inject: {exc}") from None
    # a trace gets the API call track: the profiler's recorder runs alongside
    recorder = Recorder(prep.stack.runtime, api=True).start() if trace_path else None
    out = _with_progress(f"running {prep.workload.name} on {prep.stack.describe()}",
                         lambda: execute(prep, faults=plan, debug=debug), enabled=not as_json)
    if recorder is not None:
        recorder.stop()
    rep = out.report
    if trace_path:
        try:
            with open(trace_path, "w", encoding="utf-8") as fh:
                json.dump(chrome_trace(out.stack.devices,
                                       api=recorder.track() if recorder is not None else None), fh)
        except OSError as exc:
            raise ConfigError(f"--trace: cannot write {trace_path}: {exc.strerror or exc}") from None
    if as_json:
        click.echo(json.dumps(rep, indent=2, default=str))
    else:
        report_mod.render(rep, Console(), all_rows=all_rows)
        if "scenario" in rep:
            _render_scenario(rep["scenario"], Console())
    if out.failed:
        if not as_json:
            _fail(out.failed, 1)
        sys.exit(1)
    if not out.numerics_ok:
        if not as_json:
            _fail("numerics outside tolerance (see the table above)", 1)
        sys.exit(1)


compose_cmd.name = "compose"


def _with_progress(what: str, fn, enabled: bool):
    """``fn()`` under a transient progress display on stderr (a pulsing bar and the elapsed
    time) when ``enabled`` and stderr is a terminal; a log file or a pipe gets nothing."""
    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        return fn()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        progress.add_task(escape(what), total=None)
        return fn()


def _render_scenario(sc: dict, console: Console) -> None:
    """The figures of a scenario workload (``report["scenario"]``, e.g. a training step)."""
    t = Table(title="scenario: training step (simulated devices, the slowest rank; host figures "
                    "measured)",
              show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    rows = [("simulated step time", f"{sc['step_time_s']:.4f} s"),
            ("compute / communication (simulated)",
             f"{sc['compute_s']:.4f} s / {sc['communication_s']:.4f} s"),
            ("exposed communication", f"{sc['exposed_communication_s']:.4f} s"),
            ("ranks: tensor x data parallel", f"{sc.get('tp', 1)} x {sc.get('dp', 1)} on "
             f"{sc.get('nodes', 1)} node(s)"),
            ("straggler spread (slowest - fastest rank)", f"{sc.get('straggler_spread_s', 0.0):.6f} s"),
            ("tensor-parallel all-reduces (per rank)",
             f"{sc['all_reduces']} ({sc['all_reduce_bytes'] / 2**30:.1f} GiB)"),
            ("data-parallel gradient buckets (per rank)",
             f"{sc.get('dp_all_reduces', 0)} ({sc.get('dp_all_reduce_bytes', 0) / 2**30:.1f} GiB)"),
            ("FLOPs executed / model (6 x params x tokens)",
             f"{sc['executed_flops']:.3e} / {sc['model_flops']:.3e}"),
            ("model FLOPs utilisation", f"{sc['mfu']:.1%}"),
            ("per-device peak HBM", f"{sc['peak_hbm_bytes'] / 1e9:.1f} GB of "
             f"{sc['hbm_bytes'] / 1e9:.0f} GB ({'fits' if sc['fits'] else 'DOES NOT FIT'})"),
            ("host wall time (build + compile + run)", f"{sc['host_wall_s']:.2f} s"),
            ("peak host memory (ru_maxrss)", f"{sc['peak_host_rss_bytes'] / 2**30:.2f} GiB")]
    for what, value in rows:
        t.add_row(what, value)
    console.print(t)
    for line in [sc["symmetry"], *sc.get("notes", [])]:
        console.print(f"note: {line}")


@main.command()
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True,
              help="Print the fornax.specs/1 JSON document (every field of each spec).")
@debug_option
@handle_errors
def specs(name, as_json, debug):
    """List the shipped chip specs, or show one (NAME: a shipped spec or a .toml spec file)."""
    console = Console()
    chosen = [load_spec(name)] if name else [load_spec(n) for n in available_specs()]
    if as_json:
        click.echo(json.dumps({"schema": "fornax.specs/1",
                               "specs": [_spec_dict(s) for s in chosen]}, indent=2))
        return
    if name:
        s = chosen[0]
        t = Table(title=f"chip spec {s.name}", show_header=False)
        t.add_column("field")
        t.add_column("value")
        for field, value in s.__dict__.items():
            t.add_row(field, str(value))
        console.print(t)
        return
    t = Table(title="chip specs")
    for col in ("name", "units", "SIMD", "HBM", "HBM bandwidth", "bf16 matrix peak", "description"):
        t.add_column(col)
    for s in chosen:
        t.add_row(s.name, str(s.compute_units), str(s.simd_width), f"{s.hbm_bytes / 1e9:.1f} GB",
                  f"{s.hbm_bandwidth / 1e12:.2f} TB/s",
                  f"{s.matrix_peak.get('bfloat16', 0) / 1e12:.0f} TFLOP/s", s.description)
    console.print(t)


def _spec_dict(spec) -> dict:
    """Every field of a chip spec, as JSON values (tuples as lists, tables as objects)."""
    return spec.to_dict()


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the fornax.workloads/1 JSON document.")
@debug_option
@handle_errors
def workloads(as_json, debug):
    """List the workloads `fornax compose --workload` runs (`--framework graph`, `torch`, `jax` or `max`)."""
    from ..scenarios import jax_workloads, max_workloads, torch_workloads
    tables = (("graph", WORKLOADS, DEFAULT_WORKLOAD),
              ("torch", torch_workloads.WORKLOADS, torch_workloads.DEFAULT_WORKLOAD),
              ("jax", jax_workloads.WORKLOADS, jax_workloads.DEFAULT_WORKLOAD),
              ("max", max_workloads.WORKLOADS, max_workloads.DEFAULT_WORKLOAD))
    if as_json:
        rows = [{"framework": kind, "name": w.name, "description": w.description,
                 "default": w.name == default,
                 # graph workloads that need --meta (their data is too large to hold)
                 "meta_only": bool(getattr(w, "meta_only", False)),
                 # graph workloads that drive the stack themselves (report["scenario"])
                 "scenario": getattr(w, "runner", None) is not None}
                for kind, table, default in tables for w in table.values()]
        click.echo(json.dumps({"schema": "fornax.workloads/1", "workloads": rows}, indent=2))
        return
    t = Table(title="workloads")
    t.add_column("framework")
    t.add_column("name")
    t.add_column("description")
    for kind, table, _ in tables:
        for w in table.values():
            t.add_row(kind, w.name, w.description)
    Console().print(t)


for _command in (conform, cost, compile_cmd, compare_cmd, devices, drill, qualify, serve_cmd, trace_cmd,
                 media_cmd, baseline, matrix, lab, profile_cmd):
    main.add_command(_command)
