"""Lab 11: framework boundaries and vendor stacks.

Experiments: one workload through PyTorch, JAX and the MAX-style front end on one stack
(where each puts the hardware boundary, and what that costs in kernels and device time);
JAX at both of its levels, a jaxpr and StableHLO through the PJRT plugin;
the same graph through the three vendor families seam by seam (formats, library calls,
kernels); and a mixed stack, one family's compiler over another family's driver, composed
through a portability path.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from ..layers.errors import ConfigError
from .lab import Exercise, Lab, Section, Table, figure, number_fact, text_fact

FAMILIES = ("cuda-like", "rocm-like", "xpu-like")
FRONT_ENDS = ("torch", "jax", "max")


@lru_cache(maxsize=1)
def _front_ends() -> dict[str, dict[str, Any]]:
    from fornax.compare import columns, compare
    doc = compare(columns("mlp", frameworks=list(FRONT_ENDS), vendors=["cuda-like"]))
    return {c["framework"]: {"kernels": c["metrics"]["kernels"], "device_time_s": c["metrics"]["device_time_s"],
                             "fallbacks": c["metrics"]["fallbacks"], **doc["boundaries"][c["framework"]]}
            for c in doc["columns"]}


@lru_cache(maxsize=1)
def _jax_levels() -> dict[str, dict[str, Any]]:
    """The mlp through fornax's JAX front end (a jaxpr) and through plain jax.jit on the PJRT
    plugin (StableHLO; in a process of its own), on cuda-like."""
    from fornax.compare import columns, compare
    from fornax.report import received_text
    doc = compare(columns("mlp", frameworks=["jax", "jax-pjrt"], vendors=["cuda-like"]))
    out = {}
    for c in doc["columns"]:
        program = received_text(c["report"]["jax"]["received"], host=False)
        out[c["framework"]] = {"program": program, "begins": doc["boundaries"][c["framework"]]["begins"],
                               "kernels": c["metrics"]["kernels"], "device_time_s": c["metrics"]["device_time_s"],
                               "h2d_bytes": c["metrics"]["h2d_bytes"]}
    return out


@lru_cache(maxsize=1)
def _families() -> dict[str, dict[str, Any]]:
    from fornax.compare import columns, compare
    doc = compare(columns("mlp", vendors=list(FAMILIES)))
    out = {}
    for c in doc["columns"]:
        rep = c["report"]
        comp = rep["seams"]["compiler"]
        out[c["label"]] = {"format": (comp.get("formats") or [""])[0], "library_calls": c["metrics"]["library_calls"],
                           "kernels": c["metrics"]["kernels"], "device_time_s": c["metrics"]["device_time_s"]}
    return out


def _mixed() -> dict[str, str]:
    from fornax.stack import compose, make_config
    stack = compose(make_config("rocm-like", {"compiler": "cuda-like"}))
    return {"stack": stack.describe(), "path": _path_of(stack)}


def _path_of(stack: Any) -> str:
    """The portability paths the stack composed through, with their real-world names."""
    names = [f"{c['boundary']}: {c['name']} ({c['real_name']})" for c in stack.negotiation.get("crossings", [])]
    return "; ".join(names) if names else "none (every boundary within one family)"


def experiments(out: Path) -> list[Section]:
    fe, fam, mixed, levels = _front_ends(), _families(), _mixed(), _jax_levels()
    _picture(fe, out / "front-ends.png")
    return [
        Section("One workload, three framework boundaries",
                "The mlp workload (64x256 @ 256x512, ReLU, @ 512x128) through PyTorch eager on "
                "torch.device('fornax'), fornax's JAX front end and the MAX-style graph API, all on the "
                "cuda-like stack (`fornax compare --frameworks torch,jax,max`). The same weights, the "
                "same function; what differs is what the vendor gets to see.",
                [Table("front ends on cuda-like", ["front end", "vendor code begins at", "kernels",
                                                   "device time", "fallbacks"],
                       [[f, d["begins"], str(d["kernels"]), f"{d['device_time_s'] * 1e6:.2f} µs",
                         str(d["fallbacks"])] for f, d in fe.items()])], ["front-ends.png"]),
        Section("JAX at both of its boundaries",
                "JAX's own hardware boundary is PJRT: a plugin receives a whole program as StableHLO and "
                "executes it. fornax's JAX front end takes the program one level higher, as a jaxpr; the "
                "fornax PJRT plugin (a C function table written in Python) sits at the real boundary, so "
                "plain jax.jit runs on jax.devices('fornax') (`fornax compare --frameworks jax,jax-pjrt`). "
                "The same function reaches the same stack either way and launches the same kernels; what "
                "differs is the program the vendor is handed, and what JAX moves across the boundary.",
                [Table("the mlp on cuda-like, handed over at two levels",
                       ["front end", "vendor code begins at", "program handed over", "kernels", "device time",
                        "host to device"],
                       [[f, d["begins"], d["program"], str(d["kernels"]), f"{d['device_time_s'] * 1e6:.2f} µs",
                         f"{d['h2d_bytes']} B"] for f, d in levels.items()])]),
        Section("One graph, three vendor families",
                "The same graph composed from each family's five seams (`fornax compare --vendors "
                "cuda-like,rocm-like,xpu-like`): each compiler emits its own binary format, and each "
                "family routes different ops to its library.",
                [Table("families on the graph front end", ["family", "binary format", "library calls",
                                                           "kernels", "device time"],
                       [[v, d["format"], str(d["library_calls"]), str(d["kernels"]),
                         f"{d['device_time_s'] * 1e6:.2f} µs"] for v, d in fam.items()])]),
        Section("Crossing families",
                "A cuda-like compiler over the rest of a rocm-like stack: the formats do not meet, so "
                "the stack composes through a portability path (or refuses, with --no-translate).",
                [Table("mixed stack", ["stack", "portability path"], [[mixed["stack"], mixed["path"]]])]),
    ]


def _picture(fe: dict[str, dict[str, Any]], path: Path) -> None:
    fig = figure(6, 3.2)
    ax = fig.subplots()
    ax.bar(list(fe), [d["kernels"] for d in fe.values()], color=["C0", "C1", "C2"])
    ax.set_ylabel("kernels launched")
    ax.set_title("mlp on cuda-like: kernels per front end")
    fig.savefig(path, format="png", dpi=90)


def facts() -> dict[str, Any]:
    fe, fam = _front_ends(), _families()
    return {"most_kernels": max(fe, key=lambda f: fe[f]["kernels"]),
            "rocm_format": fam["rocm-like"]["format"],
            "xpu_library_calls": fam["xpu-like"]["library_calls"]}


def _check_stack(answers: dict[str, Any], folder: Path, facts: dict[str, Any]) -> tuple[bool, str, str]:
    """stack.toml composes a cuda-like compiler over a rocm-like driver."""
    from fornax.stack import compose, load_config
    path = folder / "stack.toml"
    if not path.is_file():
        return False, "stack.toml with [stack.seams] compiler = cuda-like, driver = rocm-like", "no stack.toml"
    cfg = load_config(str(path))
    seams = dict(cfg.seams)
    got = f"compiler={seams.get('compiler')}, driver={seams.get('driver')}"
    if seams.get("compiler") != "cuda-like" or seams.get("driver") != "rocm-like":
        return False, "compiler=cuda-like, driver=rocm-like", got
    try:
        stack = compose(cfg)
    except ConfigError as exc:
        return False, "a stack that composes", f"{got}, which does not compose: {exc.message}"
    return True, "compiler=cuda-like over driver=rocm-like", f"{stack.describe()} via {_path_of(stack)}"


LAB = Lab(
    number=11, slug="11-framework-boundaries", title="Framework boundaries and vendor stacks", part="Part 11",
    goal="Place PyTorch, JAX and the MAX-style front end side by side on one workload, then align the "
         "cuda-like, rocm-like and xpu-like stacks seam by seam, and cross a family boundary.",
    minutes=30, experiments=experiments, facts=facts,
    exercises=[
        Exercise("11.1", "Which front end launches the most kernels for mlp on cuda-like "
                 "(torch, jax or max)?", text_fact("11.1", "most_kernels"),
                 "the framework seam: eager ATen dispatch launches one kernel per op"),
        Exercise("11.2", "Which binary format does the rocm-like compiler emit?",
                 text_fact("11.2", "rocm_format"), "the compiler seam ([compiler] in rocm_like/vendor.toml)"),
        Exercise("11.3", "How many library calls does the xpu-like stack make for mlp?",
                 number_fact("11.3", "xpu_library_calls"),
                 "the compiler's route_to_library list in xpu_like/vendor.toml"),
        Exercise("11.4", "Write stack.toml (in this folder): a stack with a cuda-like compiler over a "
                 "rocm-like driver that composes.", _check_stack,
                 "docs/portability.md: the paths between families", points=2),
    ],
    starter_files={"stack.toml": "# a stack config: [stack] vendor = ..., [stack.seams] compiler = ..., "
                                 "driver = ...\n"})
