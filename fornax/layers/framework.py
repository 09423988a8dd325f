"""The framework seam: how a vendor family presents itself to PyTorch and JAX.

A family's face is data (``vendor.toml`` ``[framework]``): the device type
frameworks see (``cuda`` for both cuda-like and rocm-like, as ROCm PyTorch
poses as CUDA; ``xpu`` for xpu-like), version fields, the distributed
backend name, and an op coverage table listing the exceptions: ops the
family decomposes before compiling, and ops it runs on the CPU on purpose
(with the reason); every other graph op runs natively.  :class:`FrameworkBase` is the shared policy that turns a graph into
device segments (compiled by the compiler seam, run through runtime and
library) and counted CPU fallbacks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Callable, Protocol, TypeAlias, cast, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .compiler import (CollectiveStep, CompiledGraph, Compiler, KernelStep, LibraryStep, Target,
                       decompose)
from .errors import ConfigError, FornaxError, InvalidArgumentError
from .driver import Driver, Module
from .face import (AutocastPolicy, OpOverloadLike, TorchFace, aten_name, device_properties,
                   parse_torch_face)
from .graph import OPS, DType, Graph, Node, Value
from .launch_capture import LaunchCapture, RuntimeTap, relocations
from .library import Library
from .runtime import Runtime, Stream


def _c_order(a: object) -> NDArray[Any]:
    """A C-contiguous array of ``a``, keeping 0-d arrays 0-d (``np.ascontiguousarray`` makes
    them 1-d)."""
    return np.asarray(a, order="C")


@dataclass(frozen=True)
class MetaArray:
    """A tensor without data: what shape-only (meta) mode feeds in and hands back."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", DType.of(self.dtype).numpy)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @classmethod
    def like(cls, v: Value) -> "MetaArray":
        return cls(v.shape, v.dtype.numpy)


#: collective handler: (runtime, step, pointers) -> None; enqueues the step's communication.
#: ``pointers`` maps the step's buffer roles (``x`` in, ``y`` out) to device addresses
CollectiveHandler = Callable[[Runtime, CollectiveStep, dict[str, int]], None]
#: a value on the host side of a run: data, or (shape-only mode) its shape and dtype
HostValue: TypeAlias = "NDArray[Any] | MetaArray"
#: one op a run sent to the CPU: op, node (its output's name) and the reason
Fallback: TypeAlias = dict[str, str]


@dataclass(frozen=True)
class Face:
    device_type: str               # what torch.device(...) / jax platform reports
    module: str                    # torch.cuda / torch.xpu
    version_field: str             # torch.version.cuda / .hip / .xpu
    version: str
    dist_backend: str
    pjrt_plugin: str
    rng: str = ""                  # the default generator's algorithm (philox4x32-10, ...)
    versions: tuple[tuple[str, str | None], ...] = ()   # every torch.version accelerator field
    pjrt_platform: str = ""        # the platform JAX names the plugin's devices by (cuda, rocm, xpu)


@dataclass(frozen=True)
class Route:
    op: str
    kind: str                      # native | decomposed | fallback
    reason: str


@dataclass
class RunResult:
    outputs: list[HostValue]
    routes: list[Route]
    fallbacks: list[Fallback]
    plans: list[CompiledGraph] = field(default_factory=list)
    host_wall_s: float = 0.0


@runtime_checkable
class Framework(Protocol):
    """How a vendor presents itself to PyTorch and JAX, and how a captured graph runs on the
    stack: op routes (native, decomposed, CPU fallback), the device's face, and whole-graph
    plans on device-resident buffers.  Errors are :class:`~fornax.layers.errors.FornaxError`
    subclasses."""

    vendor: str
    #: device naming and version fields (torch.device type, module, dist backend, PJRT plugin)
    face: Face
    #: the PyTorch face checked from ``[framework.torch]``: device properties, ATen routes,
    #: autocast (what qualification compares against)
    torch_face: TorchFace
    #: shape-only mode, set by the stack at compose time before any run: feeds and outputs
    #: are :class:`MetaArray` and nothing computes
    meta: bool
    #: whether resident plans capture their runtime calls and replay them
    #: (:mod:`~fornax.layers.launch_capture`), set by the stack at compose time
    capture_plans: bool

    def route(self, op: str) -> Route:
        """Where graph-IR op ``op`` runs in this family: native, decomposed or fallback."""
    def torch_route(self, op: str | OpOverloadLike) -> Route | None:
        """The family's rule for ATen ``op`` (an overload name or a torch OpOverload):
        decomposed first, CPU fallback with its reason, or None for no rule."""
    def device_properties(self, driver: Driver, index: int = 0) -> dict[str, Any]:
        """What ``torch.<module>.get_device_properties(index)`` shows, in the family's
        vocabulary, from ``driver.properties(index)`` and the chip spec."""
    def versions(self) -> dict[str, str | None]:
        """The ``torch.version`` accelerator fields as this family's PyTorch build sets them."""
    def autocast_policy(self) -> AutocastPolicy:
        """What ``torch.autocast(device_type)`` does on this family."""
    def run(self, graph: Graph, feeds: Mapping[str, ArrayLike | MetaArray]) -> RunResult:
        """Run ``graph`` on host ``feeds`` (by input name): device segments compiled and run
        on the stack, fallbacks on the CPU; the outputs (host arrays) and every op's route."""
    def device_route(self, graph: Graph) -> Route | None:
        """Why ``graph`` cannot run on the device as one compiled piece (the first op that
        falls back, by route or because the compiler cannot lower it), or None when it can.
        Ask before :meth:`prepare`."""
    def prepare(self, graph: Graph, stream: Stream | None = None) -> ResidentPlan:
        """Compile ``graph`` whole (after the family's decompositions) into a plan bound to
        the stack's runtime that runs on device-resident buffers, on ``stream`` (the default
        stream when None).  The caller owns the plan and releases it.  Raises the compiler's
        error for a graph :meth:`device_route` rejects."""
    def report(self) -> dict[str, Any]:
        """This framework's part of the run report (JSON-serialisable)."""


class FrameworkBase:
    """Shared framework policy; a vendor subclass sets ``vendor`` and ``facts``."""

    seam = "framework"
    vendor = "base"
    facts: dict[str, Any] = {}
    #: shape-only mode (set at compose time): feeds and outputs are MetaArray, nothing computes
    meta = False
    #: the collective handler of the run in progress (see :meth:`run`)
    _collective: CollectiveHandler | None = None
    #: resident plans capture their runtime calls and replay them (:mod:`.launch_capture`);
    #: a stack composed with replay off (``--no-replay``, ``replay = false``) switches it off
    capture_plans = True

    def __init__(self, compiler: Compiler, library: Library, runtime: Runtime, target: Target):
        f = self.facts["framework"]
        #: the PyTorch face (device properties, versions, autocast, ATen routes), checked once
        self.torch_face: TorchFace = parse_torch_face(f, f["device_type"], self.vendor)
        versions = dict(self.torch_face.versions)
        version = versions.get(f["version_field"])
        if version is None:
            raise ConfigError(f"vendor.toml [framework]: version_field {f['version_field']!r} is not "
                              "set in [framework.versions]", seam="framework", vendor=self.vendor)
        self.face = Face(f["device_type"], f["module"], f["version_field"], version,
                         f["dist_backend"], f["pjrt_plugin"], f.get("rng", ""), self.torch_face.versions,
                         f.get("pjrt_platform", f["pjrt_plugin"]))
        cov = f["coverage"]
        self.decomposed = frozenset(cov.get("decomposed", ()))
        #: op -> why the family runs it on the CPU on purpose (``[framework.coverage.fallback]``)
        self.cpu_ops: dict[str, str] = dict(cov.get("fallback", {}))
        # every op the compiler can generate, unless the family lists an allow-list (``native``,
        # for a family bringing ops up one at a time) or names the op as an exception
        listed = cov.get("native")
        self.native = ((frozenset(listed) if listed is not None else frozenset(OPS))
                       - self.decomposed - frozenset(self.cpu_ops))
        self.compiler = compiler
        self.library = library
        self.runtime = runtime
        self.target = target
        self.counts = {"graphs_run": 0, "ops_captured": 0, "native": 0, "decomposed": 0,
                       "fallback": 0, "device_segments": 0}
        self.fallbacks: list[Fallback] = []

    def route(self, op: str) -> Route:
        if op in self.decomposed and OPS[op].decompose is not None:
            return Route(op, "decomposed", f"{self.vendor} decomposes {op} before compiling")
        if op in self.native:
            return Route(op, "native", f"{self.vendor} compiles {op} on the device")
        if op in self.cpu_ops:
            return Route(op, "fallback", f"{self.vendor} runs {op} on the CPU: {self.cpu_ops[op]}")
        return Route(op, "fallback", f"no {self.vendor} device kernel for {op}; runs on the CPU")

    # -- the PyTorch face ([framework.torch] in vendor.toml; policy in layers/face.py) ---------
    def torch_route(self, op: str | OpOverloadLike) -> Route | None:
        """How this family treats ATen ``op`` (an overload name such as ``aten::_softmax`` /
        ``aten::mean.dim``, or a torch OpOverload) before it reaches a device kernel:
        ``decomposed`` (always lowered with PyTorch's decomposition first), ``fallback`` (run
        on the CPU on purpose, with the family's reason), or None (no family rule).  Overloads
        are matched exactly: ``aten::mean.dim`` is not ``aten::mean``."""
        name = aten_name(op)
        tf = self.torch_face
        if name in tf.decompose:
            return Route(f"aten::{name}", "decomposed",
                         f"{self.vendor} decomposes aten::{name} with PyTorch's decomposition")
        if name in tf.fallback:
            return Route(f"aten::{name}", "fallback", f"{self.vendor} runs aten::{name} on the CPU: "
                         f"{tf.fallback[name]}")
        return None

    def device_properties(self, driver: Driver, index: int = 0) -> dict[str, Any]:
        """What ``torch.<module>.get_device_properties(index)`` shows for this family, in its
        vocabulary (``_CudaDeviceProperties``-like, ``_XpuDeviceProperties``-like), built from
        ``driver.properties(index)`` and the chip spec."""
        return device_properties(self.torch_face, driver, index, self.vendor)

    def versions(self) -> dict[str, str | None]:
        """The ``torch.version`` accelerator fields as this family's PyTorch build sets them
        (rocm-like: ``cuda`` None, ``hip`` set, as ROCm PyTorch does)."""
        return dict(self.face.versions)

    def autocast_policy(self) -> AutocastPolicy:
        """What ``torch.autocast(device_type)`` does on this family."""
        return self.torch_face.autocast

    # -- running ------------------------------------------------------------------------------
    def _check_feeds(self, graph: Graph,
                     feeds: Mapping[str, ArrayLike | MetaArray]) -> dict[str, HostValue]:
        out: dict[str, HostValue] = {}
        names = {v.name for v in graph.inputs}
        extra = sorted(set(feeds) - names)
        if extra:
            raise InvalidArgumentError(f"unknown input(s) {', '.join(extra)}; graph "
                                       f"{graph.name!r} takes {', '.join(sorted(names))}",
                                       seam="framework", vendor=self.vendor)
        for v in graph.inputs:
            if v.name not in feeds:
                raise InvalidArgumentError(f"missing input {v.name!r} ({v.type})", seam="framework",
                                           vendor=self.vendor)
            given = feeds[v.name]
            arr: HostValue = (given if self.meta and isinstance(given, MetaArray)
                              else np.asarray(given))
            if tuple(arr.shape) != v.shape or arr.dtype != v.dtype.numpy:
                raise InvalidArgumentError(
                    f"input {v.name!r} must be {v.type}, got {arr.dtype}[{','.join(map(str, arr.shape))}]",
                    seam="framework", vendor=self.vendor)
            if isinstance(arr, MetaArray):
                out[v.name] = arr
            elif self.meta:
                out[v.name] = MetaArray(arr.shape, arr.dtype)      # only its shape travels
            else:
                out[v.name] = _c_order(arr)
        return out

    def run(self, graph: Graph, feeds: Mapping[str, ArrayLike | MetaArray],
            collective: CollectiveHandler | None = None) -> RunResult:
        """Run ``graph``; ``collective`` enqueues the communication of any ``all_reduce``
        over more than one rank (the caller owns the other ranks and the fabric)."""
        t0 = time.perf_counter()
        self._collective = collective
        graph.verify()
        checked = self._check_feeds(graph, feeds)
        routes = [self.route(n.op) for n in graph.nodes]
        # ops the compiler says up front it cannot lower run on the CPU, with its reason
        ask = getattr(self.compiler, "unsupported", None)
        cannot = ask(graph, self.library.ops() if self.library is not None else frozenset()) if ask else {}
        routes = [Route(r.op, "fallback", f"{self.vendor} compiler cannot lower {r.op}: {cannot[r.op]}; "
                  "runs on the CPU") if r.kind != "fallback" and r.op in cannot else r for r in routes]
        self.counts["graphs_run"] += 1
        self.counts["ops_captured"] += len(graph.nodes)
        for r in routes:
            self.counts[r.kind] += 1
        env: dict[int, HostValue] = {id(v): checked[v.name] for v in graph.inputs}
        for v in graph.constants:
            env[id(v)] = MetaArray.like(v) if self.meta else _c_order(v.const)
        plans: list[CompiledGraph] = []
        fallbacks: list[Fallback] = []
        segment: list[Node] = []
        for node, route in zip(graph.nodes, routes):
            if route.kind == "fallback":
                if segment:
                    plans.append(self._run_segment(graph, segment, env, len(plans)))
                    segment = []
                self._run_on_host(node, env)
                fb = {"op": node.op, "node": node.outputs[0].name, "reason": route.reason}
                fallbacks.append(fb)
                self.fallbacks.append(fb)
            else:
                segment.append(node)
        if segment:
            plans.append(self._run_segment(graph, segment, env, len(plans)))
        outputs = [env[id(v)] for v in graph.outputs]
        return RunResult(outputs, routes, fallbacks, plans, time.perf_counter() - t0)

    def _run_on_host(self, node: Node, env: dict[int, HostValue]) -> None:
        if self.meta:                      # shape-only: a host op produces a shape, nothing more
            env[id(node.outputs[0])] = MetaArray.like(node.outputs[0])
            return
        data = [cast("NDArray[Any]", env[id(v)]) for v in node.inputs]   # not meta: every value is data
        args = [a.astype(np.float64) if v.dtype.is_float else a for a, v in zip(data, node.inputs)]
        with np.errstate(all="ignore"):
            res = OPS[node.op].reference(*args, **node.attrs)
        out = node.outputs[0]
        env[id(out)] = _c_order(np.asarray(res).astype(out.dtype.numpy))

    def _segment_graph(self, graph: Graph, nodes: list[Node],
                       index: int) -> tuple[Graph, list[Value], list[Value]]:
        produced = {id(n.outputs[0]) for n in nodes}
        later_uses: set[int] = set()
        after = False
        members = {id(n) for n in nodes}
        for n in graph.nodes:
            if id(n) in members:
                after = True
                continue
            if after:
                later_uses.update(id(v) for v in n.inputs)
        later_uses.update(id(v) for v in graph.outputs)
        # the name is part of the compile-cache key: it must be the same on every run
        sub = Graph(f"{graph.name}_seg{index}" if index else graph.name)
        mapping: dict[int, Value] = {}
        ext: list[Value] = []
        consts = {id(v) for v in graph.constants}
        for n in nodes:
            for v in n.inputs:
                if id(v) in produced or id(v) in mapping:
                    continue
                if id(v) in consts:
                    mapping[id(v)] = sub.constant(v.const, v.name)
                else:
                    mapping[id(v)] = sub.input(v.name, v.shape, v.dtype)
                    ext.append(v)
        for n in nodes:
            res = sub.op(n.op, *(mapping[id(v)] for v in n.inputs), **n.attrs)
            sub.rename(res, n.outputs[0].name, strict=False)   # buffers keep the graph's names
            mapping[id(n.outputs[0])] = res
        outs = [n.outputs[0] for n in nodes if id(n.outputs[0]) in later_uses]
        sub.output(*(mapping[id(v)] for v in outs))
        if self.decomposed:
            sub = decompose(sub, keep=frozenset(op for op in OPS if op not in self.decomposed))
        return sub, ext, outs

    def _run_segment(self, graph: Graph, nodes: list[Node], env: dict[int, HostValue],
                     index: int) -> CompiledGraph:
        sub, ext, outs = self._segment_graph(graph, nodes, index)
        self.counts["device_segments"] += 1
        routines = self.library.ops() if self.library is not None else frozenset()
        plan = self.compiler.compile(sub, self.target, routines)
        results = execute_plan(plan, [env[id(v)] for v in ext], self.runtime, self.library,
                               meta=self.meta, collective=self._collective)
        for v, arr in zip(outs, results):
            env[id(v)] = arr
        return plan

    def device_route(self, graph: Graph) -> Route | None:
        """Why ``graph`` cannot run on the device as one compiled piece (the first op that
        falls back), or None when it can."""
        for node in graph.nodes:
            r = self.route(node.op)
            if r.kind == "fallback":
                return r
        ask = getattr(self.compiler, "unsupported", None)
        cannot = ask(graph, self.library.ops() if self.library is not None else frozenset()) if ask else {}
        for node in graph.nodes:
            if node.op in cannot:
                return Route(node.op, "fallback", f"{self.vendor} compiler cannot lower {node.op}: "
                             f"{cannot[node.op]}; runs on the CPU")
        return None

    def prepare(self, graph: Graph, stream: Stream | None = None) -> ResidentPlan:
        """Compile ``graph`` whole (after the family's decompositions) into a plan bound to
        this stack's runtime, run on device-resident buffers: a front end's eager ops and
        compiled graphs whose inputs already live on the device.  Plan inputs and outputs
        follow ``graph.inputs`` and ``graph.outputs``.  Check :meth:`device_route` first."""
        graph.verify()
        self.counts["resident_plans"] = self.counts.get("resident_plans", 0) + 1
        sub = graph
        if self.decomposed:
            sub = decompose(graph, keep=frozenset(op for op in OPS if op not in self.decomposed))
        routines = self.library.ops() if self.library is not None else frozenset()
        plan = self.compiler.compile(sub, self.target, routines)
        return ResidentPlan(plan, self.runtime, self.library, stream, capture=self.capture_plans,
                            counts=self.counts)

    def report(self) -> dict[str, Any]:
        f = self.face
        return {"vendor": self.vendor, "device_type": f.device_type, "module": f.module,
                f"version.{f.version_field}": f.version, "dist_backend": f.dist_backend,
                "pjrt_plugin": f.pjrt_plugin, "pjrt_platform": f.pjrt_platform, "versions": dict(f.versions), "rng": f.rng,
                "autocast_dtype": self.torch_face.autocast.default_dtype,
                **self.counts, "fallbacks": list(self.fallbacks)}


def _switches(library: Library | None) -> tuple[Any, ...]:
    """The library switches a plan's runtime calls depend on besides shapes (a capture made
    under other switches is not replayed)."""
    if library is None:
        return ()
    return tuple(getattr(library, name, None)
                 for name in ("autotune", "deterministic", "workspace_limit", "tf32_mode"))


def _lifetimes(plan: CompiledGraph) -> tuple[dict[int, int], dict[int, int]]:
    """First and last step that touches each buffer (plan inputs and constants live throughout)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, step in enumerate(plan.steps):
        bids = step.args.values() if isinstance(step, KernelStep) else step.buffers.values()
        for bid in bids:
            first.setdefault(bid, i)
            last[bid] = i
    return first, last


def _releases(plan: CompiledGraph, placed: set[int]) -> dict[int, list[int]]:
    """Step index -> the buffers released after it (a memory-plan slot as ``-1 - slot``), for
    a call whose caller placed the buffers in ``placed``."""
    _, last = _lifetimes(plan)
    mem = plan.memory
    slot_of = mem.slots if mem is not None else {}
    release: dict[int, list[int]] = {}
    for bid, i in last.items():
        if bid not in placed and bid not in slot_of:
            release.setdefault(i, []).append(bid)
    for n, (_, end) in enumerate(mem.slot_span if mem is not None else ()):
        release.setdefault(end, []).append(-1 - n)         # a slot: negative key
    return release


def _run_steps(plan: CompiledGraph, ptrs: dict[int, int], runtime: Runtime, library: Library | None,
               module: Module | None, stream: Stream | None,
               collective: CollectiveHandler | None = None,
               keep: frozenset[int] = frozenset(), resident: bool = False,
               release: dict[int, list[int]] | None = None) -> dict[int, int]:
    """Launch a plan's steps in order on ``stream``.

    ``ptrs`` holds the device address of every buffer the caller placed (inputs, constants,
    outputs); every other buffer is allocated just before the first step that touches it
    and freed after the last one, so the peak is what is live at once.  Temporaries the
    compiler's memory plan (``plan.memory``) puts in one slot share one allocation.  The
    caller frees what it placed.  Buffers in ``keep`` that this call allocates are not
    released: they are returned (buffer id -> address) for the caller to read and free.
    On an error everything this call allocated is freed.  ``resident`` (a framework's
    eager path) takes temporaries from the runtime's stream-ordered caching allocator
    (``allocate``/``deallocate``: no device synchronisation) instead of ``malloc``/``free``.
    ``release``: :func:`_releases` of this call's placed buffers, when the caller keeps it."""
    malloc: Callable[[int], int]
    free: Callable[[int], None]
    if resident:
        malloc, free = (lambda n: runtime.allocate(n, stream)), runtime.deallocate
    else:
        malloc, free = runtime.malloc, runtime.free
    if release is None:
        release = _releases(plan, set(ptrs) | set(keep))
    mem = plan.memory
    slot_of = mem.slots if mem is not None else {}
    slot_bytes = mem.slot_bytes if mem is not None else ()
    slot_ptr: dict[int, int] = {}
    own: dict[int, int] = {}
    try:
        for i, step in enumerate(plan.steps):
            bids = step.args.values() if isinstance(step, KernelStep) else step.buffers.values()
            for bid in bids:
                if bid not in ptrs:
                    s = slot_of.get(bid)
                    if s is None:
                        ptrs[bid] = own[bid] = malloc(plan.buffers[bid].nbytes)
                    else:
                        if s not in slot_ptr:
                            slot_ptr[s] = malloc(slot_bytes[s])
                        ptrs[bid] = slot_ptr[s]
            if isinstance(step, KernelStep):
                if module is None:     # a plan with kernels always carries their binary
                    raise FornaxError(f"plan {plan.name!r} launches {step.entry} but has no binary",
                                      seam="framework", op=step.entry)
                args = {name: ptrs[bid] for name, bid in step.args.items()}
                runtime.launch(module, step.entry, step.grid, args, stream)
            elif isinstance(step, LibraryStep):
                if library is None:
                    raise FornaxError("the plan calls a library but the stack has none",
                                      seam="framework", op=step.routine)
                b = step.buffers
                if step.routine == "conv2d_fwd":
                    library.conv2d_fwd(ptrs[b["x"]], ptrs[b["w"]], ptrs[b["y"]], step.params, stream)
                elif step.routine == "attention_fwd":
                    library.attention_fwd(ptrs[b["q"]], ptrs[b["k"]], ptrs[b["v"]], ptrs[b["o"]],
                                          ptrs[b["lse"]], step.params, stream)
                else:
                    library.gemm(ptrs[b["a"]], ptrs[b["b"]], ptrs[b["c"]], step.params, stream)
            elif isinstance(step, CollectiveStep):
                if collective is None:
                    raise FornaxError(f"{step.routine} over {step.ranks} ranks needs the other ranks: "
                                      "this run was given no collective handler", seam="framework",
                                      op=step.routine,
                                      hint="run the graph through a multi-device scenario, or build "
                                           "it with ranks=1")
                collective(runtime, step, {role: ptrs[bid] for role, bid in step.buffers.items()})
            for bid in release.get(i, ()):
                if bid >= 0:
                    free(own.pop(bid))
                    del ptrs[bid]
                elif -1 - bid in slot_ptr:
                    ptr = slot_ptr.pop(-1 - bid)
                    for m in [m for m, p in ptrs.items() if p == ptr and slot_of.get(m) == -1 - bid]:
                        del ptrs[m]
                    free(ptr)
    except BaseException:
        for ptr in {*own.values(), *slot_ptr.values()}:      # a shared slot is freed once
            try:
                free(ptr)
            except FornaxError:
                pass
        raise
    kept = {bid: own.pop(bid) for bid in list(own) if bid in keep}
    for ptr in {*own.values(), *slot_ptr.values()}:          # left over: nothing released them
        free(ptr)
    return kept


def execute_plan(plan: CompiledGraph, inputs: list[HostValue], runtime: Runtime,
                 library: Library | None, meta: bool = False,
                 collective: CollectiveHandler | None = None) -> list[HostValue]:
    """Run a compiled launch plan from host arrays: upload, launch in order, download, free.

    Inputs and constants are allocated and uploaded first; the steps run as
    :func:`_run_steps` says (temporaries live only as long as they are used); plan
    outputs stay until they are downloaded.  In shape-only mode (``meta``) the same
    calls are made with :class:`MetaArray` descriptors.
    """
    ptrs: dict[int, int] = {}
    stream = runtime.default_stream()      # in order on every family (never an out-of-order queue)
    try:
        for bid in plan.inputs:
            ptrs[bid] = runtime.malloc(plan.buffers[bid].nbytes)
        for bid, buf in plan.buffers.items():
            if buf.role == "constant":
                ptrs[bid] = runtime.malloc(buf.nbytes)
        for bid, arr in zip(plan.inputs, inputs):
            runtime.memcpy_h2d(ptrs[bid], arr, stream)
        for bid, buf in plan.buffers.items():
            if buf.role == "constant":
                runtime.memcpy_h2d(ptrs[bid], MetaArray(buf.shape, buf.dtype.numpy) if meta
                                   else _c_order(buf.data), stream)
        module = runtime.load_module(plan.binary) if plan.binary is not None else None
        ptrs.update(_run_steps(plan, dict(ptrs), runtime, library, module, stream, collective,
                               keep=frozenset(plan.outputs)))
        results: list[HostValue] = []
        for bid in plan.outputs:
            buf = plan.buffers[bid]
            out: HostValue = (MetaArray(buf.shape, buf.dtype.numpy) if meta
                   else np.empty(buf.shape, dtype=buf.dtype.numpy))
            runtime.memcpy_d2h(out, ptrs[bid], stream, blocking=False)
            results.append(out)
        runtime.synchronize()
        return results
    finally:
        for ptr in set(ptrs.values()):
            try:
                runtime.free(ptr)
            except FornaxError:
                pass


class ResidentPlan:
    """A compiled plan bound to one runtime, run on buffers that already live on the device.

    This is the eager path of a framework: the module is loaded and the constants are
    uploaded once, then every call launches the steps with the caller's input and
    output addresses (no host transfer), on the caller's stream.  A plan output that
    is an input or a constant (or the same buffer as an earlier output) is copied
    device to device into the caller's output."""

    def __init__(self, plan: CompiledGraph, runtime: Runtime, library: Library | None,
                 stream: Stream | None = None, capture: bool = True,
                 counts: dict[str, Any] | None = None):
        self.plan, self.runtime, self.library = plan, runtime, library
        #: where the capture counts go (a framework's report counts)
        self.counts: dict[str, Any] = counts if counts is not None else {}
        #: how the last call ran: "live", "captured" or "replayed" (:mod:`.launch_capture`)
        self.last_run = "live"
        #: why this plan's runs are never captured (None: they are, from the second on)
        self.refused: str | None = None if capture else "replay is switched off"
        if self.refused is None:
            if any(isinstance(st, CollectiveStep) for st in plan.steps):
                self.refused = "a collective step: the other ranks take part in every run"
            elif any(isinstance(st, LibraryStep) and st.params.get("deterministic") is False
                     for st in plan.steps):
                self.refused = "a library call whose reduction order is drawn per call"
        #: (stream id, library switches) -> the stream and its capture, or None after a warm-up run
        self._captures: dict[tuple[Any, ...], tuple[Stream, LaunchCapture | None]] = {}
        self.module = runtime.load_module(plan.binary) if plan.binary is not None else None
        self.constants: dict[int, int] = {}
        stream = stream if stream is not None else runtime.default_stream()
        for bid, buf in plan.buffers.items():
            if buf.role == "constant":
                self.constants[bid] = runtime.malloc(buf.nbytes)
                runtime.memcpy_h2d(self.constants[bid], _c_order(buf.data), stream)
        self.in_shapes = [plan.buffers[b].shape for b in plan.inputs]
        self.out_nbytes = [plan.buffers[b].nbytes for b in plan.outputs]
        #: the byte sizes of a call's buffers: inputs, then outputs
        self._nbytes = [plan.buffers[b].nbytes for b in plan.inputs] + self.out_nbytes
        self._copy_out: list[bool] = []          # outputs that need a device-to-device copy after the steps
        seen = set(plan.inputs) | set(self.constants)
        for i, bid in enumerate(plan.outputs):
            self._copy_out.append(bid in seen)
            seen.add(bid)
        # the buffers a call places (inputs, constants, outputs not copied) are the same at
        # every call: so is the release schedule of the rest (:func:`_releases`)
        placed = set(plan.inputs) | set(self.constants) | \
            {bid for bid, copy in zip(plan.outputs, self._copy_out) if not copy}
        self._release = _releases(plan, placed)
        # one kernel over inputs, constants and outputs only (most eager ops): launch it
        # directly, no buffer bookkeeping
        #: (entry, grid, [(param, "c"|"i"|"o", constant buffer id or input/output index)])
        self._single: tuple[str, tuple[int, int, int], list[tuple[str, str, int]]] | None = None
        if len(plan.steps) == 1 and isinstance(plan.steps[0], KernelStep) and not any(self._copy_out):
            step = plan.steps[0]
            where: dict[int, tuple[str, int]] = {bid: ("c", bid) for bid in self.constants}
            where.update({bid: ("i", k) for k, bid in enumerate(plan.inputs)})
            where.update({bid: ("o", k) for k, bid in enumerate(plan.outputs)})
            if all(bid in where for bid in step.args.values()):
                self._single = (step.entry, step.grid,
                                [(name, *where[bid]) for name, bid in step.args.items()])

    def __call__(self, in_ptrs: list[int], out_ptrs: list[int], stream: Stream | None = None,
                 collective: CollectiveHandler | None = None) -> None:
        plan, runtime = self.plan, self.runtime
        if len(in_ptrs) != len(plan.inputs) or len(out_ptrs) != len(plan.outputs):
            raise InvalidArgumentError(
                f"plan {plan.name!r} takes {len(plan.inputs)} input(s) and {len(plan.outputs)} "
                f"output(s), got {len(in_ptrs)} and {len(out_ptrs)}", seam="framework")
        stream = stream if stream is not None else runtime.default_stream()
        if self._single is not None:
            entry, grid, binds = self._single
            if self.module is None:    # one kernel step: the plan has its binary
                raise FornaxError(f"plan {plan.name!r} launches {entry} but has no binary",
                                  seam="framework", op=entry)
            src = {"i": in_ptrs, "o": out_ptrs}
            args = {name: self.constants[k] if kind == "c" else src[kind][k] for name, kind, k in binds}
            runtime.launch(self.module, entry, grid, args, stream)
            self.last_run = "live"
            return
        if self.refused is not None or collective is not None:
            self.last_run = "live"
            self._live(runtime, in_ptrs, out_ptrs, stream, collective)
            return
        key = (id(stream), _switches(self.library))
        held = self._captures.get(key)
        if held is not None and held[0] is stream and held[1] is not None:
            if held[1].valid() and self._replay(held[1], [*in_ptrs, *out_ptrs]):
                return
            del self._captures[key]          # a device reset, or addresses that cannot be followed
            held = None
        if held is None or held[0] is not stream:
            if len(self._captures) >= 8:     # streams and switches that keep changing
                self._captures.clear()
            self._captures[key] = (stream, None)          # this run warms up: the next is captured
            self.last_run = "live"
            self._live(runtime, in_ptrs, out_ptrs, stream, collective)
            return
        self._capture(key, stream, in_ptrs, out_ptrs)

    def _live(self, runtime: Runtime, in_ptrs: list[int], out_ptrs: list[int], stream: Stream,
              collective: CollectiveHandler | None) -> None:
        plan = self.plan
        ptrs = dict(self.constants)
        ptrs.update(zip(plan.inputs, in_ptrs))
        for bid, ptr, copy in zip(plan.outputs, out_ptrs, self._copy_out):
            if not copy:
                ptrs[bid] = ptr
        _run_steps(plan, dict(ptrs), runtime, self.library, self.module, stream, collective,
                   resident=True, release=self._release)
        for bid, ptr, copy, nbytes in zip(plan.outputs, out_ptrs, self._copy_out, self.out_nbytes):
            if copy and nbytes:
                runtime.memcpy_d2d(ptr, ptrs[bid], nbytes, stream)

    def _capture(self, key: tuple[Any, ...], stream: Stream, in_ptrs: list[int],
                 out_ptrs: list[int]) -> None:
        """A live run whose runtime calls (the library's too) are recorded as they are made."""
        library = self.library
        if library is not None and getattr(library, "deterministic", True) is False:
            self.last_run = "live"           # split-K orders drawn per call: nothing to capture
            self._live(self.runtime, in_ptrs, out_ptrs, stream, None)
            return
        calls_log = getattr(library, "calls", None)
        tap = RuntimeTap(self.runtime, calls_log if isinstance(calls_log, list) else None)
        lib_runtime = getattr(library, "runtime", None)
        if lib_runtime is self.runtime:
            setattr(library, "runtime", tap)     # the library's launches are recorded too
        self.last_run = "captured"
        try:
            self._live(cast(Runtime, tap), in_ptrs, out_ptrs, stream, None)
        finally:
            if lib_runtime is self.runtime:
                setattr(library, "runtime", lib_runtime)
        if tap.refused is not None or (library is not None and lib_runtime is not self.runtime):
            self.refused = tap.refused or "the library runs on another runtime"
            self.counts["plan_captures_refused"] = self.counts.get("plan_captures_refused", 0) + 1
            self.last_run = "live"
            return
        self._captures[key] = (stream, LaunchCapture(tap.calls, tap.records(), [*in_ptrs, *out_ptrs]))
        self.counts["plans_captured"] = self.counts.get("plans_captured", 0) + 1

    def _replay(self, capture: LaunchCapture, buffers: list[int]) -> bool:
        """Replay ``capture`` on this call's buffers (inputs, then outputs); False (nothing
        done) where the captured addresses cannot be followed to this call's (buffers that
        overlap differently)."""
        places = None
        if capture.buffers != buffers:
            places = relocations(list(zip(capture.buffers, self._nbytes, buffers)))
            if places is None:
                return False
        calls_log = getattr(self.library, "calls", None)
        self.last_run = "replayed"
        try:
            capture.replay(self.runtime, calls_log if isinstance(calls_log, list) else None, places)
        except BaseException:
            self._captures.clear()
            raise
        self.counts["plan_runs_replayed"] = self.counts.get("plan_runs_replayed", 0) + 1
        return True

    def release(self) -> None:
        """Free the uploaded constants (the plan can no longer run)."""
        self._captures.clear()
        for ptr in self.constants.values():
            try:
                self.runtime.free(ptr)
            except FornaxError:
                pass
        self.constants = {}
