"""The compiler seam: graph IR -> optimised kernels + a launch plan.

The pipeline is shared policy, each pass a small function: verify,
decompose composites, route ops to the library (a per-family policy), fuse
into kernels, plan buffers, generate tile-ISA code.  A family supplies its
facts (``vendor.toml`` ``[compiler]``: the formats it emits, SIMD width,
matrix instruction shape, tile sizes, routing policy) and its encoders,
which pack the generated programs into its own binary formats.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ..sim.isa import Program
from . import codegen
from .binary import KernelBinary
from .errors import CompileError, ConfigError, FornaxError, GraphError
from .tiling import choose_gemm_tile
from .graph import OPS, DType, Graph, Node, Value


@dataclass(frozen=True)
class Target:
    """What a compiler is asked to build for (from the driver at compose time)."""

    arch: str                      # the device as the driver names it: sm_90, gfx942, ...
    format: str                    # the negotiated binary format
    compute_units: int = 1


@dataclass(frozen=True)
class Buffer:
    id: int
    name: str
    shape: tuple[int, ...]
    dtype: DType
    role: str                      # input | constant | temp | output
    data: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def nbytes(self) -> int:
        return max(1, int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize)


@dataclass(frozen=True)
class KernelStep:
    entry: str
    grid: tuple[int, int, int]
    args: dict                     # param name -> buffer id
    ops: tuple[str, ...]           # the graph ops this kernel computes


@dataclass(frozen=True)
class LibraryStep:
    routine: str                   # "gemm"
    buffers: dict                  # role -> buffer id
    params: dict
    ops: tuple[str, ...]


@dataclass(frozen=True)
class CollectiveStep:
    routine: str                   # "all_reduce"
    buffers: dict                  # {"x": in, "y": out} buffer ids
    nbytes: int
    ranks: int
    ops: tuple[str, ...]


@dataclass
class CompiledGraph:
    """A launch plan: buffers, one module of kernels, and the steps in order."""

    name: str
    target: Target
    binary: KernelBinary | None
    buffers: dict[int, Buffer]
    steps: list
    inputs: list[int]
    outputs: list[int]
    programs: dict[str, Program]
    log: list[str]
    stats: dict


@runtime_checkable
class Compiler(Protocol):
    vendor: str

    def output_formats(self) -> tuple[str, ...]: ...
    def compile(self, graph: Graph, target: Target, library_routines: frozenset = frozenset()) -> CompiledGraph: ...
    def report(self) -> dict: ...


# ---- passes --------------------------------------------------------------------------
def decompose(graph: Graph, keep: frozenset = frozenset()) -> Graph:
    """Replace composite ops (except those in ``keep``) by their decompositions."""
    out = Graph(graph.name)
    env: dict[int, Value] = {}
    for v in graph.inputs:
        env[id(v)] = out.input(v.name, v.shape, v.dtype)
    for v in graph.constants:
        env[id(v)] = out.constant(v.const, v.name)
    for node in graph.nodes:
        opdef = OPS[node.op]
        args = [env[id(v)] for v in node.inputs]
        if node.op == "all_reduce" and node.attrs.get("ranks") == 1:
            env[id(node.outputs[0])] = args[0]       # a sum over one rank is the value itself
            continue
        if opdef.decompose is not None and node.op not in keep:
            res = opdef.decompose(out, args, node.attrs)
        else:
            res = out.op(node.op, *args, **node.attrs)
            out.rename(res, node.outputs[0].name, strict=False)   # buffers keep the graph's names
        env[id(node.outputs[0])] = res
    out.output(*(env[id(v)] for v in graph.outputs))
    return out


@dataclass
class Group:
    kind: str                      # pointwise | reduction | gemm | library
    nodes: list[Node]
    space: tuple[int, ...]
    axis: int | None = None
    closed: bool = False

    def produces(self, v: Value) -> bool:
        return any(v is n.outputs[0] for n in self.nodes)


def _consumes_group(group: Group, node: Node) -> bool:
    return any(group.produces(v) for v in node.inputs)


def fuse(graph: Graph, library_ops: frozenset) -> list[Group]:
    """Greedy producer-consumer fusion in topological order."""
    groups: list[Group] = []
    cur: Group | None = None

    def start(g: Group) -> Group:
        groups.append(g)
        return g

    for node in graph.nodes:
        out = node.outputs[0]
        kind = OPS[node.op].kind
        if kind == "matmul":
            if node.op in library_ops:
                start(Group("library", [node], out.shape, closed=True))
                cur = None
            else:
                cur = start(Group("gemm", [node], out.shape))
            continue
        if kind == "reduce":
            x = node.inputs[0]
            axis = node.attrs.get("axis", -1) % len(x.shape)
            keep = node.attrs.get("keepdims", True)
            joinable = (cur is not None and not cur.closed and cur.kind in ("pointwise", "reduction")
                        and cur.space == x.shape and cur.axis in (None, axis)
                        and _consumes_group(cur, node))
            if joinable:
                cur.nodes.append(node)
                cur.kind, cur.axis = "reduction", axis
            else:
                cur = start(Group("reduction", [node], x.shape, axis))
            if not keep:
                cur.closed = True
            continue
        if kind == "collective":
            start(Group("collective", [node], out.shape, closed=True))
            cur = None
            continue
        if kind == "layout":
            # a layout op reads its operand through a rearranged index: it opens a new
            # pointwise kernel (over its output), and elementwise consumers may fuse after it
            cur = start(Group("pointwise", [node], out.shape))
            continue
        if kind != "elementwise":
            raise CompileError(f"no lowering for {kind} op {node.op!r} (decompose it first)",
                               seam="compiler", op=node.op)
        reduced = None
        if cur is not None and cur.axis is not None:
            reduced = tuple(1 if d == cur.axis else s for d, s in enumerate(cur.space))
        fits = (cur is not None and not cur.closed and cur.kind != "library"
                and (out.shape == cur.space or (cur.kind == "reduction" and out.shape == reduced))
                and _consumes_group(cur, node))
        if fits:
            cur.nodes.append(node)
        else:
            cur = start(Group("pointwise", [node], out.shape))
    return groups


def group_io(graph: Graph, groups: list[Group]) -> list[tuple[list[Value], list[Value]]]:
    """External inputs and live-out outputs of every group."""
    users = graph.users()
    owner = {}
    for gi, g in enumerate(groups):
        for n in g.nodes:
            owner[id(n.outputs[0])] = gi
    graph_outs = {id(v) for v in graph.outputs}
    result = []
    for gi, g in enumerate(groups):
        ins: list[Value] = []
        for n in g.nodes:
            for v in n.inputs:
                if owner.get(id(v)) != gi and all(v is not w for w in ins):
                    ins.append(v)
        outs = []
        for n in g.nodes:
            v = n.outputs[0]
            if id(v) in graph_outs or any(owner.get(id(u.outputs[0])) != gi for u in users.get(id(v), [])):
                outs.append(v)
        result.append((ins, outs))
    return result


class CompilerBase:
    """Shared compiler pipeline; a vendor subclass sets ``vendor``, ``facts`` and :meth:`emit`."""

    seam = "compiler"
    vendor = "base"
    facts: dict = {}

    def __init__(self):
        c = self.facts["compiler"]
        self.formats: tuple[str, ...] = tuple(c["formats"])
        self.simd_width: int = c["simd_width"]
        self.matrix_shape = tuple(c["matrix_shape"])
        self.gemm_tiles = [tuple(t) for t in c["gemm_tiles"]]
        for tile in self.gemm_tiles:
            if any(t % s for t, s in zip(tile, self.matrix_shape)):
                raise ConfigError(f"{self.vendor} compiler: GEMM tile {tile} is not a multiple of "
                                  f"the matrix instruction shape {self.matrix_shape}", seam="compiler",
                                  vendor=self.vendor)
        self.block: int = c["pointwise_block"]
        self.group_size: int = c["simd_width"] * c["groups_per_block"]
        self.route: frozenset = frozenset(c.get("route_to_library", ()))
        self._cache: dict[str, CompiledGraph] = {}
        self.counts = {"graphs_compiled": 0, "cache_hits": 0, "ops_in": 0, "ops_lowered": 0,
                       "kernels": 0, "fused_kernels": 0, "library_calls": 0, "binary_bytes": 0}
        self.compile_wall_s = 0.0

    #: vendor hook: binary format -> encoder(programs, arch, producer) -> KernelBinary
    encoders: dict = {}

    def emit(self, programs: list[Program], target: Target) -> KernelBinary:
        """Pack the generated kernels into the negotiated format for the target."""
        producer = f"{self.vendor} {self.facts['compiler']['name']}"
        return self.encoders[target.format](programs, target.arch, producer)

    # -- shared --------------------------------------------------------------------
    def output_formats(self) -> tuple[str, ...]:
        return self.formats

    def _fingerprint(self, graph: Graph, target: Target, routines: frozenset) -> str:
        h = hashlib.sha256(str(graph).encode())
        for v in graph.constants:
            h.update(np.ascontiguousarray(v.const).tobytes())
        h.update(f"{target}|{sorted(routines)}".encode())
        return h.hexdigest()

    def compile(self, graph: Graph, target: Target,
                library_routines: frozenset = frozenset()) -> CompiledGraph:
        if target.format not in self.formats:
            raise CompileError(f"cannot emit {target.format}; this compiler emits "
                               f"{', '.join(self.formats)}", seam="compiler", vendor=self.vendor)
        try:
            graph.verify()
        except GraphError as exc:
            raise CompileError(f"graph {graph.name!r} is invalid: {exc.message}", seam="compiler",
                               vendor=self.vendor, op=exc.op) from None
        key = self._fingerprint(graph, target, library_routines)
        if key in self._cache:
            self.counts["cache_hits"] += 1
            return self._cache[key]
        t0 = time.perf_counter()
        try:
            plan = self._compile(graph, target, library_routines)
        except FornaxError as exc:
            if exc.seam is None:
                exc.seam, exc.vendor = "compiler", self.vendor
            raise
        self.compile_wall_s += time.perf_counter() - t0
        self._cache[key] = plan
        return plan

    def _compile(self, graph: Graph, target: Target, routines: frozenset) -> CompiledGraph:
        log = [f"input: {len(graph.nodes)} ops"]
        lowered = decompose(graph)
        log.append(f"decompose: {len(graph.nodes)} -> {len(lowered.nodes)} ops")
        library_ops = frozenset(op for op in self.route if op in routines)
        groups = fuse(lowered, library_ops)
        io = group_io(lowered, groups)
        log.append(f"fuse: {len(lowered.nodes)} ops -> {len(groups)} steps "
                   f"({sum(g.kind == 'library' for g in groups)} library calls)")

        buffers: dict[int, Buffer] = {}
        by_value: dict[int, int] = {}
        out_ids = {id(v) for v in lowered.outputs}

        def buf(v: Value, role: str) -> int:
            if id(v) not in by_value:
                bid = len(buffers)
                if id(v) in out_ids and role == "temp":
                    role = "output"
                buffers[bid] = Buffer(bid, v.name, v.shape, v.dtype, role, v.const)
                by_value[id(v)] = bid
            return by_value[id(v)]

        inputs = [buf(v, "input") for v in lowered.inputs]
        for v in lowered.constants:
            buf(v, "constant")
        programs: list[Program] = []
        steps: list = []
        for gi, (group, (ins, outs)) in enumerate(zip(groups, io)):
            ops = tuple(n.op for n in group.nodes)
            name = f"{graph.name}_{gi}_{group.kind}"
            if group.kind == "collective":
                node = group.nodes[0]
                x, y = node.inputs[0], node.outputs[0]
                steps.append(CollectiveStep(node.op, {"x": buf(x, "temp"), "y": buf(y, "temp")},
                                            y.type.nbytes, node.attrs["ranks"], ops))
                continue
            if group.kind == "library":
                node = group.nodes[0]
                a, b = node.inputs
                steps.append(LibraryStep("gemm", {"a": buf(a, "temp"), "b": buf(b, "temp"),
                                                  "c": buf(node.outputs[0], "temp")},
                                         _gemm_params(a, b), ops))
                continue
            if group.kind == "gemm":
                mm = group.nodes[0]
                a, b = mm.inputs
                extra = [v for v in ins if v is not a and v is not b]
                prm = _gemm_params(a, b)
                epi = group.nodes[1:]
                choice, why = choose_gemm_tile(prm["m"], prm["n"], prm["batch"], target.compute_units,
                                               self.gemm_tiles)
                log.append(f"tile {name}: {'x'.join(map(str, self.gemm_tiles[choice]))} — {why}")
                program, grid = codegen.gemm_kernel(
                    name, a.dtype, prm["m"], prm["n"], prm["k"], prm["batch"], prm["b_batched"],
                    self.gemm_tiles[choice], self.group_size, epilogue=epi, product=mm.outputs[0],
                    extra_inputs=extra, outputs=outs)
                args = {"a": buf(a, "temp"), "b": buf(b, "temp")}
                args.update({f"in{i}": buf(v, "temp") for i, v in enumerate(extra)})
                if epi:
                    args.update({f"out{i}": buf(v, "temp") for i, v in enumerate(outs)})
                else:
                    args["c"] = buf(mm.outputs[0], "temp")
            elif group.kind == "pointwise":
                program, grid = codegen.pointwise_kernel(name, group.nodes, ins, outs, group.space,
                                                         self.block, self.group_size)
                args = _io_args(ins, outs, buf)
            else:
                program, grid = codegen.reduction_kernel(name, group.nodes, ins, outs, group.space,
                                                         group.axis, self.group_size)
                args = _io_args(ins, outs, buf)
            programs.append(program)
            steps.append(KernelStep(name, grid, args, ops))
        outputs = [buf(v, "output") for v in lowered.outputs]
        binary = self.emit(programs, target) if programs else None
        kernels = [s for s in steps if isinstance(s, KernelStep)]
        stats = {"ops_in": len(graph.nodes), "ops_lowered": len(lowered.nodes),
                 "kernels": len(kernels), "fused_kernels": sum(len(s.ops) > 1 for s in kernels),
                 "library_calls": sum(isinstance(s, LibraryStep) for s in steps),
                 "binary_bytes": len(binary.data) if binary else 0,
                 "planned_bytes": sum(b.nbytes for b in buffers.values())}
        for k in ("ops_in", "ops_lowered", "kernels", "fused_kernels", "library_calls", "binary_bytes"):
            self.counts[k] += stats[k]
        self.counts["graphs_compiled"] += 1
        log.append(f"codegen: {stats['kernels']} kernels ({stats['fused_kernels']} fused), "
                   f"{target.format} for {target.arch}, {stats['binary_bytes']} bytes")
        return CompiledGraph(graph.name, target, binary, buffers, steps, inputs, outputs,
                             {p.name: p for p in programs}, log, stats)

    def report(self) -> dict:
        return {"vendor": self.vendor, "formats": list(self.formats), "simd_width": self.simd_width,
                "matrix_shape": list(self.matrix_shape), "routes_to_library": sorted(self.route),
                **self.counts, "compile_wall_s": self.compile_wall_s}


def _io_args(ins: list[Value], outs: list[Value], buf) -> dict:
    args = {f"in{i}": buf(v, "temp") for i, v in enumerate(ins)}
    args.update({f"out{i}": buf(v, "temp") for i, v in enumerate(outs)})
    return args


def _gemm_params(a: Value, b: Value) -> dict:
    batch = a.shape[0] if len(a.shape) == 3 else 1
    return {"m": a.shape[-2], "n": b.shape[-1], "k": a.shape[-1], "batch": batch,
            "b_batched": len(b.shape) == 3, "dtype": a.dtype.value}
