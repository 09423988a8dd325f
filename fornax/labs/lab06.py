"""Lab 6: the graph compiler -- capture, decompositions, fusion and the IR after each pass.

Experiments: a small graph workload (the MLP with a softmax head) compiled by each family
with fusion on and off (kernels, fused kernels, launches, device time); the pass log and
the kernels fusion formed for one family (``fornax compile --emit ir``); and
``torch.compile(backend="fornax")`` of a small module called with a changed batch size,
counting the graphs Dynamo compiles (its guards fail on a new shape, so it recompiles).

The last exercise is code: the student's ``fusion.py`` defines ``build()`` returning a graph
and its feeds; the check imports that file (the student's own code, run deliberately, as a
test runs it), compiles and runs the graph on the chosen family's stack, and passes when the
compiler reports a fused kernel and the numerics match the float64 reference.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

from .lab import Exercise, Lab, Section, Table, answer, figure, number_fact

FAMILIES = ("cuda-like", "rocm-like", "xpu-like")
WORKLOAD = "mlp-softmax"
IR_FAMILY = "rocm-like"
BATCHES = (8, 8, 16, 16, 8)
FUSE_PASS = "fornax/layers/passes/fuse.py"


@lru_cache(maxsize=1)
def _fusion() -> dict[str, dict[str, dict[str, Any]]]:
    """Per family, per fusion setting: the compiler seam's kernels and the run's costs."""
    from fornax import report
    from fornax.scenarios.workloads import get_workload
    from fornax.stack import compose, make_config
    build = get_workload(WORKLOAD).build
    assert build is not None
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for vendor in FAMILIES:
        out[vendor] = {}
        for fuse in (True, False):
            stack = compose(make_config(vendor, fuse=fuse))
            graph, feeds = build(0)
            rep = report.build(stack, WORKLOAD, stack.run(graph, feeds))
            comp, costs = rep["seams"]["compiler"], rep["costs"]
            out[vendor]["on" if fuse else "off"] = {
                "kernels": comp["kernels"], "fused_kernels": comp["fused_kernels"],
                "library_calls": comp["library_calls"], "launches": costs["launches"],
                "device_time_s": costs["device_time_s"]}
    return out


@lru_cache(maxsize=1)
def _passes() -> dict[str, Any]:
    """The pass log and the kernels fusion formed for the workload on ``IR_FAMILY``."""
    from fornax.layers.compiler import PassPipeline
    from fornax.layers.passes import route as routing
    from fornax.layers.passes.fuse import fuse
    from fornax.scenarios.workloads import get_workload
    from fornax.stack import compose, make_config
    build = get_workload(WORKLOAD).build
    assert build is not None
    graph, _ = build(0)
    stack = compose(make_config(IR_FAMILY))
    compiler = stack.compiler
    assert isinstance(compiler, PassPipeline)          # every shipped family's compiler is
    routines = frozenset(stack.library.ops())
    lowered = compiler.run_graph_passes(graph)
    groups = fuse(lowered, routing.library_ops(compiler.route, routines), enabled=True)
    plan = compiler.compile(graph, stack.target, routines)
    log = [line.split(": ", 1) for line in plan.log if ": " in line]
    ops_in = len(graph.nodes)
    decomposed = next(int(text.split("-> ")[1].split()[0]) for name, text in log if name == "decompose")
    return {"log": [(name, text) for name, text in log], "ops_in": ops_in, "decomposed": decomposed,
            "groups": [(g.kind, ", ".join(n.op for n in g.nodes)) for g in groups]}


def _torch_child() -> None:
    """Run in a child process (a fresh Dynamo and a fresh fornax device): a small module
    compiled with ``backend="fornax"``, called with the batch sizes ``BATCHES``; prints JSON."""
    import torch
    from torch._dynamo.utils import counters

    import fornax.frameworks.torch as ft
    ft.register_backend()
    ft.use_stack("cuda-like")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("fornax")
    run = torch.compile(model, backend="fornax", dynamic=False)
    calls = []
    with torch.no_grad():
        for batch in BATCHES:
            x = torch.randn(batch, 16)
            y = run(x.to("fornax")).cpu()
            ok = torch.allclose(y, model.cpu()(x), rtol=1e-4, atol=1e-5)
            model.to("fornax")
            calls.append({"batch": batch, "graphs": int(counters["stats"]["unique_graphs"]), "ok": bool(ok)})
    print(json.dumps({"calls": calls, "graphs": int(counters["stats"]["unique_graphs"])}))


@lru_cache(maxsize=1)
def _torch() -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", "from fornax.labs.lab06 import _torch_child; _torch_child()"],
                          capture_output=True, text=True, timeout=300, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the torch.compile experiment failed:\n{proc.stderr[-2000:]}")
    return cast("dict[str, Any]", json.loads(lines[-1]))


def experiments(out: Path) -> list[Section]:
    fus, passes, tc = _fusion(), _passes(), _torch()
    _picture(fus, out / "fusion.png")
    return [
        Section("Fusion on and off, three families",
                f"The {WORKLOAD} workload (64x256 @ 256x512, bias, ReLU, @ 512x128, bias, row softmax) "
                "compiled by each family's compiler seam with fusion on and off (the stack config's "
                "`fuse` switch; `fornax compile --no-fuse`). Kernels and fused kernels are the compiler "
                "seam's counts (seams.compiler in the run report: a fused kernel holds more than one "
                "op); launches and device time are the run's costs, all on the simulated clock. "
                "Matmuls a family routes to its library are library calls, not generated kernels.",
                [Table(f"{WORKLOAD}: fusion on / off", ["family", "fusion", "kernels", "fused kernels",
                                                         "library calls", "launches", "device time"],
                       [[v, f, str(d["kernels"]), str(d["fused_kernels"]), str(d["library_calls"]),
                         str(d["launches"]), f"{d['device_time_s'] * 1e6:.2f} µs"]
                        for v, by in fus.items() for f, d in by.items()])], ["fusion.png"]),
        Section("The IR after each pass",
                f"`fornax compile --workload {WORKLOAD} --vendor {IR_FAMILY} --emit ir` prints the graph "
                "after the graph passes, the kernels fusion formed and the pass log (`--dump-ir DIR` on "
                "a run writes the IR after every pass). Decomposition turns the composite softmax into "
                f"primitives ({passes['ops_in']} -> {passes['decomposed']} ops); routing sends the matmuls "
                "to the library; fusion groups the rest greedily, producer into consumer, so the bias "
                "add joins the softmax's row reduction in one kernel.",
                [Table(f"pass log on {IR_FAMILY}", ["pass", "what it did"],
                       [[n, t] for n, t in passes["log"]]),
                 Table(f"kernels after fusion on {IR_FAMILY}", ["step", "kind", "ops"],
                       [[str(i), k, ops] for i, (k, ops) in enumerate(passes["groups"])])]),
        Section("Capture: torch.compile, guards and recompiles",
                "`torch.compile(model, backend=\"fornax\", dynamic=False)` of Linear(16, 32), ReLU, "
                "Linear(32, 4) on fornax tensors (the cuda-like stack), called with batch sizes "
                f"{', '.join(map(str, BATCHES))}. Dynamo captures an FX graph and guards it on the "
                "input's shape; AOTAutograd decomposes it to core ATen, and fornax lowers that into "
                "its graph IR for the compiler seam (fornax/frameworks/torch/graph.py). A call whose "
                "shape fails every guard recompiles; one that matches a cached graph reuses it. "
                "Counts are Dynamo's (torch._dynamo.utils.counters) in a fresh process.",
                [Table("torch.compile calls", ["call", "batch", "graphs compiled so far", "matches eager"],
                       [[str(i + 1), str(c["batch"]), str(c["graphs"]), "yes" if c["ok"] else "no"]
                        for i, c in enumerate(tc["calls"])])]),
    ]


def _picture(fus: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:
    fig = figure(6, 3.2)
    ax = fig.subplots()
    xs = range(len(fus))
    ax.bar([x - 0.2 for x in xs], [d["on"]["kernels"] for d in fus.values()], width=0.4, label="fusion on")
    ax.bar([x + 0.2 for x in xs], [d["off"]["kernels"] for d in fus.values()], width=0.4, label="fusion off")
    ax.set_xticks(list(xs), list(fus))
    ax.set_ylabel("generated kernels")
    ax.set_title(f"{WORKLOAD}: kernels with fusion on and off")
    ax.legend()
    fig.savefig(path, format="png", dpi=90)


def facts() -> dict[str, Any]:
    fus, passes, tc = _fusion(), _passes(), _torch()
    return {"xpu_kernels": fus["xpu-like"]["on"]["kernels"], "decomposed": passes["decomposed"],
            "graphs": tc["graphs"]}


def _check_fusion(answers: dict[str, Any], folder: Path, facts: dict[str, Any]) -> tuple[bool, str, str]:
    """fusion.py's build() gives a graph the chosen family's compiler fuses, with right numerics."""
    want = "fusion.py whose build() graph compiles to a fused kernel with numerics within tolerance"
    family = str(answer(answers, "6.4")).strip()
    if family not in FAMILIES:
        return False, want, f"ex6_4 = {family!r}: name the family, one of {', '.join(FAMILIES)}"
    path = folder / "fusion.py"
    if not path.is_file():
        return False, want, "no fusion.py"
    # the student's own code, imported and run deliberately (as a test would run it)
    try:
        spec = importlib.util.spec_from_file_location("fornax_lab06_fusion", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        build = getattr(module, "build", None)
        if not callable(build):
            return False, want, "fusion.py defines no build()"
        built = build()
    except Exception as exc:                                   # noqa: BLE001 -- the student's code
        return False, want, f"fusion.py raised {type(exc).__name__}: {exc}"
    return _run_fusion(family, built, want)


def _run_fusion(family: str, built: Any, want: str) -> tuple[bool, str, str]:
    import numpy as np

    from fornax.layers.graph import Graph
    from fornax.scenarios.workloads import numerics
    from fornax.stack import compose, make_config
    if not (isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], Graph)
            and isinstance(built[1], dict)):
        return False, want, f"build() returned {type(built).__name__}, not (Graph, feeds dict)"
    graph, feeds = built
    stack = compose(make_config(family))
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            graph.verify()
            result = stack.run(graph, feeds)
            rows = numerics(graph, cast("list[np.ndarray]", result.outputs), feeds)
    except Exception as exc:                                   # noqa: BLE001 -- the student's graph
        return False, want, f"the graph did not run on {family}: {type(exc).__name__}: {exc}"
    comp = stack.compiler.report()
    seen = f"{comp['kernels']} kernels, {comp['fused_kernels']} fused on {family}"
    if comp["fused_kernels"] < 1:
        return False, want, f"{seen}: nothing fused"
    bad = [r for r in rows if not r["ok"]]
    if bad:
        r = bad[0]
        return False, want, f"{seen}, but output {r['output']} is off: relative error {r['max_rel_err']:.3g} " \
                            f"(tolerance {r['tol']:g})"
    return True, want, seen


LAB = Lab(
    number=6, slug="06-graph-compiler", title="The graph compiler", part="Part 6",
    goal="Follow a graph through the compiler seam: capture with torch.compile (guards and "
         "recompiles), decompositions, fusion and the IR after each pass, on each family; then "
         "write a graph that makes a fusion happen.",
    minutes=30, experiments=experiments, facts=facts,
    exercises=[
        Exercise("6.1", f"How many kernels does the xpu-like compiler generate for {WORKLOAD} with "
                 "fusion on?", number_fact("6.1", "xpu_kernels"),
                 f"the compiler seam's fusion pass ({FUSE_PASS}) and xpu_like's route_to_library"),
        Exercise("6.2", f"After the decompose pass, how many ops does {WORKLOAD}'s graph have on "
                 f"{IR_FAMILY}?", number_fact("6.2", "decomposed"),
                 "fornax/layers/passes/decompose.py and the ops' decompose rules in fornax/layers/graph.py"),
        Exercise("6.3", "How many graphs does Dynamo compile for the module called with batch sizes "
                 f"{', '.join(map(str, BATCHES))} (dynamic=False)?", number_fact("6.3", "graphs"),
                 "Dynamo's shape guards: fornax/frameworks/torch/graph.py (shapes are static)"),
        Exercise("6.4", "Name a family here (cuda-like, rocm-like or xpu-like) and write fusion.py (in "
                 "this folder) defining build() -> (graph, feeds) in fornax's graph IR "
                 "(fornax/layers/graph.py; examples in fornax/scenarios/workloads.py) that this "
                 "family's compiler fuses into a kernel of two or more ops, with numerics within "
                 "tolerance. The check imports and runs your fusion.py, as a test would.",
                 _check_fusion, f"the compiler's fusion pass ({FUSE_PASS}): which ops join a kernel",
                 points=2),
    ],
    starter_files={"fusion.py": '"""Lab 6.4: build() returns (graph, feeds) whose ops the compiler fuses."""\n\n'
                                "from fornax.layers.graph import DType, Graph\n\n\n"
                                "def build():\n"
                                "    raise NotImplementedError(\"build a Graph and its feeds here\")\n"})
