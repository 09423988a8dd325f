"""The run report: a versioned JSON document, and its rendering with rich.

Schema ``fornax.report/1`` — top-level keys:

``schema``     the schema id
``manifest``   pinned software versions, the stack by seam, spec, seed, workload
``seams``      a dict per seam (what it did: counters, formats, choices)
``numerics``   list of ``{output, dtype, shape, max_abs_err, max_rel_err, tol, ok}``
``costs``      ``device_time_s`` (simulated) and ``host_wall_s`` (measured), kernels,
               launches, copies and bytes, peak device memory, compile/load costs,
               energy, average power, throttled time and peak temperature (simulated)
``kernels``    every executed kernel: name, grid, simulated duration, roofline bound
``fallbacks``  ops that ran on the CPU, with reasons
``errors``     errors raised during the run (a fornax error as a dict)
``races``      data races the happens-before detector found (both commands named)
``torch``      only for a torch front-end workload (``--framework torch``): ATen calls by
               route, the ops, CPU fallbacks with counts and reasons, losses per step
``parallel``   only for ``--parallel dp|tp``: per rank its simulated time, compute and
               (exposed) communication, every collective, the scaling against one device
``jax``        only for a JAX front-end workload (``--framework jax``): jaxpr equations by
               primitive and route (native, fallback with reasons, control), host-driven
               control flow and transfer counts, losses per step

Simulated device time and host wall time are different clocks and are never
added together.
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.tree import Tree

import fornax

if TYPE_CHECKING:
    from .layers.framework import RunResult
    from .stack import Stack

#: a JSON object of the report (its fields are documented above and in the schema)
JSON = dict[str, Any]

SCHEMA = "fornax.report/1"
SEAM_ORDER = ("framework", "compiler", "library", "runtime", "driver")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def manifest(stack: Stack, workload: str, framework: str = "graph") -> JSON:
    cfg = stack.config
    return {
        "fornax": fornax.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": _version("torch"),
        "jax": _version("jax"),
        "jaxlib": _version("jaxlib"),
        "stack": {seam: cfg.seams[seam] for seam in SEAM_ORDER},
        "spec": stack.spec.name,
        "spec_source": stack.spec.source,
        "devices": cfg.devices,
        "nodes": getattr(cfg, "nodes", 1),        # the devices' nodes (the NIC tier joins them)
        "seed": cfg.seed,
        "workload": workload,
        "framework": framework,          # graph (built in the graph IR), torch (torch.nn) or jax
        # shape-only mode: no data ran, so numerics is empty and costs come from kernel estimates
        "meta": bool(getattr(cfg, "meta", False)),
        "paths": list(getattr(cfg, "paths", ())),   # portability paths chosen by --path
        # every device runs a rank (--parallel dp|tp); absent when the run uses device 0 only
        **({"parallel": cfg.parallel} if getattr(cfg, "parallel", None) else {}),
        # the chip split into partitions (--partition); absent: the whole chip was one device
        **({"partition": split.describe()} if (split := getattr(stack, "layout", None)) else {}),
    }


def build(stack: Stack, workload: str, result: RunResult | None = None,
          numerics: Iterable[JSON] | None = None, host_wall_s: float = 0.0,
          errors: Iterable[JSON] | None = None, framework: str = "graph") -> JSON:
    seams = {seam: stack.seam(seam).report() for seam in SEAM_ORDER}
    seams["compiler"]["negotiation"] = stack.negotiation
    driver = stack.driver
    kernels = [{"name": k.name, "grid": list(k.grid), "device_time_s": k.duration_s,
                "flops": k.flops, "bytes": k.bytes, "bound": k.bound} for k in driver.kernel_log]
    dev = stack.devices[0]
    plans = result.plans if result is not None else []
    costs = {
        "device_time_s": max(d.timeline.busy_time for d in stack.devices),
        "host_wall_s": host_wall_s,
        "kernels": getattr(driver.kernel_log, "total", len(driver.kernel_log)),
        "launches": driver.counts["launches"],
        "fused_kernels": sum(p.stats["fused_kernels"] for p in plans),
        "library_calls": len(stack.library.calls),
        "copies": driver.counts["copies"],
        "h2d_bytes": driver.counts["h2d_bytes"],
        "d2h_bytes": driver.counts["d2h_bytes"],
        "peak_device_bytes": max(d.memory.peak for d in stack.devices),
        # the compiler's memory plan: most storage live at once (largest device segment)
        "planned_peak_bytes": max((p.stats.get("planned_peak_bytes", 0) for p in plans), default=0),
        "compile_wall_s": stack.compiler.compile_wall_s,
        "module_build_s": driver.module_load_s,       # simulated JIT / IL build in the driver
        # cross-family binary translation between compiler output and driver load (simulated)
        "translations": seams["compiler"].get("translator", {}).get("translations", 0),
        "translate_s": seams["compiler"].get("translator", {}).get("simulated_s", 0.0),
        # host time a marshalling library layer spent before its calls (on the host clock)
        "marshal_s": seams["library"].get("marshalling", {}).get("simulated_s", 0.0),
        "flops": float(getattr(driver.kernel_log, "flops", None)
                       or sum(k.flops for k in driver.kernel_log)),
        "spec_hbm_bytes": dev.spec.hbm_bytes,
        # how the host executed the launches (replay never changes a result or a device time)
        "execution": {**dev.replays.stats(),
                      # resident plans: runs captured, and runs that replayed a capture's calls
                      "plans_captured": seams["framework"].get("plans_captured", 0),
                      "plan_runs_replayed": seams["framework"].get("plan_runs_replayed", 0)},
    }
    power = [d.power.summary(until=costs["device_time_s"]) for d in stack.devices]
    costs["energy_j"] = sum(p["energy_j"] for p in power)
    costs["avg_power_w"] = costs["energy_j"] / costs["device_time_s"] if costs["device_time_s"] > 0 else 0.0
    costs["throttled_s"] = sum(p["throttled_s"] for p in power)
    costs["peak_temp_c"] = max(p["peak_temp_c"] for p in power)
    return {
        "schema": SCHEMA,
        "manifest": manifest(stack, workload, framework),
        "seams": seams,
        "numerics": list(numerics or []),
        "costs": costs,
        "kernels": kernels,
        "fallbacks": list(result.fallbacks) if result is not None else [],
        "errors": list(errors or []),
        "races": [r.to_dict() for d in stack.devices for r in d.races],
    }


TORCH_ROUTES = ("native", "decomposed", "fallback", "view")


def route_totals(rows: list[JSON], routes: Iterable[str]) -> JSON:
    """Counts per route of a front end's ``{..., route, count}`` rows; every route in
    ``routes`` is named (0 when unused)."""
    totals = {r: 0 for r in routes}
    for r in rows:
        totals[r["route"]] = totals.get(r["route"], 0) + r["count"]
    return totals


def rows_delta(before: list[JSON], after: list[JSON], key: str) -> list[JSON]:
    """What a front end's route rows (``{key, route, count, reason}``) recorded between two of
    its reports: the rows whose count grew, with the growth as their count, most first."""
    old = {(r[key], r["route"]): r["count"] for r in before}
    rows = [{**r, "count": r["count"] - old.get((r[key], r["route"]), 0)} for r in after]
    rows = [r for r in rows if r["count"] > 0]
    rows.sort(key=lambda r: (-r["count"], r[key], r["route"]))
    return rows


def front_end_counts(rep: JSON) -> None:
    """Make the framework seam's counts in ``rep`` those of the front end that captured the
    work.  The seam counts graph-IR nodes it routes itself; a torch or jax run goes through
    its front end instead (ATen calls, jaxpr equations), whose own routes are the capture."""
    framework = rep["seams"]["framework"]
    if rep.get("torch"):
        routes = rep["torch"]["routes"]
        framework.update(captured_by="torch front end (ATen calls)", ops_captured=sum(routes.values()),
                         native=routes.get("native", 0), decomposed=routes.get("decomposed", 0),
                         fallback=routes.get("fallback", 0), graphs_run=routes.get("native", 0),
                         device_segments=routes.get("native", 0) + routes.get("decomposed", 0))
    elif rep.get("jax"):
        routes, counts = rep["jax"]["routes"], rep["jax"].get("counts", {})
        framework.update(captured_by="jax front end (jaxpr equations)", ops_captured=sum(routes.values()),
                         native=routes.get("native", 0), decomposed=0, fallback=routes.get("fallback", 0),
                         graphs_run=counts.get("executions", 0),
                         device_segments=counts.get("segments_run", 0))


def torch_section(routes: JSON, *, mode: str = "eager", stack: str = "", losses: Iterable[float] = (),
                  reference_losses: Iterable[float] = (), reference_wall_s: float = 0.0) -> JSON:
    """``report["torch"]``: what the torch front end did in one run.  ``routes`` is that run's
    share of ``fornax.frameworks.torch.report()`` (``ops`` rows ``{op, route, count, reason}``);
    calls per route always name native, decomposed, fallback and view (0 when unused)."""
    ops = [dict(r) for r in routes.get("ops", [])]
    return {"mode": mode, "stack": stack, "routes": route_totals(ops, TORCH_ROUTES), "ops": ops,
            "fallbacks": [{"op": r["op"], "count": r["count"], "reason": r["reason"]}
                          for r in ops if r["route"] == "fallback"],
            "losses": [float(v) for v in losses],
            "reference_losses": [float(v) for v in reference_losses],
            "reference_wall_s": reference_wall_s}


JAX_ROUTES = ("native", "fallback", "control")
#: the JAX client's counters a run reports (0 when unused): programs executed, compiled segments
#: launched, equations run on the host, cond branches and loop iterations driven from the host,
#: and the bytes copied host to device and back
JAX_COUNTS = ("executions", "segments_run", "host_fallback_runs", "host_branches",
              "host_loop_iterations", "h2d_bytes", "d2h_bytes")


def received_text(got: JSON, host: bool = True) -> str:
    """The program a JAX run handed the stack (``report["jax"]["received"]``), in words;
    ``host=False`` leaves out the figures that vary from host to host (the bytecode carries
    source paths; the read time is a host clock)."""
    if got["ir"] == "jaxpr":
        return f"jaxpr: {got['equations']} equations"
    text = f"StableHLO: {got['ops']} ops of {len(got['kinds'])} kinds"
    if host:
        text += f", {fmt_bytes(got['bytes'])} of bytecode, read in {fmt_time(got['compile_s'])}"
    return text


def jax_section(routes: JSON, *, stack: str = "", platform: str = "", plugin: str = "",
                platform_version: str = "", losses: Iterable[float] = (),
                reference_losses: Iterable[float] = (), reference_wall_s: float = 0.0,
                received: JSON | None = None) -> JSON:
    """``report["jax"]``: what the JAX front end did in one run.  ``routes`` is that run's share
    of a client's ``report()`` (``primitives`` rows ``{primitive, route, count, reason}`` and
    ``counts``); equations per route always name native, fallback and control (0 when unused)."""
    rows = [dict(r) for r in routes.get("primitives", [])]
    totals = route_totals(rows, JAX_ROUTES)
    counts = routes.get("counts", {})
    return {"stack": stack, "platform": platform, "plugin": plugin, "platform_version": platform_version,
            "routes": totals, "primitives": rows,
            "fallbacks": [{"primitive": r["primitive"], "count": r["count"], "reason": r["reason"]}
                          for r in rows if r["route"] == "fallback"],
            "counts": {k: int(counts.get(k, 0)) for k in JAX_COUNTS},
            "losses": [float(v) for v in losses],
            "reference_losses": [float(v) for v in reference_losses],
            "reference_wall_s": reference_wall_s,
            **({"received": dict(received)} if received else {})}


# ---- rendering ------------------------------------------------------------------------------
def fmt_time(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.2f} µs"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _seam_lines(name: str, seam: JSON) -> list[str]:
    if name == "framework":
        ver = next((f"{k}={v}" for k, v in seam.items() if k.startswith("version.")), "")
        return [f"face: device '{seam['device_type']}' via {seam['module']} ({ver}), "
                f"dist backend {seam['dist_backend']}",
                f"ops captured {seam['ops_captured']}"
                f"{' by the ' + seam['captured_by'] if seam.get('captured_by') else ''}: native {seam['native']}, decomposed "
                f"{seam['decomposed']}, CPU fallback {seam['fallback']}; "
                f"{seam['device_segments']} device segment(s)"]
    if name == "compiler":
        neg = seam.get("negotiation", {})
        lines = [f"emits {neg.get('compiler_format')} for "
                 f"{neg.get('translation', {}).get('source_target', neg.get('target'))} "
                f"(driver loads {', '.join(neg.get('driver_loads', []))})",
                f"{seam['ops_in']} ops -> {seam['ops_lowered']} after decomposition -> "
                f"{seam['kernels']} kernels ({seam['fused_kernels']} fused) + "
                f"{seam['library_calls']} library calls; SIMD {seam['simd_width']}, matrix "
                f"{'x'.join(map(str, seam['matrix_shape']))}; {seam['binary_bytes']} bytes of binary"
                + (f" ({seam['graphs_from_disk']} graph(s) as compiled by an earlier run, from the "
                   f"disk cache)" if seam.get("graphs_from_disk") else ""),
                f"compile cache hits {seam['cache_hits']}{_cache_levels(seam.get('compile_cache'))}; "
                f"compile wall {fmt_time(seam['compile_wall_s'])}"
                + (f"; planned peak memory {fmt_bytes(seam['planned_peak_bytes'])}"
                   if "planned_peak_bytes" in seam else "")]
        t = seam.get("translator")
        if t:
            verb = {"cross-compile": "cross-compiled", "port": "ported"}.get(t.get("mechanism", ""),
                                                                            "translated")
            lanes = t.get("lane_efficiency", 1.0)
            lines.append(f"{verb} {t['from']} -> {t['to']} by {t['name']} (declared by "
                         f"{t['declared_by']}): {t['translations']} module(s), {fmt_bytes(t['bytes_in'])}"
                         f" -> {fmt_bytes(t['bytes_out'])}, {t['reused']} reused, "
                         f"{fmt_time(t['simulated_s'])} simulated"
                         + (f"; kernels keep their source SIMD layout: {lanes:.0%} of each hardware "
                            "group's lanes do vector work" if lanes < 1 else ""))
        return lines
    if name == "library":
        lines = [f"{seam['name']}: {seam['calls']} call(s); ships {', '.join(seam['shipped'])}"]
        mh = seam.get("marshalling")
        if mh:
            lines.append(f"forwarded to {mh['backend_library']} ({mh['backend']}) by {mh['name']}: "
                         f"{mh['calls']} call(s), {fmt_time(mh['simulated_s'])} simulated host overhead "
                         f"({fmt_time(mh['per_call_s'])} per call, {mh.get('basis') or 'no basis given'})")
        for c in seam["algorithms_chosen"][:6]:
            # gemm shapes are [batch, m, n, k]; other routines (convolution) list their own sizes
            what = "gemm" if c.get("routine", "gemm") == "gemm" else c["routine"]
            lines.append(f"{what} {'x'.join(map(str, c['shape']))}: {c['algorithm']} from {c['image']} "
                         f"— {c['reason']}")
        return lines
    if name == "runtime":
        return [f"{seam['api']}, queues: {seam['queue_kind']}; {seam['launches']} launches, "
                f"{seam['h2d_copies']} H2D / {seam['d2h_copies']} D2H copies, {seam['host_syncs']} host syncs",
                f"caching allocator: {seam['malloc_calls']} mallocs, {seam['segment_allocations']} "
                f"segments from the driver, {seam['cache_hits']} served from cache, peak {fmt_bytes(seam['peak_allocated_bytes'])}; "
                f"module cache hits {seam['module_cache_hits']}"]
    return [f"{seam['api']} on {_counted(seam['devices'])}; loads {', '.join(seam['loadable_formats'])}",
            f"{seam['modules_loaded']} module(s) loaded ({seam['jit_compiles']} JIT, "
            f"{seam['il_builds']} IL builds, {fmt_time(seam['module_load_s'])}), "
            f"{seam['launches']} launches, {seam['copies']} copies "
            f"({fmt_bytes(seam['h2d_bytes'])} H2D, {fmt_bytes(seam['d2h_bytes'])} D2H)"]


#: rows a long table shows unless ``render(..., all_rows=True)`` (``--all``)
ROWS = 20


def _shown(rows: list[Any], all_rows: bool) -> tuple[list[Any], str | None]:
    """The rows a table shows, and its caption when some are hidden."""
    if all_rows or len(rows) <= ROWS:
        return rows, None
    return rows[:ROWS], f"{len(rows) - ROWS} more row(s) not shown of {len(rows)}; --all shows every row"


def render(report: JSON, console: Console | None = None, all_rows: bool = False) -> None:
    console = console or Console()
    m = report["manifest"]
    tree = Tree(f"[bold]fornax stack[/] — workload [cyan]{m['workload']}[/] on spec "
                f"[cyan]{m['spec']}[/] x{m['devices']}, seed {m['seed']}")
    if "partition" in m:
        part = m["partition"]
        first = part["partitions"][0]
        tree.add(f"[bold]partition[/]: [cyan]{part['layout']}[/] ({len(part['partitions'])} "
                 f"partition(s)); the run used partition 0, {first['label']}: "
                 f"{first['compute_units']} units, {fmt_bytes(first['hbm_bytes'])}")
    for name in SEAM_ORDER:
        seam = report["seams"][name]
        branch = tree.add(f"[bold]{name}[/]: [green]{m['stack'][name]}[/]")
        for line in _seam_lines(name, seam):
            branch.add(line)
    crossings = report["seams"]["compiler"].get("negotiation", {}).get("crossings", [])
    if crossings:
        paths = tree.add("[bold]portability paths[/] (where the stack crosses between families)")
        for c in crossings:
            other = c.get("alternatives") or []
            paths.add(f"{c['boundary']}: {c['upper']} over {c['lower']} — {c['mechanism']} "
                      f"[cyan]{c['name']}[/]{' (chosen by --path)' if c.get('forced') else ''}: "
                      f"{c['real_name']}"
                      + (f"; also declared: {', '.join(other)} (--path NAME)" if other else ""))
    console.print(tree)

    if report["kernels"]:
        rows, caption = _shown(report["kernels"], all_rows)
        kt = Table(title="kernels (simulated device)", show_lines=False, caption=caption)
        for col in ("kernel", "grid", "device time", "GFLOP", "bytes", "bound"):
            kt.add_column(col, justify="left" if col in ("kernel", "bound") else "right")
        for k in rows:
            kt.add_row(k["name"], "x".join(map(str, k["grid"])), fmt_time(k["device_time_s"]),
                       f"{k['flops'] / 1e9:.3f}", fmt_bytes(k["bytes"]), k["bound"])
        console.print(kt)

    if report["manifest"].get("meta"):
        console.print("numerics: none — a shape-only (meta) run has no data; "
                      "kernel costs come from their estimates")
    if report["numerics"]:
        nt = Table(title="numerics vs float64 reference")
        for col in ("output", "dtype", "shape", "max abs err", "max rel err", "tol", "ok"):
            nt.add_column(col)
        for n in report["numerics"]:
            nt.add_row(n["output"], n["dtype"], "x".join(map(str, n["shape"])), f"{n['max_abs_err']:.2e}",
                       f"{n['max_rel_err']:.2e}", f"{n['tol']:.0e}",
                       "[green]ok[/]" if n["ok"] else "[red]FAIL[/]")
        console.print(nt)

    c = report["costs"]
    ct = Table(title="costs", show_header=False)
    ct.add_column("what")
    ct.add_column("value", justify="right")
    ct.add_row("simulated device time", fmt_time(c["device_time_s"]))
    ct.add_row("host wall time (separate clock)", fmt_time(c["host_wall_s"]))
    ex = c.get("execution")
    if ex:
        ct.add_row("kernel launches on the host",
                   f"{ex['interpreted']} interpreted, {ex['recorded']} recorded, {ex['replayed']} replayed "
                   f"({ex['fast_path']} by a fast path)" if ex["replay"]
                   else f"{ex['interpreted']} interpreted (replay off)")
        if ex.get("plans_captured"):
            ct.add_row("compiled plan runs on the host",
                       f"{ex['plans_captured']} captured, {ex['plan_runs_replayed']} replayed")
    ct.add_row("kernels / launches / fused", f"{c['kernels']} / {c['launches']} / {c['fused_kernels']}")
    ct.add_row("library calls", str(c["library_calls"]))
    ct.add_row("H2D / D2H bytes", f"{fmt_bytes(c['h2d_bytes'])} / {fmt_bytes(c['d2h_bytes'])}")
    ct.add_row("peak device memory", fmt_bytes(c["peak_device_bytes"]))
    if c.get("planned_peak_bytes"):
        ct.add_row("planned peak (compiler memory plan)", fmt_bytes(c["planned_peak_bytes"]))
    ct.add_row("compile (host wall)", fmt_time(c["compile_wall_s"]))
    ct.add_row("module JIT / IL build (simulated, driver)", fmt_time(c["module_build_s"]))
    if c.get("translations"):
        ct.add_row("binary translation (simulated, module load)", f"{c['translations']} module(s), "
                   f"{fmt_time(c['translate_s'])}")
    if c.get("marshal_s"):
        ct.add_row("library marshalling (simulated host)", fmt_time(c["marshal_s"]))
    if "energy_j" in c:
        ct.add_row("energy (simulated)", f"{c['energy_j']:.4g} J")
        ct.add_row("average power", f"{c['avg_power_w']:.1f} W")
        ct.add_row("time at a throttled clock", fmt_time(c["throttled_s"]))
        ct.add_row("peak temperature", f"{c['peak_temp_c']:.1f} °C")
    console.print(ct)
    if report.get("parallel"):
        from .report_parallel import render_parallel
        render_parallel(report["parallel"], console, all_rows)
    if report.get("torch"):
        _render_torch(report["torch"], console)
    if report.get("jax"):
        _render_jax(report["jax"], console)

    if report["fallbacks"]:
        ft = Table(title="CPU fallbacks")
        ft.add_column("op")
        ft.add_column("reason")
        for f in report["fallbacks"]:
            ft.add_row(f["op"], f["reason"])
        console.print(ft)
    if report.get("races"):
        rows, caption = _shown(report["races"], all_rows)
        rt = Table(title=f"data races ({len(report['races'])}, simulated device)", caption=caption)
        for col in ("kind", "bytes", "first", "second"):
            rt.add_column(col)
        for r in rows:
            a, b = r["first"], r["second"]
            rt.add_row(r["kind"], f"[{r['range'][0]:#x}, {r['range'][1]:#x})",
                       f"{a['kind']} {a['label']} ({a['access']} {a['param']}) on queue {a['queue']}, "
                       f"{fmt_time(a['start_s'])}-{fmt_time(a['end_s'])}",
                       f"{b['kind']} {b['label']} ({b['access']} {b['param']}) on queue {b['queue']}, "
                       f"{fmt_time(b['start_s'])}-{fmt_time(b['end_s'])}")
        console.print(rt)
    for e in report["errors"]:
        console.print(f"[red]error[/] {e['message']}")


def _counted(names: list[str]) -> str:
    """Names in order, each run of one name once with its count (``sm_90 x1024``)."""
    runs: list[list[Any]] = []
    for n in names:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ", ".join(n if k == 1 else f"{n} x{k}" for n, k in runs)


def _cache_levels(c: JSON | None) -> str:
    """The compile cache's levels, for the compiler seam's line."""
    if not c:
        return ""
    corrupt = f", {c['corrupt']} corrupt entries rebuilt" if c.get("corrupt") else ""
    bypassed = f", {c['bypassed']} bypassed to dump the IR" if c.get("bypassed") else ""
    return f" (memory {c['memory_hits']}, disk {c['disk_hits']}, misses {c['misses']}{corrupt}{bypassed})"


def _render_routes(console: Console, title: str, routes: JSON, rows: list[JSON], key: str,
                   unit: str, names: str, fallback_title: str) -> None:
    """A front end's route table (``unit`` per route, distinct ``names``, the most common) and
    its fallbacks with counts and reasons; ``rows`` are ``{key, route, count, reason}``."""
    rt = Table(title=title)
    for col in ("route", unit, names, "most common"):
        rt.add_column(col, justify="right" if col in (unit, names) else "left")
    for route, n in routes.items():
        mine = [r for r in rows if r["route"] == route]
        top = ", ".join(f"{r[key].removeprefix('aten::')} x{r['count']}" for r in mine[:4])
        rt.add_row(route, str(n), str(len(mine)), top + (", ..." if len(mine) > 4 else ""))
    console.print(rt)
    fallbacks = [r for r in rows if r["route"] == "fallback"]
    if fallbacks:
        ft = Table(title=fallback_title)
        for col in (key, unit, "reason"):
            ft.add_column(col, justify="right" if col == unit else "left")
        for f in fallbacks:
            ft.add_row(f[key], str(f["count"]), f["reason"])
        console.print(ft)


def _render_torch(sec: JSON, console: Console) -> None:
    """The torch front end's section: ATen calls by route, CPU fallbacks, losses per step."""
    _render_routes(console, f"torch front end ({sec['mode']}, {sec['stack']}): ATen calls by route",
                   sec["routes"], sec["ops"], "op", "calls", "ops", "torch front end: CPU fallbacks")
    _render_losses(sec, console)


def _render_jax(sec: JSON, console: Console) -> None:
    """The JAX front end's section: jaxpr equations by route, host fallbacks with reasons,
    control flow driven from the host and transfers, losses per step."""
    _render_routes(console, f"jax front end ({sec['platform']}, {sec['stack']}): jaxpr equations by route",
                   sec["routes"], sec["primitives"], "primitive", "equations", "primitives",
                   "jax front end: host fallbacks (jax's CPU implementation)")
    c = sec["counts"]
    ct = Table(title="jax front end: executions, host-driven control flow, transfers", show_header=False)
    ct.add_column("what")
    ct.add_column("count", justify="right")
    for what, value in (("PJRT platform / plugin", f"{sec['platform']} / {sec['plugin']}"),
                        ("platform version", sec["platform_version"]),
                        ("program executions", str(c["executions"])),
                        ("compiled segments launched", str(c["segments_run"])),
                        ("equations run on the host", str(c["host_fallback_runs"])),
                        ("cond branches (host-driven)", str(c["host_branches"])),
                        ("loop iterations (host-driven)", str(c["host_loop_iterations"])),
                        ("H2D / D2H bytes", f"{fmt_bytes(c['h2d_bytes'])} / {fmt_bytes(c['d2h_bytes'])}")):
        ct.add_row(what, value)
    if sec.get("received"):
        ct.add_row("program handed over", received_text(sec["received"]))
    console.print(ct)
    _render_losses(sec, console)


def _render_losses(sec: JSON, console: Console) -> None:
    """Loss per training step next to the float64 reference's (a front end's section)."""
    if sec["losses"]:
        lt = Table(title="training loss per step (fornax device vs float64 CPU)")
        for col in ("step", "loss", "CPU float64", "rel diff"):
            lt.add_column(col, justify="right")
        refs = sec["reference_losses"] or [None] * len(sec["losses"])
        for i, (a, b) in enumerate(zip(sec["losses"], refs)):
            lt.add_row(str(i), f"{a:.6g}", "-" if b is None else f"{b:.6g}",
                       "-" if not b else f"{abs(a - b) / abs(b):.1e}")
        console.print(lt)
