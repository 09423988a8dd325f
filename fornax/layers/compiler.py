"""The compiler seam: graph IR -> optimised kernels + a launch plan.

The pipeline is shared policy, a sequence of passes each in its own module
under :mod:`fornax.layers.passes`: check what can be lowered (``route``),
then the graph passes ``decompose``, ``fold``, ``simplify``, ``layout``,
``cse``, ``dce``, then library routing, ``fuse`` into kernels, buffer
planning, tile-ISA code generation and ``memplan`` (liveness-based buffer
reuse).  Every pass records the ops before and after in the plan's log and
stats.  A family supplies its facts (``vendor.toml`` ``[compiler]``: the
formats it emits, SIMD width, matrix instruction shape, tile sizes, routing
policy) and its encoders, which pack the generated programs into its own
binary formats.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, TypeAlias, runtime_checkable

import numpy as np

from ..sim.isa import Program
from . import codegen
from .binary import Encoder, KernelBinary
from .compile_cache import CompileCache, cache_key, fornax_version, identity_text, source_digest
from .errors import CompileError, ConfigError, FornaxError, GraphError
from .tiling import choose_gemm_tile
from .graph import OPS, DType, Graph, Node, Value
from .passes import route as routing
from .passes.cse import cse
from .passes.dce import dce
from .passes.decompose import Keep, decompose
from .passes.fold import fold
from .passes.fuse import Group, describe as describe_groups, fuse, group_io
from .passes.layout import layout
from .passes.memplan import MemoryPlan, plan_memory
from .passes.simplify import simplify
from .passes.views import views as find_views

__all__ = ["Target", "Buffer", "KernelStep", "LibraryStep", "CollectiveStep", "CompiledGraph",
           "Compiler", "CompilerBase", "CompileOptions", "Disassembler", "PassPipeline",
           "ProgramEmitter", "GRAPH_PASSES", "OPTIONAL_PASSES",
           "decompose", "fuse", "group_io", "Group", "MemoryPlan"]


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
    args: dict[str, int]           # param name -> buffer id
    ops: tuple[str, ...]           # the graph ops this kernel computes


@dataclass(frozen=True)
class LibraryStep:
    routine: str                   # "gemm", "conv2d_fwd" or "attention_fwd"
    buffers: dict[str, int]        # role -> buffer id
    params: dict[str, Any]
    ops: tuple[str, ...]


@dataclass(frozen=True)
class CollectiveStep:
    routine: str                   # "all_reduce"
    buffers: dict[str, int]        # {"x": in, "y": out} buffer ids
    nbytes: int
    ranks: int
    ops: tuple[str, ...]


#: one step of a launch plan, in order
Step: TypeAlias = "KernelStep | LibraryStep | CollectiveStep"
#: a family's encoder: (programs, arch, producer) -> a binary in its format
ProgramEncoder = Encoder


@dataclass
class CompiledGraph:
    """A launch plan: buffers, one module of kernels, and the steps in order."""

    name: str
    target: Target
    binary: KernelBinary | None
    buffers: dict[int, Buffer]
    steps: list[Step]
    inputs: list[int]
    outputs: list[int]
    programs: dict[str, Program]
    log: list[str]
    stats: dict[str, Any]
    memory: MemoryPlan | None = None   # buffers sharing storage (None: each its own allocation)

    def kernel_steps(self) -> list[KernelStep]:
        """The steps that launch a kernel of :attr:`binary`, in order."""
        return [s for s in self.steps if isinstance(s, KernelStep)]


@runtime_checkable
class Compiler(Protocol):
    """Graph IR in, kernel binaries and a launch plan out.  Errors are
    :class:`~fornax.layers.errors.CompileError` (or :class:`~fornax.layers.errors.GraphError`
    for a malformed graph); a compiler never touches a device."""

    vendor: str
    @property
    def compile_wall_s(self) -> float:
        """Host wall-clock seconds spent in :meth:`compile` so far (cache hits included); the
        report shows it apart from simulated time."""

    def output_formats(self) -> tuple[str, ...]:
        """The binary formats this compiler emits, preferred first (the stack negotiates one
        with the driver's loadable formats)."""
    def compile(self, graph: Graph, target: Target, library_routines: frozenset[str] = frozenset(),
                options: CompileOptions | None = None) -> CompiledGraph:
        """Compile ``graph`` for ``target`` into a launch plan whose binary is in
        ``target.format``; ops whose routine is in ``library_routines`` become library
        steps.  ``options`` (None: the compiler's own) choose fusion and passes.  Raises
        :class:`~fornax.layers.errors.CompileError` for an op it cannot lower."""
    def unsupported(self, graph: Graph,
                    library_routines: frozenset[str] = frozenset()) -> dict[str, str]:
        """The ops of ``graph`` this compiler cannot lower (given ``library_routines``), each
        with the reason; empty when it compiles whole."""
    def report(self) -> dict[str, Any]:
        """This compiler's part of the run report (JSON-serialisable)."""


@runtime_checkable
class PassPipeline(Protocol):
    """The capability of a compiler built on the shared pass pipeline (as
    :class:`CompilerBase` is): options the stack sets at compose time, the ops it routes
    to the library, and its graph passes on their own (``fornax compile --emit ir``)."""

    #: the options :meth:`Compiler.compile` uses when it is given none
    options: CompileOptions
    #: the ops the family routes to library routines when the library provides them
    route: frozenset[str]

    def run_graph_passes(self, graph: Graph, options: CompileOptions | None = None) -> Graph:
        """``graph`` lowered by the graph passes (decompose, fold, simplify, layout, cse, dce)
        that ``options`` (None: the compiler's own) enable, in that order."""


@runtime_checkable
class Disassembler(Protocol):
    """The capability to print a binary this compiler emitted as the family's assembly."""

    def disassemble(self, binary: KernelBinary) -> str:
        """The text form of ``binary`` (one of this compiler's output formats)."""


@runtime_checkable
class ProgramEmitter(Protocol):
    """The capability to pack tile-ISA programs into one of the family's binary formats
    (what the driver conformance suite loads hand-written kernels with)."""

    def emit(self, programs: list[Program], target: Target) -> KernelBinary:
        """One module holding ``programs`` in ``target.format`` for ``target.arch``."""


# ---- options -------------------------------------------------------------------------
#: the graph passes, in pipeline order; ``decompose`` always runs (composites have no lowering)
GRAPH_PASSES = ("decompose", "fold", "simplify", "layout", "cse", "dce")
_GRAPH_PASS_FNS: dict[str, Callable[[Graph], Graph]] = {"decompose": decompose, "fold": fold, "simplify": simplify, "layout": layout,
                   "cse": cse, "dce": dce}
OPTIONAL_PASSES = ("fold", "simplify", "layout", "cse", "dce", "fuse", "views", "memplan")


@dataclass(frozen=True)
class CompileOptions:
    """How to compile: ``fuse`` (off: one kernel per op, ``--no-fuse``), which optional
    passes run (``None``: all of :data:`OPTIONAL_PASSES`), and ``dump_ir``: a directory
    that receives the IR after every pass (``--dump-ir DIR``)."""

    fuse: bool = True
    passes: tuple[str, ...] | None = None
    dump_ir: str | None = None

    def __post_init__(self) -> None:
        if self.passes is not None:
            object.__setattr__(self, "passes", tuple(self.passes))
            bad = sorted(set(self.passes) - set(OPTIONAL_PASSES))
            if bad:
                raise ConfigError(f"unknown compiler pass(es) {', '.join(bad)}; optional passes: "
                                  f"{', '.join(OPTIONAL_PASSES)}", seam="compiler")

    def enabled(self, name: str) -> bool:
        if name == "fuse" and not self.fuse:
            return False
        return name == "decompose" or self.passes is None or name in self.passes

    def key(self) -> str:
        """What changes the compiled result (``dump_ir`` does not)."""
        return f"fuse={self.fuse} passes={','.join(self.passes) if self.passes is not None else '*'}"


def _log_enabled() -> bool:
    return "compiler" in {p.strip() for p in os.environ.get("FORNAX_LOG", "").split(",")}


class CompilerBase:
    """Shared compiler pipeline; a vendor subclass sets ``vendor``, ``facts`` and :meth:`emit`."""

    seam = "compiler"
    vendor = "base"
    facts: dict[str, Any] = {}

    def __init__(self) -> None:
        c = self.facts["compiler"]
        self.formats: tuple[str, ...] = tuple(c["formats"])
        # the SIMD width is a hardware fact: written once, in [driver]
        self.simd_width: int = int(self.facts["driver"]["simd_width"])
        self.matrix_shape = tuple(c["matrix_shape"])
        self.gemm_tiles = [tuple(t) for t in c["gemm_tiles"]]
        for tile in self.gemm_tiles:
            if any(t % s for t, s in zip(tile, self.matrix_shape)):
                raise ConfigError(f"{self.vendor} compiler: GEMM tile {tile} is not a multiple of "
                                  f"the matrix instruction shape {self.matrix_shape}", seam="compiler",
                                  vendor=self.vendor)
        self.block: int = c["pointwise_block"]
        self.group_size: int = self.simd_width * c["groups_per_block"]
        self.route: frozenset[str] = frozenset(c.get("route_to_library", ()))
        self.compile_cache: CompileCache[CompiledGraph] = CompileCache()   # content-addressed, memory + disk
        self.counts = {"graphs_compiled": 0, "cache_hits": 0, "graphs_from_disk": 0, "ops_in": 0, "ops_lowered": 0,
                       "kernels": 0, "fused_kernels": 0, "library_calls": 0, "binary_bytes": 0,
                       "planned_peak_bytes": 0}
        #: the options a compile() without its own uses (compose sets them from the stack config)
        self.options = CompileOptions()
        self.compile_wall_s = 0.0

    #: vendor hook: binary format -> encoder(programs, arch, producer) -> KernelBinary
    encoders: dict[str, ProgramEncoder] = {}
    #: vendor hook: binary -> the family's readable text form (None: the family has none)
    disassembler: Callable[[KernelBinary], str] | None = None

    def disassemble(self, binary: KernelBinary) -> str:
        """The family's text form of one of its binaries (``fornax compile --emit asm``)."""
        if self.disassembler is None:
            raise CompileError(f"the {self.vendor} compiler has no text form for {binary.format}",
                               seam="compiler", vendor=self.vendor)
        return self.disassembler(binary)

    def emit(self, programs: list[Program], target: Target) -> KernelBinary:
        """Pack the generated kernels into the negotiated format for the target."""
        producer = f"{self.vendor} {self.facts['compiler']['name']}"
        encode = self.encoders.get(target.format)
        if encode is None:
            raise CompileError(f"the {self.vendor} compiler cannot emit {target.format} (it emits "
                               f"{', '.join(self.encoders)})", seam="compiler", vendor=self.vendor,
                               op="emit", hint="ask for one of its output formats")
        return encode(programs, target.arch, producer)

    # -- shared --------------------------------------------------------------------
    def output_formats(self) -> tuple[str, ...]:
        return self.formats

    def unsupported(self, graph: Graph, library_routines: frozenset[str] = frozenset()) -> dict[str, str]:
        """op -> reason for every op of ``graph`` this compiler cannot lower (asked up front,
        so the framework can run those ops on the CPU instead)."""
        return routing.unsupported(graph, routing.library_ops(self.route, library_routines))

    # -- compile cache (one place; memory + disk levels in layers/compile_cache.py) ----------
    def _fingerprint(self, graph: Graph, target: Target, routines: frozenset[str],
                     options: CompileOptions | None = None) -> str:
        return cache_key(graph, target, self._identity(),
                         f"{sorted(routines)}|{(options or CompileOptions()).key()}")

    def _identity(self) -> bytes:
        """This compiler's part of every cache key, as canonical JSON (UTF-8).  Worked out
        again only when the vendor, the facts tables or the fornax version is another object:
        facts are data, read when the compiler is built and never edited in place."""
        parts = (self.vendor, self.facts["compiler"], fornax_version(),
                 self.facts.get("library", {}).get("dnn"), source_digest())
        memo = self.__dict__.get("_identity_memo")
        if memo is None or any(a is not b for a, b in zip(memo[0], parts)):
            text = identity_text({"vendor": parts[0], "compiler": parts[1], "fornax": parts[2],
                                  "dnn": parts[3], "source": parts[4]})
            memo = self._identity_memo = (parts, text.encode())
        return memo[1]

    def _cache_get(self, key: str, graph: Graph) -> CompiledGraph | None:
        disk_hits = self.compile_cache.stats["disk_hits"]
        plan = self.compile_cache.get(key, graph)
        if plan is not None:
            self.counts["cache_hits"] += 1
            if self.compile_cache.stats["disk_hits"] > disk_hits:
                # compiled by an earlier process: what it produced is counted now, as a fresh
                # compile's would be (a memory hit was counted when this instance compiled it)
                self._count(plan.stats)
                self.counts["graphs_from_disk"] += 1
        return plan

    def _count(self, stats: dict[str, Any]) -> None:
        """Add one plan's results (its ``stats``) to this compiler's report counts."""
        for k in ("ops_in", "ops_lowered", "kernels", "fused_kernels", "library_calls", "binary_bytes"):
            self.counts[k] += stats.get(k, 0)
        self.counts["planned_peak_bytes"] = max(self.counts["planned_peak_bytes"],
                                                stats.get("planned_peak_bytes", 0))

    def _cache_put(self, key: str, plan: CompiledGraph, graph: Graph) -> None:
        self.compile_cache.put(key, plan, graph)

    # -- the pipeline -----------------------------------------------------------------
    def compile(self, graph: Graph, target: Target, library_routines: frozenset[str] = frozenset(),
                options: CompileOptions | None = None) -> CompiledGraph:
        options = options or self.options
        if target.format not in self.formats:
            raise CompileError(f"cannot emit {target.format}; this compiler emits "
                               f"{', '.join(self.formats)}", seam="compiler", vendor=self.vendor)
        try:
            graph.verify()
        except GraphError as exc:
            raise CompileError(f"graph {graph.name!r} is invalid: {exc.message}", seam="compiler",
                               vendor=self.vendor, op=exc.op) from None
        cannot = self.unsupported(graph, library_routines)
        if cannot:
            op, why = next(iter(cannot.items()))
            raise CompileError(f"graph {graph.name!r}: cannot lower {', '.join(sorted(cannot))} ({why})",
                               seam="compiler", vendor=self.vendor, op=op,
                               hint="run it through the framework, which routes ops the compiler "
                                    "cannot lower to the CPU")
        key = self._fingerprint(graph, target, library_routines, options)
        if options.dump_ir or _log_enabled():
            # the IR after each pass exists only while compiling: a cache entry holds the plan,
            # not those texts, so a dump request compiles again (counted as bypassed)
            self.compile_cache.bypass()
        else:
            cached = self._cache_get(key, graph)
            if cached is not None:
                return cached
        t0 = time.perf_counter()
        try:
            plan = self._compile(graph, target, library_routines, options)
        except FornaxError as exc:
            if exc.seam is None:
                exc.seam, exc.vendor = "compiler", self.vendor
            raise
        self.compile_wall_s += time.perf_counter() - t0
        self._cache_put(key, plan, graph)
        return plan

    def _dump(self, options: CompileOptions, graph_name: str, index: int, name: str, text: str) -> None:
        """The IR after a pass: to stderr under FORNAX_LOG=compiler, to a file under dump_ir."""
        if _log_enabled():
            print(f"--- fornax compiler: {graph_name} after {name} ---\n{text}", file=sys.stderr)
        if options.dump_ir:
            path = Path(options.dump_ir) / f"{graph_name}.{index:02d}.{name}.txt"
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text + "\n", encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"--dump-ir: cannot write {path}: {exc.strerror or exc}",
                                  seam="compiler") from None

    def run_graph_passes(self, graph: Graph, options: CompileOptions | None = None,
                         log: list[str] | None = None,
                         records: list[dict[str, Any]] | None = None,
                         keep: Keep = frozenset()) -> Graph:
        """The graph-to-graph passes in order (each one that ``options`` enables); ``keep``
        (op names or a node predicate) leaves composites whole for the library."""
        options = options or self.options
        self._dump(options, graph.name, 0, "input", str(graph))
        for i, name in enumerate(GRAPH_PASSES, 1):
            if not options.enabled(name):
                continue
            before = len(graph.nodes)
            graph = decompose(graph, keep) if name == "decompose" else _GRAPH_PASS_FNS[name](graph)
            if log is not None:
                log.append(f"{name}: {before} -> {len(graph.nodes)} ops")
            if records is not None:
                records.append({"pass": name, "ops_before": before, "ops_after": len(graph.nodes)})
            self._dump(options, graph.name, i, name, str(graph))
        return graph

    def _compile(self, graph: Graph, target: Target, routines: frozenset[str],
                 options: CompileOptions) -> CompiledGraph:
        log = [f"input: {len(graph.nodes)} ops"]
        records: list[dict[str, Any]] = []
        library_ops = routing.library_ops(self.route, routines)
        dnn = self.facts.get("library", {}).get("dnn")

        def to_library(node: Node) -> bool:        # a whole composite the library's DNN routines compute
            return node.op in library_ops and routing.library_call(node, dnn) is not None

        lowered = self.run_graph_passes(graph, options, log, records, keep=to_library)
        groups = fuse(lowered, library_ops, enabled=options.enabled("fuse"))
        io = group_io(lowered, groups)
        n_lib = sum(g.kind == "library" for g in groups)
        log.append(f"route: {n_lib} library calls ({', '.join(sorted(library_ops)) or 'nothing routed'})")
        log.append(f"fuse{'' if options.enabled('fuse') else ' (off)'}: {len(lowered.nodes)} ops -> "
                   f"{len(groups)} steps")
        records.append({"pass": "fuse", "ops_before": len(lowered.nodes), "ops_after": len(groups)})
        self._dump(options, graph.name, len(GRAPH_PASSES) + 1, "fuse", describe_groups(groups))

        # with fusion off every op stays its own kernel (the teaching view), views included
        vw = find_views(lowered, groups, enabled=options.enabled("views") and options.enabled("fuse"))
        if vw.aliases or vw.folded:
            log.append(f"views: {len(vw.aliases)} reshapes read in place, {len(vw.folded)} transposes "
                       "read by the library GEMM")
            records.append({"pass": "views", "ops_before": len(groups),
                            "ops_after": len(groups) - len(vw.aliases) - len(vw.folded)})
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
        steps: list[Step] = []
        for gi, (group, (ins, outs)) in enumerate(zip(groups, io)):
            ops = tuple(n.op for n in group.nodes)
            name = f"{graph.name}_{gi}_{group.kind}"
            if gi in vw.folded:
                continue                   # the library GEMM reads the operand transposed
            if gi in vw.aliases:
                view, src = vw.aliases[gi]
                bid = by_value[id(view)] = buf(src, "temp")    # the same bytes: no kernel
                if id(view) in out_ids:                        # the temporary is the output
                    buffers[bid] = Buffer(bid, view.name, view.shape, view.dtype, "output")
                continue
            if group.kind == "collective":
                node = group.nodes[0]
                x, y = node.inputs[0], node.outputs[0]
                steps.append(CollectiveStep(node.op, {"x": buf(x, "temp"), "y": buf(y, "temp")},
                                            y.type.nbytes, node.attrs["ranks"], ops))
                continue
            if group.kind == "library" and node_is_composite(group.nodes[0]):
                node = group.nodes[0]
                call = routing.library_call(node, dnn)
                if call is None:          # to_library() routed it here because a routine computes it
                    raise CompileError(f"{node.op} was routed to the library, which has no routine "
                                       "for it", seam="compiler", vendor=self.vendor)
                routine, prm = call
                roles = ("x", "w") if routine == "conv2d_fwd" else ("q", "k", "v")
                bufs = {r: buf(v, "temp") for r, v in zip(roles, node.inputs)}
                bufs["y" if routine == "conv2d_fwd" else "o"] = buf(node.outputs[0], "temp")
                if routine == "attention_fwd":       # the saved log-sum-exp: a float32 temporary
                    bid = len(buffers)
                    buffers[bid] = Buffer(bid, f"{name}_lse", (prm["batch"] * prm["heads"], prm["seq_q"]),
                                          DType.FLOAT32, "temp")
                    bufs["lse"] = bid
                steps.append(LibraryStep(routine, bufs, prm, ops))
                log.append(f"library {name}: {node.op} -> {routine}")
                continue
            if group.kind == "library":
                node = group.nodes[0]
                a, b = node.inputs
                stored = vw.transposed.get(gi, {})
                prm = _gemm_params(a, b)
                prm.update({f"trans_{r}": True for r in stored})
                steps.append(LibraryStep("gemm", {"a": buf(stored.get("a", a), "temp"),
                                                  "b": buf(stored.get("b", b), "temp"),
                                                  "c": buf(node.outputs[0], "temp")}, prm, ops))
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
                if group.axis is None:    # fuse() gives every reduction group its axis
                    raise CompileError(f"reduction group {name} has no axis", seam="compiler",
                                       vendor=self.vendor)
                program, grid = codegen.reduction_kernel(name, group.nodes, ins, outs, group.space,
                                                         group.axis, self.group_size)
                args = _io_args(ins, outs, buf)
            programs.append(program)
            steps.append(KernelStep(name, grid, args, ops))
        outputs = [buf(v, "output") for v in lowered.outputs]
        binary = self.emit(programs, target) if programs else None
        pinned = set(inputs) | set(outputs) | {b.id for b in buffers.values() if b.role == "constant"}
        memory = None
        if options.enabled("memplan"):
            memory = plan_memory([_step_buffers(st) for st in steps],
                                 {bid: b.nbytes for bid, b in buffers.items()}, pinned)
            log.append(f"memplan: {len(memory.slots)} temporaries in {len(memory.slot_bytes)} slots; "
                       f"planned peak {memory.peak_bytes} of {memory.total_bytes} bytes")
        kernels = [s for s in steps if isinstance(s, KernelStep)]
        total = sum(b.nbytes for b in buffers.values())
        stats = {"ops_in": len(graph.nodes), "ops_lowered": len(lowered.nodes),
                 "kernels": len(kernels), "fused_kernels": sum(len(s.ops) > 1 for s in kernels),
                 "library_calls": sum(isinstance(s, LibraryStep) for s in steps),
                 "binary_bytes": len(binary.data) if binary else 0,
                 "planned_bytes": total,
                 "planned_peak_bytes": memory.peak_bytes if memory is not None else total,
                 "shared_buffers": memory.shared if memory is not None else 0,
                 "fuse": options.enabled("fuse"), "passes": records}
        self._count(stats)
        self.counts["graphs_compiled"] += 1
        log.append(f"codegen: {stats['kernels']} kernels ({stats['fused_kernels']} fused), "
                   f"{target.format} for {target.arch}, {stats['binary_bytes']} bytes")
        return CompiledGraph(graph.name, target, binary, buffers, steps, inputs, outputs,
                             {p.name: p for p in programs}, log, stats, memory)

    def report(self) -> dict[str, Any]:
        return {"vendor": self.vendor, "formats": list(self.formats), "simd_width": self.simd_width,
                "matrix_shape": list(self.matrix_shape), "routes_to_library": sorted(self.route),
                **self.counts, "compile_wall_s": self.compile_wall_s,
                "compile_cache": self.compile_cache.report()}


def node_is_composite(node: Node) -> bool:
    """Whether a library group's node is a whole composite (a DNN routine) rather than a GEMM."""
    return OPS[node.op].kind == "composite"


def _step_buffers(step: Step) -> list[int]:
    return list(step.args.values() if isinstance(step, KernelStep) else step.buffers.values())


def _io_args(ins: list[Value], outs: list[Value], buf: Callable[[Value, str], int]) -> dict[str, int]:
    args = {f"in{i}": buf(v, "temp") for i, v in enumerate(ins)}
    args.update({f"out{i}": buf(v, "temp") for i, v in enumerate(outs)})
    return args


def _gemm_params(a: Value, b: Value) -> dict[str, Any]:
    batch = a.shape[0] if len(a.shape) == 3 else 1
    return {"m": a.shape[-2], "n": b.shape[-1], "k": a.shape[-1], "batch": batch,
            "b_batched": len(b.shape) == 3, "dtype": a.dtype.value}
