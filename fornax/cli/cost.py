"""``fornax cost``: what the cost model predicts for a GEMM, a copy, an all-reduce or attention.

Nothing runs on a device: each subcommand prices its operation with the
analytic models of :mod:`fornax.sim.cost` (and :mod:`fornax.sim.topology`
for collectives) on a chip spec.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
import re

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..layers.errors import ConfigError
from ..report import fmt_bytes, fmt_time
from ..sim import cost as model
from ..sim.spec import load_spec
from ..sim.topology import ALGORITHMS, KINDS, Topology
from ..stack import DEFAULT_SPEC
from .errors import debug_option, handle_errors

#: dtype spellings the command accepts -> the model's dtype names
DTYPE_ALIASES: dict[str, str] = {
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "f16": "float16", "half": "float16", "float16": "float16",
    "fp32": "float32", "f32": "float32", "float": "float32", "float32": "float32",
    "tf32": "tfloat32", "tfloat32": "tfloat32",
    "fp64": "float64", "f64": "float64", "double": "float64", "float64": "float64",
    "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2", "float8_e5m2": "float8_e5m2",
}

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "b": 1}


def _errors(fn):
    """Report bad input through :func:`~fornax.cli.errors.handle_errors` (the models' own
    argument checks raise ValueError: a usage mistake)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        def run(*a, **kw):
            try:
                return fn(*a, **kw)
            except ValueError as exc:                 # the models' own argument checks
                raise ConfigError(str(exc)) from None
        return handle_errors(run)(*args, **kwargs)
    return wrapper


def _size(text: str, what: str) -> int:
    """A positive whole number, optionally with a unit: 4096, 1e9, 64MiB, 2GB."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", str(text).lower())
    if not m or m.group(2) not in _UNITS:
        raise ConfigError(f"{what} must be a positive whole number (optionally with a unit "
                          f"such as KiB, MiB, GiB, KB, MB, GB), got {text!r}")
    value = float(m.group(1)) * _UNITS[m.group(2)]
    if value <= 0 or value != int(value):
        raise ConfigError(f"{what} must be a positive whole number, got {text!r}")
    return int(value)


def _dtype(text: str) -> str:
    key = str(text).lower()
    if key not in DTYPE_ALIASES:
        raise ConfigError(f"unknown dtype {text!r}; use one of: bf16, fp16, fp32, tf32, fp64, fp8 "
                          "(or a full name such as bfloat16)")
    return DTYPE_ALIASES[key]


def _choice(text: str, options, what: str) -> str:
    if text not in options:
        raise ConfigError(f"unknown {what} {text!r}; choose one of: {', '.join(options)}")
    return text


def _capacity(spec, needed: int, what: str) -> list[str]:
    """A warning when ``needed`` bytes (``what``) exceed one device's memory on ``spec``: the
    estimate is still the model's, but no single device could hold the operands."""
    if needed <= spec.hbm_bytes:
        return []
    return [f"{what} need {fmt_bytes(needed)}, more than the {fmt_bytes(spec.hbm_bytes)} of device "
            f"memory on {spec.name} ({needed / spec.hbm_bytes:.3g}x): no single device holds them; "
            f"split the work across devices or shrink it"]


def _emit(as_json: bool, title: str, result: dict, rows: list[tuple[str, str]],
          warnings: Sequence[str] = ()) -> None:
    if as_json:
        click.echo(json.dumps({"schema": "fornax.cost/1", **result, "warnings": list(warnings)}))
        return
    t = Table(title=title, show_header=False)
    t.add_column("quantity")
    t.add_column("value", justify="right")
    for k, v in rows:
        t.add_row(k, v)
    console = Console()
    console.print(t)
    for w in warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}")


spec_option = click.option("--spec", "spec_name", default=DEFAULT_SPEC, show_default=True,
                           metavar="NAME", help="Chip spec (see `fornax specs`).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")


@click.group()
def cost() -> None:
    """Predict the simulated time of an operation from the cost model (nothing runs)."""


def _kernel_fields(k: model.KernelCost) -> dict:
    return {"bound": k.bound, "compute_s": k.compute_s, "memory_s": k.memory_s,
            "launch_s": k.launch_s, "ramp_s": k.ramp_s, "wave_efficiency": k.wave_efficiency,
            "resident_per_unit": k.resident, "hbm_bytes": k.hbm_bytes, "l2_bytes": k.l2_bytes}


@cost.command()
@click.option("--m", "m", required=True, metavar="M", help="Rows of A and C.")
@click.option("--n", "n", required=True, metavar="N", help="Columns of B and C.")
@click.option("--k", "k", required=True, metavar="K", help="Columns of A, rows of B.")
@click.option("--batch", default="1", show_default=True, metavar="B", help="Batch count.")
@click.option("--dtype", default="bf16", show_default=True, metavar="DT",
              help="bf16, fp16, fp32, tf32, fp64 or fp8.")
@spec_option
@json_option
@debug_option
@_errors
def gemm(m, n, k, batch, dtype, spec_name, as_json, debug):
    """A GEMM C = A @ B (M x K times K x N)."""
    dt = _dtype(dtype)
    sizes = {x: _size(v, f"--{x}") for x, v in (("m", m), ("n", n), ("k", k), ("batch", batch))}
    spec = load_spec(spec_name)
    e = model.gemm_cost(spec, sizes["m"], sizes["n"], sizes["k"], dt, sizes["batch"])
    peak = spec.peak(dt, matrix=True)
    result = {"op": "gemm", "spec": spec.name, **e.detail, "time_s": e.time_s, "flops": e.flops,
              "tflops": e.tflops, "peak_tflops": peak / 1e12, "fraction_of_peak": e.tflops * 1e12 / peak,
              "matrix_unit": dt in spec.matrix_peak, **_kernel_fields(e.cost)}
    tile = "x".join(map(str, e.detail["tile"]))
    operands = sizes["batch"] * (sizes["m"] * sizes["k"] + sizes["k"] * sizes["n"]
                                 + sizes["m"] * sizes["n"]) * model.itemsize(dt)
    warnings = _capacity(spec, operands, "A, B and C")
    _emit(as_json, f"GEMM {sizes['m']}x{sizes['n']}x{sizes['k']} {dt} on {spec.name}", result, [
        ("time", fmt_time(e.time_s)), ("throughput", f"{e.tflops:.1f} TFLOP/s"),
        ("of peak", f"{result['fraction_of_peak']:.0%} of {peak / 1e12:.0f} TFLOP/s"
                    + ("" if result["matrix_unit"] else " (no matrix-unit rate: vector)")),
        ("tile, instances", f"{tile}, {e.detail['instances']} (wave efficiency "
                            f"{e.cost.wave_efficiency:.0%})"),
        ("bound", e.cost.bound),
        ("compute / memory", f"{fmt_time(e.cost.compute_s)} / {fmt_time(e.cost.memory_s)}"),
        ("launch + ramp", f"{fmt_time(e.cost.launch_s)} + {fmt_time(e.cost.ramp_s)}"),
        ("HBM / L2 traffic", f"{e.cost.hbm_bytes / 1e9:.3f} GB / {e.cost.l2_bytes / 1e9:.3f} GB"),
    ], warnings)


@cost.command()
@click.option("--bytes", "nbytes", required=True, metavar="B", help="Bytes to copy (e.g. 1GiB).")
@click.option("--kind", default="d2d", show_default=True, metavar="KIND", help="d2d, h2d, d2h or peer.")
@spec_option
@json_option
@debug_option
@_errors
def copy(nbytes, kind, spec_name, as_json, debug):
    """One copy: device-to-device, host-to-device, device-to-host, or over one peer link."""
    kind = _choice(kind, model.COPY_KINDS, "copy kind")
    size = _size(nbytes, "--bytes")
    spec = load_spec(spec_name)
    e = model.copy_estimate(spec, size, kind)
    result = {"op": "copy", "spec": spec.name, "kind": kind, "bytes": size, "time_s": e.time_s,
              "gbps": e.gbps, "bytes_counted": e.bytes}
    note = " (read + write)" if kind == "d2d" else ""
    # a device-to-device copy holds source and destination on the one device
    warnings = _capacity(spec, size * (2 if kind == "d2d" else 1),
                         "source and destination" if kind == "d2d" else "the buffer")
    _emit(as_json, f"{kind} copy of {size} bytes on {spec.name}", result, [
        ("time", fmt_time(e.time_s)), ("bandwidth", f"{e.gbps:.1f} GB/s{note}")], warnings)


@cost.command()
@click.option("--bytes", "nbytes", required=True, metavar="B", help="Buffer size per device.")
@click.option("--devices", required=True, metavar="N", help="Number of devices.")
@click.option("--topology", "kind", default="switch", show_default=True, metavar="KIND",
              help=f"Fabric: {', '.join(KINDS)}.")
@click.option("--algorithm", default="ring", show_default=True, metavar="ALG",
              help=f"Collective algorithm: {', '.join(ALGORITHMS)}.")
@spec_option
@json_option
@debug_option
@_errors
def allreduce(nbytes, devices, kind, algorithm, spec_name, as_json, debug):
    """An all-reduce of a buffer on every device over a fabric."""
    kind = _choice(kind, KINDS, "topology")
    algorithm = _choice(algorithm, ALGORITHMS, "algorithm")
    size, n = _size(nbytes, "--bytes"), _size(devices, "--devices")
    spec = load_spec(spec_name)
    t = Topology.build(spec, n, kind).allreduce_time(size, algorithm)
    algbw = size / t / 1e9 if t > 0 else 0.0
    busbw = algbw * 2 * (n - 1) / n
    result = {"op": "allreduce", "spec": spec.name, "bytes": size, "devices": n, "topology": kind,
              "algorithm": algorithm, "time_s": t, "gbps": algbw, "bus_gbps": busbw}
    _emit(as_json, f"all-reduce of {size} bytes over {n} devices ({kind}, {algorithm}) on {spec.name}",
          result, [("time", fmt_time(t)), ("algorithm bandwidth", f"{algbw:.1f} GB/s"),
                   ("bus bandwidth", f"{busbw:.1f} GB/s (x 2(N-1)/N)")],
          _capacity(spec, size, "the buffer on each device"))


@cost.command()
@click.option("--batch", required=True, metavar="B")
@click.option("--heads", required=True, metavar="H")
@click.option("--seq", required=True, metavar="S", help="Sequence length (queries = keys).")
@click.option("--head-dim", "head_dim", required=True, metavar="D")
@click.option("--causal", is_flag=True, help="Causal mask: about half the work.")
@click.option("--dtype", default="bf16", show_default=True, metavar="DT")
@spec_option
@json_option
@debug_option
@_errors
def attention(batch, heads, seq, head_dim, causal, dtype, spec_name, as_json, debug):
    """Flash-style attention forward: 4*B*H*S^2*D FLOPs (half when causal)."""
    dt = _dtype(dtype)
    sizes = {x: _size(v, f"--{x.replace('_', '-')}")
             for x, v in (("batch", batch), ("heads", heads), ("seq", seq), ("head_dim", head_dim))}
    spec = load_spec(spec_name)
    e = model.attention_cost(spec, sizes["batch"], sizes["heads"], sizes["seq"], sizes["head_dim"],
                             causal, dt)
    result = {"op": "attention", "spec": spec.name, **e.detail, "time_s": e.time_s, "flops": e.flops,
              "tflops": e.tflops, **_kernel_fields(e.cost)}
    _emit(as_json, f"attention B={sizes['batch']} H={sizes['heads']} S={sizes['seq']} "
                   f"D={sizes['head_dim']}{' causal' if causal else ''} {dt} on {spec.name}", result, [
        ("time", fmt_time(e.time_s)), ("throughput", f"{e.tflops:.1f} TFLOP/s"),
        ("bound", e.cost.bound),
        ("compute / memory", f"{fmt_time(e.cost.compute_s)} / {fmt_time(e.cost.memory_s)}"),
        ("HBM / L2 traffic", f"{e.cost.hbm_bytes / 1e9:.3f} GB / {e.cost.l2_bytes / 1e9:.3f} GB"),
    ], _capacity(spec, 4 * sizes["batch"] * sizes["heads"] * sizes["seq"] * sizes["head_dim"]
                 * model.itemsize(dt), "Q, K, V and the output"))
