"""The ``fornax`` command (click + rich).

Every user error ends in one line on stderr and a non-zero exit: 2 for a
usage or configuration mistake, 1 for a failure while running.  ``--debug``
shows the traceback instead.
"""

from __future__ import annotations

import functools
import json
import sys
import time

import click
from rich.console import Console
from rich.table import Table

from .. import report as report_mod
from ..layers.errors import ConfigError, FornaxError
from ..scenarios.workloads import DEFAULT_WORKLOAD, WORKLOADS, get_workload, numerics
from ..sim.faults import FaultPlan, FaultPlanError, SimError, SpecError
from ..sim.spec import available_specs, load_spec
from ..sim.trace import chrome_trace
from ..stack import compose, load_config, make_config, parse_seam_overrides


def _fail(message: str, code: int) -> None:
    click.echo(f"fornax: error: {' '.join(str(message).split())}", err=True)
    sys.exit(code)


def handle_errors(fn):
    """Turn fornax errors into one line and an exit code (no traceback unless --debug)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        debug = kwargs.get("debug", False)
        try:
            return fn(*args, **kwargs)
        except (FornaxError, SimError) as exc:
            if debug:
                raise
            _fail(str(exc), 2 if isinstance(exc, (ConfigError, SpecError)) else 1)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
    return wrapper


debug_option = click.option("--debug", is_flag=True, help="Show tracebacks for errors.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fornax")
def main() -> None:
    """fornax — a comparative accelerator software stack on a simulated device."""


@main.command()
@click.option("--vendor", metavar="V", help="Set all five seams to vendor V (cuda-like, rocm-like, xpu-like).")
@click.option("--seam", "seams", multiple=True, metavar="SEAM=V",
              help="Override one seam (repeatable), e.g. --seam compiler=cuda-like.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Stack config TOML ([stack] vendor/spec/devices/seed, [stack.seams]).")
@click.option("--workload", default=None, metavar="NAME",
              help=f"Workload to run (default {DEFAULT_WORKLOAD}; see `fornax workloads`).")
@click.option("--framework", default="graph", metavar="NAME",
              help="Where the workload comes from: graph (built in fornax's graph IR, default), "
                   "torch (a torch.nn program on torch.device('fornax')) or jax (a JAX function "
                   "compiled by fornax.frameworks.jax.jit).")
@click.option("--spec", default=None, metavar="NAME", help="Chip spec (see `fornax specs`).")
@click.option("--seed", type=int, default=None, help="Seed for weights and inputs.")
@click.option("--devices", type=int, default=None, metavar="N",
              help="Simulated devices joined by the topology (default 1; the run uses device 0).")
@click.option("--topology", default=None, metavar="KIND",
              help="Fabric between the devices: switch (default), mesh or ring.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON report on stdout.")
@click.option("--meta", is_flag=True, default=None,
              help="Shape-only mode: shapes, memory and costs, no data (no numerics).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write a Chrome/Perfetto trace of the simulated timeline to FILE.")
@click.option("--no-translate", "no_translate", is_flag=True, default=False,
              help="Never put a binary translator between compiler and driver (formats must meet).")
@click.option("--no-fuse", "no_fuse", is_flag=True, default=False,
              help="Switch compiler fusion off: one kernel per op (to compare with fusion on).")
@click.option("--dump-ir", "dump_ir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Write the compiler's IR after every pass to DIR (FORNAX_LOG=compiler: to stderr).")
@click.option("--inject", default=None, metavar="KIND[@N]", hidden=True,
              help="Fault drill: inject faults (comma-separated KIND[@N]) on every device.")
@debug_option
@handle_errors
def compose_cmd(vendor, seams, config_path, workload, spec, seed, devices, topology, as_json, debug,
                inject=None, trace_path=None, meta=None, no_translate=False, no_fuse=False,
                dump_ir=None, framework="graph"):
    """Compose a stack seam by seam, run a workload through it, and report."""
    if framework not in FRAMEWORKS:
        raise ConfigError(f"unknown framework {framework!r}; available: {', '.join(FRAMEWORKS)}")
    base = load_config(config_path) if config_path else None
    if base is None and vendor is None and not seams:
        raise ConfigError("no stack given: use --vendor V, --seam SEAM=V for every seam, or --config FILE")
    cfg = make_config(vendor, parse_seam_overrides(seams), spec=spec, seed=seed, base=base,
                      devices=devices, topology=topology, meta=meta,
                      translate=False if no_translate else None,
                      fuse=False if no_fuse else None, dump_ir=dump_ir)
    if framework == "torch":
        from ..scenarios import torch_workloads
        wl = torch_workloads.get_workload(workload or torch_workloads.DEFAULT_WORKLOAD)
        if cfg.meta:
            raise ConfigError("--framework torch computes real values on the fornax device; a "
                              "shape-only (--meta) stack cannot back it")
    elif framework == "jax":
        from ..scenarios import jax_workloads
        wl = jax_workloads.get_workload(workload or jax_workloads.DEFAULT_WORKLOAD)
        if cfg.meta:
            raise ConfigError("--framework jax computes real values on the fornax device; a "
                              "shape-only (--meta) stack cannot back it")
    else:
        try:
            wl = get_workload(workload or DEFAULT_WORKLOAD)
        except ConfigError as exc:
            from ..scenarios.jax_workloads import WORKLOADS as JAX_WORKLOADS
            from ..scenarios.torch_workloads import WORKLOADS as TORCH_WORKLOADS
            kinds = [k for k, table in (("torch", TORCH_WORKLOADS), ("jax", JAX_WORKLOADS))
                     if workload in table]
            if kinds:
                raise ConfigError(exc.message, hint=f"{workload} is a {' and '.join(kinds)} workload: "
                                  f"add {' or '.join(f'--framework {k}' for k in kinds)}") from None
            raise
    if framework == "graph" and wl.meta_only and not cfg.meta:
        raise ConfigError(f"workload {wl.name} needs shape-only mode: add --meta (its weights and "
                          "activations are too large to hold as data)")
    stack = compose(cfg)
    jclient = None
    if framework == "jax":                  # the run's own PJRT-shaped client over the stack
        from ..frameworks.jax import Client
        jclient = Client(stack, "fornax compose")
    if inject:
        try:
            plan = FaultPlan.parse(inject, seed=cfg.seed)
        except FaultPlanError as exc:
            raise ConfigError(f"--inject: {exc}") from None
        for device in stack.devices:
            device.inject(plan)
    graph, feeds = wl.build(cfg.seed) if framework == "graph" and wl.runner is None else (None, None)
    t0 = time.perf_counter()
    errors, result, nums, scenario, trun = [], None, [], None, None
    try:
        if framework == "torch":            # a torch.nn program through the torch front end
            trun = torch_workloads.run(wl.name, stack, seed=cfg.seed)
            nums = trun.numerics
        elif framework == "jax":            # a JAX function through fornax.frameworks.jax.jit
            trun = jax_workloads.run(wl.name, jclient, seed=cfg.seed)
            nums = trun.numerics
        elif wl.runner is not None:         # a scenario that drives the stack itself
            result, scenario = wl.runner(stack, cfg.seed)
        else:
            result = stack.run(graph, feeds)
            nums = [] if cfg.meta else numerics(graph, result.outputs, feeds)   # meta: no data
    except FornaxError as exc:
        if debug:
            raise
        errors.append(exc.to_dict())
        failed = str(exc)                   # the message with the vendor code and the hint
    wall = trun.host_wall_s if trun is not None else time.perf_counter() - t0
    rep = report_mod.build(stack, wl.name, result, nums, wall, errors, framework=framework)
    if scenario is not None:
        rep["scenario"] = scenario
    if framework == "torch":
        rep["torch"] = _torch_section(trun)
    if framework == "jax":
        rep["jax"] = _jax_section(trun, jclient)
    if trace_path:
        try:
            with open(trace_path, "w", encoding="utf-8") as fh:
                json.dump(chrome_trace(stack.devices), fh)
        except OSError as exc:
            raise ConfigError(f"--trace: cannot write {trace_path}: {exc.strerror or exc}") from None
    if as_json:
        click.echo(json.dumps(rep, indent=2, default=str))
    else:
        report_mod.render(rep, Console())
        if scenario is not None:
            _render_scenario(scenario, Console())
    if errors:
        if not as_json:
            _fail(failed, 1)
        sys.exit(1)
    if not all(n["ok"] for n in nums):
        if not as_json:
            _fail("numerics outside tolerance (see the table above)", 1)
        sys.exit(1)


compose_cmd.name = "compose"
FRAMEWORKS = ("graph", "torch", "jax")


def _torch_section(trun) -> dict:
    """``report["torch"]`` for a torch workload; after a failed run, what the front end did
    until the failure (the run had a fresh front-end session of its own)."""
    if trun is not None:
        return report_mod.torch_section(trun.routes, mode=trun.mode, stack=trun.stack,
                                        losses=trun.losses, reference_losses=trun.reference_losses,
                                        reference_wall_s=trun.reference_wall_s)
    import fornax.frameworks.torch as ft

    from ..scenarios.torch_workloads import route_delta
    session = ft.current()
    return report_mod.torch_section(route_delta({}, session.report()), stack=session.describe())


def _jax_section(jrun, client) -> dict:
    """``report["jax"]`` for a jax workload; after a failed run, what the run's client did
    until the failure."""
    from ..scenarios.jax_workloads import route_delta
    if jrun is not None:
        return report_mod.jax_section(jrun.routes, stack=jrun.stack, platform=jrun.platform,
                                      plugin=jrun.plugin, platform_version=jrun.platform_version,
                                      losses=jrun.losses,
                                      reference_losses=jrun.reference_losses,
                                      reference_wall_s=jrun.reference_wall_s)
    rep = client.report()
    return report_mod.jax_section(route_delta({}, rep), stack=rep["stack"], platform=rep["platform"],
                                  plugin=rep["plugin"],
                                  platform_version=rep["platform_version"])


def _render_scenario(sc: dict, console: Console) -> None:
    """The figures of a scenario workload (``report["scenario"]``, e.g. a training step)."""
    t = Table(title="scenario: training step (simulated device; host figures measured)",
              show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    rows = [("simulated step time", f"{sc['step_time_s']:.4f} s"),
            ("compute / communication (simulated)",
             f"{sc['compute_s']:.4f} s / {sc['communication_s']:.4f} s"),
            ("exposed communication", f"{sc['exposed_communication_s']:.4f} s"),
            ("all-reduces", f"{sc['all_reduces']} ({sc['all_reduce_bytes'] / 2**30:.1f} GiB)"),
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
@debug_option
@handle_errors
def specs(name, debug):
    """List the shipped chip specs, or show one."""
    console = Console()
    if name:
        s = load_spec(name)
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
    for n in available_specs():
        s = load_spec(n)
        t.add_row(s.name, str(s.compute_units), str(s.simd_width), f"{s.hbm_bytes / 1e9:.1f} GB",
                  f"{s.hbm_bandwidth / 1e12:.2f} TB/s",
                  f"{s.matrix_peak.get('bfloat16', 0) / 1e12:.0f} TFLOP/s", s.description)
    console.print(t)


@main.command()
def workloads():
    """List the workloads `fornax compose --workload` runs (`--framework graph`, `torch` or `jax`)."""
    from ..scenarios.jax_workloads import WORKLOADS as JAX_WORKLOADS
    from ..scenarios.torch_workloads import WORKLOADS as TORCH_WORKLOADS
    t = Table(title="workloads")
    t.add_column("framework")
    t.add_column("name")
    t.add_column("description")
    for kind, table in (("graph", WORKLOADS), ("torch", TORCH_WORKLOADS), ("jax", JAX_WORKLOADS)):
        for w in table.values():
            t.add_row(kind, w.name, w.description)
    Console().print(t)


from .conform import conform  # noqa: E402  (subcommands import this module's helpers)

main.add_command(conform)

from .cost import cost  # noqa: E402

main.add_command(cost)

from .compile import compile_cmd  # noqa: E402

main.add_command(compile_cmd)
