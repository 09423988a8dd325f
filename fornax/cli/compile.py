"""``fornax compile``: show one workload at each stage of a family's compiler.

``--emit graph`` prints the workload's graph IR; ``ir`` the graph after the
compiler's graph passes, the kernels fusion formed and the pass log; ``asm``
every generated kernel in the family's assembly dialect (PTX-like,
AMDGCN-like, SPIR-V-like); ``binary`` the serialised image, written to
``-o FILE`` (or to stdout when it is not a terminal).
"""

from __future__ import annotations

import sys

import click

from ..layers.compiler import Disassembler, Target
from ..layers.errors import ConfigError
from ..layers.passes import route as routing
from ..layers.passes.fuse import describe as describe_groups, fuse
from ..scenarios.workloads import WORKLOADS, get_workload
from ..stack import compose, make_config, runnable_vendors
from .errors import debug_option, handle_errors

EMITS = ("graph", "ir", "asm", "binary")


def _graph(name: str):
    wl = get_workload(name)
    if wl.build is None:
        graph_ones = ", ".join(w.name for w in WORKLOADS.values() if w.build is not None)
        raise ConfigError(f"workload {name!r} is a scenario that drives the stack itself, not a "
                          f"graph to compile; graph workloads: {graph_ones}")
    graph, _ = wl.build(0)
    return graph


def stage_text(stack, graph, emit: str, fmt: str | None = None):
    """The text (or, for ``binary``, the bytes) of one stage for ``graph`` on ``stack``."""
    compiler, target = stack.compiler, stack.target
    if fmt is not None:
        emits = tuple(compiler.output_formats())
        if fmt not in emits:
            raise ConfigError(f"--format {fmt}: the {compiler.vendor} compiler emits {', '.join(emits)}")
        target = Target(target.arch, fmt, target.compute_units)
    if emit == "graph":
        return str(graph) + "\n"
    routines = frozenset(stack.library.ops()) if stack.library is not None else frozenset()
    if emit == "ir":
        lowered = compiler.run_graph_passes(graph)
        library_ops = routing.library_ops(compiler.route, routines)
        groups = fuse(lowered, library_ops, enabled=compiler.options.enabled("fuse"))
        plan = compiler.compile(graph, target, routines)
        log = "\n".join(f"// {line}" for line in plan.log)
        return f"{lowered}\n\n{describe_groups(groups)}\n\n{log}\n"
    plan = compiler.compile(graph, target, routines)
    if plan.binary is None:
        raise ConfigError(f"the {compiler.vendor} compiler generated no kernels for {graph.name!r} "
                          "(every step is a library call), so there is no binary to show")
    if emit == "binary":
        return plan.binary.data
    if not isinstance(compiler, Disassembler):     # a compiler without that capability
        raise ConfigError(f"the {compiler.vendor} compiler has no text form for {plan.binary.format}")
    return compiler.disassemble(plan.binary)


@click.command("compile")
@click.option("--workload", metavar="NAME", help="A graph workload (see `fornax workloads`).")
@click.option("--vendor", metavar="V", help=f"The compiler family ({', '.join(runnable_vendors())}).")
@click.option("--emit", metavar="|".join(EMITS), help="Which stage to show: " + ", ".join(EMITS) + ".")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write to FILE instead of stdout (needed for --emit binary on a terminal).")
@click.option("--spec", default=None, metavar="NAME", help="Chip spec the target is taken from.")
@click.option("--format", "fmt", default=None, metavar="F",
              help="One of the compiler's formats (default: the one its driver loads first).")
@click.option("--no-fuse", "no_fuse", is_flag=True, default=False, help="Compile with fusion off.")
@debug_option
@handle_errors
def compile_cmd(workload, vendor, emit, output, spec, fmt, no_fuse, debug):
    """Show a workload as graph IR, lowered IR, the family's assembly, or its binary."""
    for flag, value in (("--workload NAME", workload), ("--vendor V", vendor), ("--emit STAGE", emit)):
        if not value:
            raise ConfigError(f"fornax compile needs {flag} (e.g. --workload mlp --vendor cuda-like "
                              "--emit asm)")
    if emit not in EMITS:
        raise ConfigError(f"--emit {emit}: unknown stage; stages: {', '.join(EMITS)}")
    graph = _graph(workload)
    stack = compose(make_config(vendor, spec=spec, fuse=False if no_fuse else None))
    out = stage_text(stack, graph, emit, fmt)
    if output is not None:
        try:
            with open(output, "wb") as f:
                f.write(out if isinstance(out, bytes) else out.encode())
        except OSError as exc:
            raise ConfigError(f"-o {output}: cannot write: {exc.strerror or exc}") from None
        return
    if isinstance(out, bytes):
        if sys.stdout.isatty():
            raise ConfigError("--emit binary writes bytes: give -o FILE (or redirect stdout)")
        sys.stdout.buffer.write(out)
        sys.stdout.buffer.flush()
        return
    click.echo(out, nl=False)
