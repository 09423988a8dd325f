"""The compiler seam's contract, clause by clause.

Every op in the op set (:data:`fornax.layers.graph.OPS`, read when the
clause runs, so ops added later are covered) is built into a small graph
with seeded random shapes and inputs, compiled by the subject's compiler
for its own family's driver, loaded, run on the simulated device, and
compared with the graph's float64 numpy reference.

Tolerances, per the lowest-precision float dtype in the case: an element
passes when ``|out - ref| <= rtol * |ref| + rtol * max|ref|`` (the second
term is an absolute floor scaled to the output, so a sum that cancels to
near zero is not held to a relative bound), with

    float64 1e-12,  float32 1e-5,  float16 1e-2,  bfloat16 5e-2

(one or two roundings of a float16 / bfloat16 result are 1e-3 / 8e-3; the
looser bounds leave room for composites that round intermediates); integer
and bool outputs must match exactly.  Inputs are distinct multiples of a
power of two within [-2, 2] (or (0, 2] where an op needs positive
operands), exactly representable in every float dtype, so no case depends
on a tie or on input rounding.

An op the compiler says up front it cannot lower (its ``unsupported()``
names the op with a reason: the framework then runs it on the CPU) is
accepted; an op it neither lowers nor declares is a failure.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
from typing import Callable

import numpy as np

from ..layers import compiler as compiler_layer
from ..layers.compiler import Target
from ..layers.errors import CompileError, FornaxError, GraphError
from ..layers.framework import execute_plan
from ..layers.graph import OPS, DType, Graph
from .base import ContractFailure, Subject, clause, require

SEAM = "compiler"
SEED = 20251
TOLERANCE = {DType.FLOAT64: 1e-12, DType.FLOAT32: 1e-5, DType.FLOAT16: 1e-2, DType.BFLOAT16: 5e-2}


class NotApplicable(Exception):
    """The op takes no operand of this dtype (e.g. a bitwise op and float16)."""


# ---- inputs -------------------------------------------------------------------------------------
def values(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType, positive: bool = False,
           like: np.ndarray | None = None) -> np.ndarray:
    """Distinct values, exact in every float dtype (see the module doc)."""
    n = math.prod(shape)
    if dtype is DType.BOOL:
        return rng.random(shape) < 0.5
    if not dtype.is_float:
        lo = 1 if positive else -8
        return rng.integers(lo, 9, size=shape).astype(dtype.numpy)
    step = 2.0 ** -max(0, math.ceil(math.log2(max(n, 2) / 2)))
    grid = rng.permutation(n) + 1 if positive else rng.permutation(n) - n // 2
    out = (grid * step).reshape(shape)
    if positive:
        out = out * (2.0 / max(1.0, float(out.max())))
        out = np.maximum(out, step)
    if like is not None and like.shape == out.shape:
        out = np.where(rng.random(shape) < 0.3, like, out)      # some equal pairs for comparisons
    return out.astype(dtype.numpy)


def _shape(rng, rank: int | None = None, lo: int = 1, hi: int = 9) -> tuple[int, ...]:
    rank = rank if rank is not None else int(rng.integers(1, 4))
    return tuple(int(d) for d in rng.integers(lo, hi, size=rank))


Case = tuple[Graph, dict[str, np.ndarray]]
Builder = Callable[[np.random.Generator, DType, bool], Case]


def _graph(op: str, shapes_dtypes, rng, positive, attrs=None, out_name="out") -> Case:
    g = Graph(f"conform_{op}")
    feeds, args = {}, []
    prev = None
    for i, (shape, dt) in enumerate(shapes_dtypes):
        name = f"x{i}"
        args.append(g.input(name, shape, dt))
        feeds[name] = values(rng, shape, dt, positive, like=prev if dt.is_float else None)
        prev = feeds[name] if dt.is_float else prev
    g.output(g.op(op, *args, **(attrs or {})), names=[out_name])
    return g, feeds


def _index(rng, shape, bound: int, dt=DType.INT32) -> np.ndarray:
    return rng.integers(0, bound, size=shape).astype(dt.numpy)


# ---- ops with special operands --------------------------------------------------------------------
def _case_gather(rng, dt, positive):
    shape = _shape(rng, 2, 2)
    axis = int(rng.integers(0, 2))
    ishape = tuple(int(rng.integers(1, s + 1)) for s in shape)
    g = Graph("conform_gather")
    x, i = g.input("x", shape, dt), g.input("idx", ishape, DType.INT32)
    g.output(g.op("gather", x, i, axis=axis), names=["out"])
    return g, {"x": values(rng, shape, dt, positive), "idx": _index(rng, ishape, shape[axis])}


def _case_index_select(rng, dt, positive):
    shape = _shape(rng, 2, 2)
    axis = int(rng.integers(0, 2))
    n = int(rng.integers(1, 7))
    g = Graph("conform_index_select")
    x, i = g.input("x", shape, dt), g.input("idx", (n,), DType.INT64)
    g.output(g.op("index_select", x, i, axis=axis), names=["out"])
    return g, {"x": values(rng, shape, dt, positive), "idx": _index(rng, (n,), shape[axis], DType.INT64)}


def _case_scatter(rng, dt, positive):
    shape = _shape(rng, 2, 2)
    axis = int(rng.integers(0, 2))
    mode = "add" if rng.random() < 0.5 else "set"
    ishape = tuple(int(rng.integers(1, s + 1)) for s in shape)
    if mode == "set":                         # one update per target: a permutation along axis
        ishape = tuple(shape[axis] if d == axis else s for d, s in enumerate(ishape))
        idx = np.argsort(rng.random(ishape), axis=axis).astype(np.int32)
    else:
        idx = _index(rng, ishape, shape[axis])
    g = Graph("conform_scatter")
    x, i, u = g.input("x", shape, dt), g.input("idx", ishape, DType.INT32), g.input("upd", ishape, dt)
    g.output(g.op("scatter", x, i, u, axis=axis, mode=mode), names=["out"])
    return g, {"x": values(rng, shape, dt, positive), "idx": idx, "upd": values(rng, ishape, dt, positive)}


def _random(op):
    def build(rng, dt, positive):
        if dt is not DType.FLOAT32:
            raise NotApplicable(f"{op} produces float32/float64 or int64 only")
        shape = _shape(rng, 2)
        attrs = {"shape": shape, "offset": int(rng.integers(0, 1000))}
        g = Graph(f"conform_{op}")
        key = g.input("key", (2,), DType.INT64)
        g.output(g.op(op, key, **attrs), names=["out"])
        return g, {"key": rng.integers(0, 2 ** 32, size=2).astype(np.int64)}
    return build


def _case_iota(rng, dt, positive):
    shape = _shape(rng, 2)
    g = Graph("conform_iota")
    # a zero-operand op: add a fed operand so the graph has an input
    x = g.input("x", shape, dt)
    g.output(g.op("add", g.op("iota", shape=shape, axis=int(rng.integers(0, 2)), dtype=dt.value), x),
             names=["out"])
    return g, {"x": values(rng, shape, dt, positive)}


def _case_concat(rng, dt, positive):
    base = list(_shape(rng, 2))
    axis = int(rng.integers(0, 2))
    shapes = []
    for _ in range(int(rng.integers(2, 4))):
        s = list(base)
        s[axis] = int(rng.integers(1, 6))
        shapes.append((tuple(s), dt))
    return _graph("concat", shapes, rng, positive, {"axis": axis})


def _case_matmul(rng, dt, positive):
    m, k, n = (int(v) for v in rng.integers(1, 24, size=3))
    if rng.random() < 0.5:
        b = int(rng.integers(1, 4))
        return _graph("matmul", [((b, m, k), dt), ((b, k, n), dt)], rng, positive)
    return _graph("matmul", [((m, k), dt), ((k, n), dt)], rng, positive)


def _case_dot_general(rng, dt, positive):
    b, m, k, n = (int(v) for v in rng.integers(1, 9, size=4))
    # lhs (k, b, m), rhs (b, n, k): batch dims 1/0, contracting dims 0/2
    return _graph("dot_general", [((k, b, m), dt), ((b, n, k), dt)], rng, positive,
                  {"lhs_contracting": (0,), "rhs_contracting": (2,), "lhs_batch": (1,), "rhs_batch": (0,)})


def _case_conv(rng, dt, positive):
    nd = int(rng.integers(1, 3))
    groups = int(rng.integers(1, 3))
    c, o = groups * int(rng.integers(1, 3)), groups * int(rng.integers(1, 3))
    k = tuple(int(v) for v in rng.integers(1, 4, size=nd))
    x = (2, c) + tuple(int(v) for v in rng.integers(5, 9, size=nd))
    attrs = {"stride": int(rng.integers(1, 3)), "padding": int(rng.integers(0, 2)),
             "dilation": int(rng.integers(1, 3)), "groups": groups}
    return _graph("convolution", [(x, dt), ((o, c // groups) + k, dt)], rng, positive, attrs)


def _case_conv_transpose(rng, dt, positive):
    nd = int(rng.integers(1, 3))
    groups = int(rng.integers(1, 3))
    c, o = groups * int(rng.integers(1, 3)), int(rng.integers(1, 3))
    k = tuple(int(v) for v in rng.integers(1, 4, size=nd))
    x = (2, c) + tuple(int(v) for v in rng.integers(3, 6, size=nd))
    stride = int(rng.integers(1, 3))
    attrs = {"stride": stride, "padding": 0, "dilation": 1, "groups": groups,
             "output_padding": int(rng.integers(0, stride))}
    return _graph("conv_transpose", [(x, dt), ((c, o) + k, dt)], rng, positive, attrs)


def _case_im2col(rng, dt, positive):
    x = (2, int(rng.integers(1, 4))) + tuple(int(v) for v in rng.integers(4, 8, size=2))
    return _graph("im2col", [(x, dt)], rng, positive,
                  {"kernel": tuple(int(v) for v in rng.integers(1, 4, size=2)),
                   "stride": int(rng.integers(1, 3)), "padding": int(rng.integers(0, 2))})


def _case_attention(rng, dt, positive):
    b, sq, sk, d = (int(v) for v in rng.integers(1, 9, size=4))
    causal = bool(rng.random() < 0.5)
    if causal:
        sk = sq
    return _graph("attention", [((b, sq, d), dt), ((b, sk, d), dt), ((b, sk, d), dt)], rng, positive,
                  {"causal": causal})


def _case_norm(op):
    def build(rng, dt, positive):
        shape = _shape(rng, 2, 2)
        shapes = [(shape, dt), ((shape[-1],), dt)] + ([((shape[-1],), dt)] if op == "layer_norm" else [])
        return _graph(op, shapes, rng, positive)
    return build


def _case_slice(rng, dt, positive):
    shape = _shape(rng, 2, 2)
    start = tuple(int(rng.integers(0, s)) for s in shape)
    stop = tuple(int(rng.integers(a + 1, s + 1)) for a, s in zip(start, shape))
    step = tuple(int(rng.integers(1, 3)) for _ in shape)
    return _graph("slice", [(shape, dt)], rng, positive, {"start": start, "stop": stop, "step": step})


def _case_pad(rng, dt, positive):
    shape = _shape(rng, 2)
    pads = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in shape)
    return _graph("pad", [(shape, dt)], rng, positive, {"pads": pads, "value": 0.5})


def _case_reshape(rng, dt, positive):
    shape = _shape(rng, 3)
    return _graph("reshape", [(shape, dt)], rng, positive, {"shape": (shape[0] * shape[1], -1)})


def _case_broadcast_to(rng, dt, positive):
    shape = _shape(rng, 2)
    src = (1, shape[1])
    return _graph("broadcast_to", [(src, dt)], rng, positive, {"shape": (int(rng.integers(1, 4)),) + shape})


def _case_transpose(rng, dt, positive):
    shape = _shape(rng, 3)
    return _graph("transpose", [(shape, dt)], rng, positive,
                  {"perm": tuple(int(p) for p in rng.permutation(3))})


def _case_cast(rng, dt, positive):
    target = DType.FLOAT32 if dt is not DType.FLOAT32 else DType.FLOAT16
    return _graph("cast", [(_shape(rng), dt)], rng, positive, {"dtype": target.value})


def _case_where(rng, dt, positive):
    shape = _shape(rng)
    return _graph("where", [(shape, DType.BOOL), (shape, dt), (shape, dt)], rng, positive)


def _case_all_reduce(rng, dt, positive):
    return _graph("all_reduce", [(_shape(rng), dt)], rng, positive, {"ranks": 1})


def _case_var(rng, dt, positive):
    shape = _shape(rng, 2, 2)
    return _graph("var", [(shape, dt)], rng, positive,
                  {"axis": int(rng.integers(-2, 2)), "keepdims": bool(rng.random() < 0.5),
                   "correction": int(rng.integers(0, 2))})


SPECIAL: dict[str, Builder] = {
    "gather": _case_gather, "index_select": _case_index_select, "scatter": _case_scatter,
    "random_bits": _random("random_bits"), "random_uniform": _random("random_uniform"),
    "random_normal": _random("random_normal"), "iota": _case_iota, "concat": _case_concat,
    "matmul": _case_matmul, "dot_general": _case_dot_general, "convolution": _case_conv,
    "conv_transpose": _case_conv_transpose, "im2col": _case_im2col, "attention": _case_attention,
    "layer_norm": _case_norm("layer_norm"), "rms_norm": _case_norm("rms_norm"), "slice": _case_slice,
    "pad": _case_pad, "reshape": _case_reshape, "broadcast_to": _case_broadcast_to,
    "transpose": _case_transpose, "cast": _case_cast, "where": _case_where,
    "all_reduce": _case_all_reduce, "var": _case_var,
}


def _generic(op: str) -> Builder:
    """Elementwise and reduction ops: operands of one shape, attrs from their names."""
    opdef = OPS[op]

    def build(rng, dt, positive):
        shape = _shape(rng)
        attrs = {}
        if "axis" in opdef.attrs:
            attrs["axis"] = int(rng.integers(-len(shape), len(shape)))
        if "keepdims" in opdef.attrs:
            attrs["keepdims"] = bool(rng.random() < 0.5)
        # float ops take the case's dtype; ops that take no float (bitwise, logical) take an
        # integer or bool operand in the float32 case and are not applicable to the others
        tried = [dt] if dt is not DType.FLOAT32 else [dt, DType.INT32, DType.BOOL]
        last = None
        for operand in tried:
            try:
                return _graph(op, [(shape, operand)] * opdef.arity, rng, positive, attrs)
            except GraphError as exc:
                last = exc
        raise NotApplicable(f"takes no {dt} operand ({last.message if last else ''})")
    return build


def build_case(op: str, dt: DType, rng: np.random.Generator) -> Case:
    """A small graph around ``op`` and its feeds; signed inputs, or positive ones where the
    reference is not finite on signed inputs."""
    builder = SPECIAL.get(op) or _generic(op)
    state = rng.bit_generator.state
    g, feeds = builder(rng, dt, False)
    ref = g.reference(feeds)
    if any(np.issubdtype(np.asarray(r).dtype, np.floating) and not np.all(np.isfinite(r)) for r in ref):
        rng.bit_generator.state = state
        g, feeds = builder(rng, dt, True)
    return g, feeds


# ---- running ------------------------------------------------------------------------------------
def _target(s: Subject, compiler, fmt: str | None = None) -> Target:
    formats = list(compiler.output_formats())
    drv = s.driver()
    props = drv.properties(0)
    loadable = list(drv.loadable_formats(0))
    fmt = fmt or next((f for f in formats if f in loadable), None)
    if fmt is None:
        raise ContractFailure(f"the compiler emits {', '.join(formats)}; the family's driver loads "
                              f"{', '.join(loadable)}: no format meets")
    return Target(props.target, fmt, props.compute_units)


def _feed_list(plan, graph: Graph, feeds: dict) -> list:
    names = [plan.buffers[b].name for b in plan.inputs]
    if all(n in feeds for n in names):
        return [feeds[n] for n in names]
    return [feeds[v.name] for v in graph.inputs]


def run(s: Subject, compiler, graph: Graph, feeds: dict, target: Target, runtime=None, **kw) -> list:
    plan = compiler.compile(graph, target, frozenset(), **kw)
    return execute_plan(plan, _feed_list(plan, graph, feeds), runtime or s.runtime(), None)


def tolerance(graph: Graph) -> float:
    dts = [v.dtype for v in (*graph.inputs, *graph.constants, *graph.outputs) if v.dtype.is_float]
    return max((TOLERANCE[d] for d in dts), default=0.0)


def compare(out, ref, rtol: float) -> str | None:
    """None when ``out`` matches the float64 ``ref``; otherwise what differs."""
    out = np.asarray(out)
    ref = np.asarray(ref)
    if out.shape != ref.shape:
        return f"shape {out.shape}, reference {ref.shape}"
    if out.dtype.kind in "iub":
        want = ref.astype(out.dtype)
        bad = int(np.count_nonzero(out != want))
        return None if bad == 0 else f"{bad} of {out.size} elements differ (exact dtype {out.dtype})"
    o = out.astype(np.float64)
    same_special = (np.isnan(o) & np.isnan(ref)) | (np.isinf(o) & (o == ref))
    finite = np.isfinite(ref)
    scale = float(np.abs(ref[finite]).max()) if finite.any() else 0.0
    err = np.abs(o - ref)
    ok = same_special | (err <= rtol * np.abs(ref) + rtol * scale)
    if ok.all():
        return None
    i = np.unravel_index(int(np.argmax(np.where(ok, 0, np.nan_to_num(err, nan=np.inf)))), o.shape)
    return (f"{int((~ok).sum())} of {o.size} elements outside rtol {rtol:g}; worst at {tuple(map(int, i))}: "
            f"{o[i]!r} vs reference {ref[i]!r}")


def _declared_unsupported(compiler, graph: Graph) -> dict:
    fn = getattr(compiler, "unsupported", None)
    if fn is None:
        return {}
    try:
        return dict(fn(graph, frozenset()))
    except FornaxError:
        return {}


def check_ops(s: Subject, dt: DType, ops=None, cases: int = 2) -> None:
    compiler = s.vendor.compiler()
    target = _target(s, compiler)
    failures, ran = [], 0
    for op in sorted(ops if ops is not None else OPS):
        for case in range(cases):
            rng = np.random.default_rng([SEED, case, sum(map(ord, op)), len(op), list(DType).index(dt)])
            try:
                graph, feeds = build_case(op, dt, rng)
            except NotApplicable:
                break
            except GraphError as exc:
                failures.append(f"{op}: the suite could not build a case ({exc.message})")
                break
            if op in _declared_unsupported(compiler, graph):
                break
            where = ", ".join(f"{v.name}:{v.type}" for v in graph.inputs)
            refs = graph.reference(feeds)      # before compiling: a compiler must not change it
            try:         # fresh devices per case: one case's sticky fault must not fail the next
                outs = run(s, compiler, graph, feeds, target, Subject(s.vendor).runtime())
            except FornaxError as exc:
                failures.append(f"{op}({where}): {type(exc).__name__}: {exc}")
                break
            ran += 1
            for name, out, ref in zip((v.name for v in graph.outputs), outs, refs):
                why = compare(out, ref, tolerance(graph))
                if why:
                    failures.append(f"{op}({where}) output {name}: {why}")
    if failures:
        raise ContractFailure(f"{len(failures)} op case(s) failed on {target.format} for {target.arch}: "
                              + "; ".join(failures[:6]) + (" ..." if len(failures) > 6 else ""))
    require(ran > 0 or dt is not DType.FLOAT32, "no op of the op set could be compiled and run")


@clause(SEAM, "C01", "every op, float32: compiled, loaded and run, matches the float64 reference")
def ops_float32(s: Subject) -> None:
    check_ops(s, DType.FLOAT32)


@clause(SEAM, "C02", "every op, float16: matches the float64 reference within float16 tolerance")
def ops_float16(s: Subject) -> None:
    check_ops(s, DType.FLOAT16, cases=1)


@clause(SEAM, "C03", "every op, bfloat16: matches the float64 reference within bfloat16 tolerance")
def ops_bfloat16(s: Subject) -> None:
    check_ops(s, DType.BFLOAT16, cases=1)


def fusable_graph(seed: int = 3) -> Case:
    """An elementwise chain feeding a row reduction and a normalisation: fusable on every family."""
    rng = np.random.default_rng(seed)
    g = Graph("conform_fusion")
    x = g.input("x", (12, 40), DType.FLOAT32)
    b = g.input("b", (40,), DType.FLOAT32)
    h = g.op("tanh", g.op("mul", g.op("add", x, b), x))
    z = g.op("sub", h, g.op("reduce_max", h, axis=-1, keepdims=True))
    e = g.op("exp", z)
    g.output(g.op("div", e, g.op("reduce_sum", e, axis=-1, keepdims=True)), names=["out"])
    return g, {"x": values(rng, (12, 40), DType.FLOAT32), "b": values(rng, (40,), DType.FLOAT32)}


def _fuse_option():
    opts = getattr(compiler_layer, "CompileOptions", None)
    return opts if opts is not None and "fuse" in inspect.signature(opts).parameters else None


def _accepts_options(compiler) -> bool:
    try:
        return "options" in inspect.signature(compiler.compile).parameters
    except (TypeError, ValueError):
        return False


@clause(SEAM, "C04", "fusion preserves results (fused, unfused and op by op agree with the reference)")
def fusion_preserves_results(s: Subject) -> None:
    compiler = s.vendor.compiler()
    target = _target(s, compiler)
    g, feeds = fusable_graph()
    (ref,) = g.reference(feeds)
    (fused,) = run(s, compiler, g, feeds, target)
    g, _ = fusable_graph()                                     # a fresh copy for each compile
    why = compare(fused, ref, TOLERANCE[DType.FLOAT32])
    require(why is None, f"the fused graph differs from the reference: {why}")
    opts = _fuse_option()
    if opts is not None and _accepts_options(compiler):
        (unfused,) = run(s, compiler, g, feeds, target, options=opts(fuse=False))
        why = compare(unfused, ref, TOLERANCE[DType.FLOAT32])
        require(why is None, f"with fuse=False the graph differs from the reference: {why}")
        why = compare(fused, unfused.astype(np.float64), 2 * TOLERANCE[DType.FLOAT32])
        require(why is None, f"fused and unfused results differ: {why}")
    # op by op: every node its own graph, run in turn; the fused result must agree with it
    env = {id(v): feeds[v.name] for v in g.inputs}
    for i, node in enumerate(g.nodes):
        one = Graph(f"conform_fusion_op{i}")
        ins = [one.input(f"a{j}", v.shape, v.dtype) for j, v in enumerate(node.inputs)]
        one.output(one.op(node.op, *ins, **node.attrs), names=["out"])
        (env[id(node.outputs[0])],) = run(s, compiler, one, {f"a{j}": env[id(v)]
                                                             for j, v in enumerate(node.inputs)}, target)
    why = compare(fused, env[id(g.outputs[0])].astype(np.float64), 4 * TOLERANCE[DType.FLOAT32])
    require(why is None, f"the fused graph differs from the same ops run one kernel each: {why}")


@contextlib.contextmanager
def _no_disk_cache():
    old = os.environ.get("FORNAX_CACHE_DIR")
    os.environ["FORNAX_CACHE_DIR"] = "off"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("FORNAX_CACHE_DIR", None)
        else:
            os.environ["FORNAX_CACHE_DIR"] = old


@clause(SEAM, "C05", "a cache hit returns an identical binary; a fresh compiler emits the same bytes")
def cache_identical(s: Subject) -> None:
    compiler = s.vendor.compiler()
    target = _target(s, compiler)
    first = compiler.compile(fusable_graph()[0], target)
    again = compiler.compile(fusable_graph()[0], target)         # an equal graph, built anew
    require(first.binary is not None and again.binary is not None, "the plan has no binary")
    require(again.binary.data == first.binary.data,
            f"compiling the same graph twice gave different bytes ({len(first.binary.data)} vs "
            f"{len(again.binary.data)})")
    require(again.binary.format == first.binary.format and again.binary.target == first.binary.target,
            "compiling the same graph twice gave a different format or target")
    with _no_disk_cache():        # a fresh compiler must really compile, not read a cache file
        fresh = s.vendor.compiler().compile(fusable_graph()[0], target)
    require(fresh.binary.data == first.binary.data,
            "a fresh compiler instance emitted different bytes for the same graph and target "
            "(compilation is not deterministic)")


@clause(SEAM, "C06", "every format it emits for the driver is one the driver loads, and runs")
def formats_load(s: Subject) -> None:
    compiler = s.vendor.compiler()
    emits = list(compiler.output_formats())
    drv = s.driver()
    loadable = set(drv.loadable_formats(0))
    formats = [f for f in emits if f in loadable]
    require(formats, f"the compiler emits {', '.join(compiler.output_formats())}; the driver loads "
                     f"{', '.join(sorted(loadable))}")
    g, feeds = fusable_graph(5)
    (ref,) = g.reference(feeds)
    for fmt in formats:
        target = _target(s, compiler, fmt)
        plan = compiler.compile(g, target)
        b = plan.binary
        require(b is not None and b.format == fmt,
                f"asked for {fmt}, the plan's binary is {b.format if b is not None else 'missing'}")
        require(b.format in loadable, f"the plan's binary is {b.format}; the driver loads "
                                      f"{', '.join(sorted(loadable))}")
        ctx = drv.create_context(0)
        module = drv.load_module(ctx, b)
        require(module is not None, f"the driver returned no module for the {fmt} binary")
        (out,) = execute_plan(plan, _feed_list(plan, g, feeds), s.runtime(), None)
        why = compare(out, ref, TOLERANCE[DType.FLOAT32])
        require(why is None, f"the {fmt} binary computes a wrong result: {why}")


def _bad_graphs() -> list[tuple[str, Graph]]:
    out = []
    g = Graph("conform_no_outputs")
    g.op("relu", g.input("x", (4,), DType.FLOAT32))
    out.append(("a graph without outputs", g))
    g = Graph("conform_wrong_type")
    y = g.op("relu", g.input("x", (4,), DType.FLOAT32))
    g.output(y)
    g.nodes[0].outputs[0].type = type(y.type)((5,), DType.FLOAT32)
    out.append(("a node declaring a type its inference does not give", g))
    g = Graph("conform_undefined")
    other = Graph("other").input("z", (4,), DType.FLOAT32)
    x = g.input("x", (4,), DType.FLOAT32)
    y = g.op("add", x, x)
    g.nodes[0].inputs = (x, other)
    g.output(y)
    out.append(("a node using a value defined in no graph", g))
    g = Graph("conform_unknown_op")
    y = g.op("exp", g.input("x", (4,), DType.FLOAT32))
    g.output(y)
    g.nodes[0].op = "no_such_op"
    out.append(("a node with an unknown op", g))
    g = Graph("conform_bad_matmul")
    y = g.op("matmul", g.input("a", (3, 4), DType.FLOAT32), g.input("b", (4, 5), DType.FLOAT32))
    g.output(y)
    g.nodes[0].inputs = (g.inputs[0], g.input("c", (6, 5), DType.FLOAT32))
    out.append(("a matmul whose contracting dims differ", g))
    return out


@clause(SEAM, "C07", "bad graphs and bad targets give a CompileError or GraphError, never a crash")
def bad_graphs(s: Subject) -> None:
    compiler = s.vendor.compiler()
    target = _target(s, compiler)
    for what, g in _bad_graphs():
        try:
            compiler.compile(g, target)
        except (CompileError, GraphError) as exc:
            require(bool(exc.message), f"{what}: the error has no message")
            continue
        except FornaxError as exc:
            raise ContractFailure(f"{what}: raised {type(exc).__name__} ({exc}), expected a "
                                  "CompileError or GraphError") from None
        except Exception as exc:
            raise ContractFailure(f"{what}: crashed with {type(exc).__name__}: {exc}") from None
        raise ContractFailure(f"{what}: compiled without an error")
    bogus = Target(target.arch, "no-such-format", target.compute_units)
    try:
        compiler.compile(fusable_graph()[0], bogus)
    except CompileError as exc:
        require("no-such-format" in str(exc), f"a target format it does not emit: the error does not "
                                              f"name the format ({exc})")
    except Exception as exc:
        raise ContractFailure(f"a target format it does not emit: {type(exc).__name__} ({exc}), "
                              "expected a CompileError") from None
    else:
        raise ContractFailure("a target format it does not emit: compiled without an error")
