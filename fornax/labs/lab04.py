"""Lab 4: tensors, dispatch and operators -- what happens to one ATen op on torch.device("fornax").

Experiments: views and strides on fornax tensors (a transpose or a slice is a view of the same
storage with new strides; ``.contiguous()`` of a non-contiguous view is a kernel and a device
copy, counted by the driver); the route every probe op takes on each family (native,
decomposed, fallback -- ``fornax.frameworks.torch.report()`` rows {op, route, count, reason})
beside the family's own [framework.torch] decompose/fallback tables; and an op that falls back
to the CPU today.

Exercise 4.5 imports the student's own ``lowering.py`` and runs it, deliberately, as a test
would: its rule is put into the lowering table (fornax/frameworks/torch/lowering/table.py)
only for the duration of the check, on a fresh session, and the table and the active session
are restored afterwards.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from .lab import Exercise, Lab, Section, Table, figure, number_fact, text_fact

FAMILIES = ("cuda-like", "rocm-like", "xpu-like")
SPEC = "tiny"
ROUTES = ("native", "decomposed", "fallback", "view", "runtime")
#: the views (and copies) of x = arange(24).reshape(4, 6) on the device
VIEWS = ("x", "x.t()", "x[1:3]", "x[:, ::2]", "x.t().contiguous()", "x[1:3].contiguous()", "x.clone()")
#: the ATen overload each probe reaches, and the call that reaches it (a, b: 4x6 float32 tensors)
PROBES: dict[str, Callable[[Any, Any], Any]] = {
    "aten::add.Tensor": lambda a, b: a + b,
    "aten::_softmax": lambda a, b: a.softmax(1),
    "aten::trace": lambda a, b: a[:, :4].trace(),
    "aten::copysign.Tensor": lambda a, b: a.copysign(b),
}
#: overloads the seam's own tables are asked about (not run)
TABLE_OPS = ("aten::_softmax", "aten::mean.dim", "aten::var.correction", "aten::cholesky")

STARTER_LOWERING = '''"""Lab 4, exercise 4.5: lower an ATen op that falls back to the CPU today.

`fornax lab check 4` imports this file (it runs your code, as a test would), puts `lower`
into the lowering table (fornax/frameworks/torch/lowering/table.py) under the name OP for the
duration of the check only, runs the op on fornax tensors on a fresh cuda-like stack, and
passes when report() no longer routes it to the CPU and its values match the CPU's.

- OP: the overload name as report() writes it, e.g. "aten::relu.default" (one the lab's
  routes table shows as fallback);
- lower(ctx, **arguments by schema name) returns the graph Value of the result.  The ctx API
  (fornax/frameworks/torch/lowering/context.py): ctx.op(name, *values) adds a graph op
  ("abs", "neg", "lt", "where", "mul", ...: see the real rules in
  fornax/frameworks/torch/lowering/*.py), ctx.scalar(value, dtype) a 0-d constant,
  ctx.cast(value, dtype) a cast; value.dtype is its graph dtype.
Do not register with the @lowering decorator: the check registers your rule itself.
"""

OP = ""


def lower(ctx, self, other):
    # FIX HERE: build the result from graph ops
    raise NotImplementedError("no lowering yet")
'''


# -- a fresh session that never outlives the experiment or check that made it -----------------------
@contextmanager
def _session(family: str) -> Iterator[Any]:
    """``torch.device("fornax")`` on a fresh ``family`` stack (tiny spec); the session that
    was active before (or none) is active again afterwards."""
    import fornax.frameworks.torch as ft
    from fornax.frameworks.torch import session as sess
    before = sess._current
    try:
        yield ft.use_stack(family, spec=SPEC)
    finally:
        if before is not None:
            sess._activate(before)
        else:
            sess._current = None


def _inputs() -> tuple[Any, Any]:
    """Two 4x6 float32 host tensors with mixed signs and no zeros (deterministic, no RNG)."""
    import torch
    a = (torch.arange(24, dtype=torch.float32) - 11.5).reshape(4, 6) * 0.25
    b = torch.cos(torch.arange(24, dtype=torch.float32) * 1.7 + 0.3).reshape(4, 6)
    return a, b


@lru_cache(maxsize=1)
def _views() -> tuple[tuple[str, str, str, int, bool, bool, int, int, int], ...]:
    """Per expression: shape, strides, storage offset, shares x's storage, contiguous, and
    what the driver counted for it (kernel launches, copies, device-to-device bytes)."""
    import torch
    rows: list[tuple[str, str, str, int, bool, bool, int, int, int]] = []
    with _session("cuda-like") as s:
        drv = s.stack.driver
        x = torch.arange(24, dtype=torch.float32).reshape(4, 6).to("fornax")
        make = {"x": lambda: x, "x.t()": lambda: x.t(), "x[1:3]": lambda: x[1:3],
                "x[:, ::2]": lambda: x[:, ::2], "x.t().contiguous()": lambda: x.t().contiguous(),
                "x[1:3].contiguous()": lambda: x[1:3].contiguous(), "x.clone()": lambda: x.clone()}
        for expr in VIEWS:
            before = (drv.counts["launches"], drv.counts["copies"], drv.counts["d2d_bytes"])
            y = make[expr]()
            after = (drv.counts["launches"], drv.counts["copies"], drv.counts["d2d_bytes"])
            kernels, copies, d2d = (int(b - a) for a, b in zip(before, after))
            rows.append((expr, str(tuple(y.shape)), str(tuple(y.stride())), int(y.storage_offset()),
                         bool(y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()),
                         bool(y.is_contiguous()), kernels, copies, d2d))
    return tuple(rows)


def _route_of(rows: list[dict[str, Any]], op: str) -> tuple[str, str]:
    """The route (and reason) report() gives ``op``: its own row, or the row of the overload
    that reached the device through it (``aten::copysign.out`` "through aten::copysign.Tensor")."""
    own = [r for r in rows if r["op"] == op]
    fell = [r for r in own if r["route"] == "fallback"]
    if fell:
        return "fallback", fell[0]["reason"]
    if own:
        return own[0]["route"], own[0]["reason"]
    through = [r for r in rows if r["reason"] == f"through {op}" and r["route"] != "view"]
    if through:
        return through[0]["route"], f"as {through[0]['op']}"
    return "not reached", ""


@lru_cache(maxsize=1)
def _routes() -> tuple[tuple[str, dict[str, tuple[str, str]], dict[str, int], dict[str, str]], ...]:
    """Per family: each probe's (route, reason), report()'s totals per route, and the family
    framework seam's own rule for each of TABLE_OPS."""
    import fornax.frameworks.torch as ft
    out = []
    for fam in FAMILIES:
        with _session(fam) as s:
            a, b = (t.to("fornax") for t in _inputs())
            for probe in PROBES.values():
                probe(a, b).cpu()             # .cpu() waits for the device
            rep = ft.report()
            routes = {op: _route_of(rep["ops"], op) for op in PROBES}
            totals = {r: int(rep["totals"].get(r, 0)) for r in ROUTES}
            rules = {}
            for op in TABLE_OPS:
                rule = s.framework.torch_route(op)
                rules[op] = "no rule" if rule is None else f"{rule.kind}"
        out.append((fam, routes, totals, rules))
    return tuple(out)


def experiments(out: Path) -> list[Section]:
    views, routes = _views(), _routes()
    _picture(routes, out / "routes.png")
    fallback_rows = [[fam, op, reason] for fam, r, _, _ in routes for op, (route, reason) in r.items()
                     if route in ("fallback", "decomposed")]
    return [
        Section("Views, strides and the copies they avoid",
                "x = torch.arange(24.).reshape(4, 6) moved to torch.device('fornax') on a fresh cuda-like "
                "stack (tiny spec). A transpose, a slice or a stepped slice is a view: the same device "
                "storage read with new strides and an offset (aten::as_strided, route `view`: no kernel, "
                "no copy). `.contiguous()` of a view that is already contiguous returns it; of one that "
                "is not, a kernel gathers the elements into fresh storage (the driver's counts for it "
                "are in the table). `.clone()` of a contiguous tensor is one device-to-device copy. The last three columns are what the "
                "driver counted for each expression (its report's launches, copies and d2d_bytes).",
                [Table("views of x on the device", ["expression", "shape", "strides", "offset",
                                                    "same storage as x", "contiguous", "kernels",
                                                    "copies", "d2d bytes"],
                       [[e, sh, st, str(o), "yes" if same else "no", "yes" if c else "no", str(k), str(cp),
                         str(d)] for e, sh, st, o, same, c, k, cp, d in views])]),
        Section("Dispatch routes, per family",
                "The same four calls on fresh tensors of each family (a + b, a.softmax(1), a[:, :4].trace(), "
                "a.copysign(b)), and the route `fornax.frameworks.torch.report()` gives the ATen overload "
                "each reaches: `native` (a fornax lowering, compiled and run on the device), `decomposed` "
                "(PyTorch's decomposition into ops that are lowered -- because the family's "
                "[framework.torch] decompose list says so, or because fornax has no lowering), "
                "`fallback` (run on the CPU: the family's [framework.torch.fallback] table, or no "
                "lowering at all). The second table is what each family's framework seam answers "
                "(torch_route) for a few overloads from those tables, without running anything.",
                [Table("route of each probe op (report())", ["op", *FAMILIES],
                       [[op, *(r[op][0] for _, r, _, _ in routes)] for op in PROBES]),
                 Table("why it is not native", ["family", "op", "reason"], fallback_rows),
                 Table("the framework seam's rule (vendor.toml [framework.torch])", ["op", *FAMILIES],
                       [[op, *(rules[op] for _, _, _, rules in routes)] for op in TABLE_OPS]),
                 Table("report() totals per route", ["family", *ROUTES],
                       [[fam, *(str(t[r]) for r in ROUTES)] for fam, _, t, _ in routes])],
                ["routes.png"]),
        Section("An op that falls back today",
                "An op with no entry in the lowering table (fornax/frameworks/torch/lowering/table.py: "
                "the `lowering` decorator registers a rule under its overload name, `lookup` finds it) "
                "and no decomposition PyTorch applies for it runs on the CPU: its inputs are copied to "
                "the host and its result back, and report() lists it under `fallbacks` with the "
                "reason. Exercise 4.5 writes that rule. The check imports your lowering.py "
                "deliberately (your code runs, as a test would), registers your rule for that op "
                "only while it runs the op on a fresh stack, and then restores the table.", []),
    ]


def _picture(routes: Any, path: Path) -> None:
    fig = figure(6, 3.2)
    ax = fig.subplots()
    fams = [fam for fam, _, _, _ in routes]
    bottom = [0] * len(fams)
    for i, route in enumerate(ROUTES):
        vals = [t[route] for _, _, t, _ in routes]
        ax.bar(fams, vals, bottom=bottom, label=route, color=f"C{i}")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("ATen calls (report() totals)")
    ax.set_title("the four probe calls: routes per family")
    ax.legend(fontsize=7)
    fig.savefig(path, format="png", dpi=90)


def facts() -> dict[str, Any]:
    views, routes = _views(), _routes()
    cuda = next(r for fam, r, _, _ in routes if fam == "cuda-like")
    xpu = next(r for fam, r, _, _ in routes if fam == "xpu-like")
    fallbacks = [op for op, (route, _) in cuda.items() if route == "fallback"]
    contiguous = [e for e, _, _, _, same, c, _, _, _ in views if c and same and e != "x" and "contiguous" not in e]
    return {"contiguous_view": ", ".join(contiguous),
            "transpose_kernels": next(k for e, *_rest, k, _, _ in views if e == "x.t().contiguous()"),
            "xpu_softmax_route": xpu["aten::_softmax"][0],
            "cuda_fallback": ", ".join(fallbacks),
            "fallback_ops": fallbacks}


# -- exercise 4.5: the student's lowering --------------------------------------------------------------
def _load(path: Path) -> tuple[str, Any]:
    """OP and lower from the student's ``lowering.py`` (their code, imported as a test would)."""
    spec = importlib.util.spec_from_file_location(f"fornax_lab04_lowering_{abs(hash(str(path)))}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    op, fn = getattr(mod, "OP", None), getattr(mod, "lower", None)
    if not isinstance(op, str):
        raise TypeError("lowering.py defines no OP = \"aten::...\" (a string)")
    if not callable(fn):
        raise TypeError("lowering.py defines no function lower(ctx, ...)")
    return op, fn


def _short(exc: BaseException) -> str:
    msg = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}: {msg}"


def _check_lowering(answers: dict[str, Any], folder: Path, facts: dict[str, Any]) -> tuple[bool, str, str]:
    """lowering.py's rule takes an op that falls back today to the device, with the CPU's values."""
    import torch

    from fornax.frameworks.torch.lowering.table import TABLE
    ops = facts["fallback_ops"]
    want = (f"lowering.py with OP one of the ops that fall back on cuda-like ({', '.join(ops) or 'none'}) "
            "and a rule after which report() routes it to the device and its values equal the CPU's")
    path = folder / "lowering.py"
    if not path.is_file():
        return False, want, "no lowering.py"
    saved = dict(TABLE)                         # the student's import may register into the table too
    try:
        try:
            op, fn = _load(path)
        except Exception as exc:     # noqa: BLE001 - the student's module may raise anything
            return False, want, f"lowering.py does not import: {_short(exc)}"
        if op not in ops:
            return False, want, f"OP = {op!r}, which is not an op the probe sees falling back"
        TABLE[op] = fn
        a, b = _inputs()
        expected = PROBES[op](a, b)
        with _session("cuda-like"):
            import fornax.frameworks.torch as ft
            try:
                got = PROBES[op](a.to("fornax"), b.to("fornax")).cpu()
            except Exception as exc:  # noqa: BLE001 - the student's rule may raise anything
                return False, want, f"running {op} on fornax tensors raised {_short(exc)}"
            route, reason = _route_of(ft.report()["ops"], op)
    finally:
        TABLE.clear()
        TABLE.update(saved)
    if route != "native":
        return False, want, f"{op} still takes route {route}" + (f" ({reason})" if reason else "")
    if got.shape != expected.shape or not torch.allclose(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True):
        bad = (got - expected).abs().argmax().item() if got.shape == expected.shape else 0
        flat_g, flat_e = got.reshape(-1), expected.reshape(-1)
        return False, want, (f"{op} runs on the device now, but its values differ from the CPU's: "
                             f"element {bad} is {flat_g[bad].item():g}, the CPU gives {flat_e[bad].item():g}"
                             if got.shape == expected.shape else
                             f"{op} runs on the device now, but gives shape {tuple(got.shape)}, "
                             f"the CPU {tuple(expected.shape)}")
    return True, want, f"{op} runs on the device (route native) with the CPU's values"


LAB = Lab(
    number=4, slug="04-tensors-and-dispatch", title="Tensors, dispatch and operators", part="Part 4",
    goal="See which tensor operations are views of device storage and which copy, follow ATen ops "
         "through the framework seam's routes (native, decomposed, fallback) on each family, and "
         "write the lowering rule that takes an op off the CPU fallback.",
    minutes=30, experiments=experiments, facts=facts,
    exercises=[
        Exercise("4.1", "Which of the views x.t(), x[1:3] and x[:, ::2] is contiguous (write the expression "
                 "as the table does)?", text_fact("4.1", "contiguous_view"),
                 "strides and storage offsets: the views table, and aten::as_strided (route view) in report()"),
        Exercise("4.2", "How many kernels does the driver count for x.t().contiguous() on cuda-like?",
                 number_fact("4.2", "transpose_kernels"),
                 "the driver report's launches: a non-contiguous view is gathered by a kernel "
                 "(fornax/frameworks/torch/strided.py)"),
        Exercise("4.3", "Which route does aten::_softmax take on xpu-like (native, decomposed or fallback)?",
                 text_fact("4.3", "xpu_softmax_route"),
                 "the framework seam's torch_route and [framework.torch] decompose in xpu_like/vendor.toml"),
        Exercise("4.4", "Which probe op falls back to the CPU on cuda-like (its overload name as report() "
                 "writes it)?", text_fact("4.4", "cuda_fallback"),
                 "fornax.frameworks.torch.report()['fallbacks'] and the lowering table "
                 "(fornax/frameworks/torch/lowering/table.py)"),
        Exercise("4.5", "Write lowering.py (in this folder, written by `fornax lab new`): OP, the op that "
                 "falls back on cuda-like, and lower(ctx, ...), its lowering rule. The check imports your "
                 "lowering.py and runs it, deliberately, as a test would: the op must take the native "
                 "route and give the CPU's values.", _check_lowering,
                 "the lowering table and the ctx API (fornax/frameworks/torch/lowering/table.py, "
                 "context.py, and the real rules in unary.py and arithmetic.py)", points=2),
    ],
    starter_files={"lowering.py": STARTER_LOWERING})
