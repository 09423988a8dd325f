"""Compiling and running a MAX-style graph on a composed stack.

``InferenceSession(vendor=...)`` (or ``stack=``) composes or adopts a stack;
``session.load(graph)`` compiles the graph whole: its ops are cut at the custom ops into
segments, each segment becomes one graph-IR program that the stack's compiler compiles
(fusion, library routing and kernel choice are the compiler's) into a resident plan
(:meth:`~fornax.layers.framework.Framework.prepare`), and each custom op's kernel goes to
the library seam (:meth:`~fornax.layers.library.Library.custom_kernel`), which packs it in
the family's binary format.  ``model.execute(*arrays)`` uploads the inputs, runs the
segments and custom kernels in order on device buffers, and downloads the outputs.

This is where MAX places its hardware boundary: the vendor's code begins at the graph
compiler and the custom kernels; the framework never dispatches op by op.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...layers.errors import ConfigError, GraphError
from ...layers.framework import ResidentPlan
from ...layers.graph import Graph as IRGraph
from ...layers.graph import Value as IRValue
from ...stack import Stack, compose, make_config
from .graph import Graph, Node, TensorValue


@dataclass
class _Segment:
    """Consecutive graph-IR ops compiled as one program, or one custom op."""

    nodes: list[Node]
    inputs: list[TensorValue] = field(default_factory=list)     # values it reads from outside
    outputs: list[TensorValue] = field(default_factory=list)    # values read later (or graph outputs)
    plan: ResidentPlan | None = None

    @property
    def custom(self) -> bool:
        return self.nodes[0].custom is not None


class Model:
    """A loaded graph: its segments compiled, ready to execute."""

    def __init__(self, session: InferenceSession, graph: Graph):
        if not graph.outputs:
            raise GraphError(f"graph {graph.name!r} has no outputs: call output(...) while building it",
                             seam="framework")
        self.session, self.graph = session, graph
        t0 = time.perf_counter()
        self.segments = self._cut(graph)
        stack = session.stack
        runtime = stack.runtime
        self.stream = runtime.default_stream()
        for i, seg in enumerate(self.segments):
            if not seg.custom:
                ir = self._lower(seg, f"{graph.name}.{i}")
                route = stack.framework.device_route(ir)
                if route is not None:
                    raise ConfigError(f"graph {graph.name!r}: {route.op} cannot run on the device "
                                      f"({route.reason})", seam="framework", vendor=stack.framework.vendor)
                seg.plan = stack.framework.prepare(ir, self.stream)
        #: host seconds compile took (segments to plans)
        self.compile_s = time.perf_counter() - t0

    # -- cutting and lowering ------------------------------------------------------------------
    @staticmethod
    def _cut(graph: Graph) -> list[_Segment]:
        segments: list[_Segment] = []
        for node in graph.nodes:
            if node.custom is not None or not segments or segments[-1].custom:
                segments.append(_Segment([node]))
            else:
                segments[-1].nodes.append(node)
        # what each segment reads from outside and what later segments (or the graph) read of it
        later: set[int] = {v.id for v in graph.outputs}
        for seg in reversed(segments):
            made = {v.id for n in seg.nodes for v in n.outputs}
            seg.outputs = [v for n in seg.nodes for v in n.outputs if v.id in later and n.op != "constant"]
            seen: set[int] = set()
            for n in seg.nodes:
                for v in n.inputs:
                    if v.id not in made and v.id not in seen:
                        seen.add(v.id)
                        seg.inputs.append(v)
            later |= seen
        return segments

    @staticmethod
    def _lower(seg: _Segment, name: str) -> IRGraph:
        g = IRGraph(name)
        env: dict[int, IRValue] = {}
        for i, v in enumerate(seg.inputs):
            env[v.id] = g.input(f"in{i}", v.shape, v.dtype.ir)
        for n in seg.nodes:
            if n.op == "constant":
                env[n.outputs[0].id] = g.constant(n.const, "const")
            else:
                env[n.outputs[0].id] = g.op(n.op, *(env[v.id] for v in n.inputs), **n.attrs)
        if not seg.outputs:
            raise GraphError(f"graph segment {name} computes nothing that is used", seam="framework")
        g.output(*(env[v.id] for v in seg.outputs))
        return g

    # -- running -------------------------------------------------------------------------------
    def execute(self, *arrays: Any) -> list[np.ndarray]:
        """Run the graph on host ``arrays`` (one per graph input, of its type); the outputs as
        host arrays."""
        graph, runtime = self.graph, self.session.stack.runtime
        if len(arrays) != len(graph.inputs):
            raise ConfigError(f"graph {graph.name!r} takes {len(graph.inputs)} input(s), got {len(arrays)}",
                              seam="framework")
        bufs: dict[int, int] = {}
        owned: list[int] = []

        def alloc(v: TensorValue) -> int:
            ptr = runtime.malloc(max(1, int(np.prod(v.shape)) * v.dtype.ir.numpy.itemsize), self.stream)
            owned.append(ptr)
            bufs[v.id] = ptr
            return ptr
        try:
            for v, a in zip(graph.inputs, arrays):
                arr = np.ascontiguousarray(np.asarray(a), dtype=v.dtype.ir.numpy)
                if arr.shape != v.shape:
                    raise ConfigError(f"graph {graph.name!r}: an input of shape {arr.shape} where the graph "
                                      f"takes {v.shape}", seam="framework")
                runtime.memcpy_h2d(alloc(v), arr, self.stream)
            for seg in self.segments:
                ins = [bufs[v.id] for v in seg.inputs]
                outs = [alloc(v) for v in seg.outputs]
                if seg.plan is not None:
                    seg.plan(ins, outs, self.stream)
                    continue
                node = seg.nodes[0]
                assert node.custom is not None
                program, grid = node.custom.kernel([v.type for v in node.inputs])
                ptrs = [p.name for p in program.params if p.kind == "ptr"]
                if len(ptrs) != len(node.inputs) + len(node.outputs):
                    raise GraphError(f"custom op {node.custom.name!r}: its kernel has {len(ptrs)} pointer "
                                     f"parameters, the op {len(node.inputs)} inputs and "
                                     f"{len(node.outputs)} outputs", seam="framework",
                                     hint="declare one pointer parameter per input, then per output")
                outs = [bufs[v.id] if v.id in bufs else alloc(v) for v in node.outputs]
                args = dict(zip(ptrs, [bufs[v.id] for v in node.inputs] + outs))
                self.session.stack.library.custom_kernel(program, grid, args, self.stream)
            results = []
            for v in graph.outputs:
                out = np.empty(v.shape, dtype=v.dtype.ir.numpy)
                runtime.memcpy_d2h(out, bufs[v.id], self.stream)
                results.append(out)
            runtime.stream_synchronize(self.stream)
            return results
        finally:
            for ptr in owned:
                runtime.free(ptr)

    def report(self) -> dict[str, Any]:
        """Where the boundary put the work: graph ops, segments compiled, custom ops."""
        return {"graph": self.graph.name,
                "graph_ops": sum(1 for n in self.graph.nodes if n.op != "constant" and n.custom is None),
                "constants": sum(1 for n in self.graph.nodes if n.op == "constant"),
                "custom_ops": [n.custom.name for n in self.graph.nodes if n.custom is not None],
                "segments": sum(1 for s in self.segments if not s.custom),
                "compile_s": self.compile_s}


class InferenceSession:
    """A composed stack that loads and runs MAX-style graphs (``max.engine.InferenceSession``)."""

    def __init__(self, vendor: str | None = None, *, stack: Stack | None = None, spec: str | None = None):
        if stack is None:
            if vendor is None:
                raise ConfigError("InferenceSession needs a vendor or a stack",
                                  hint="e.g. InferenceSession(vendor='rocm-like')")
            stack = compose(make_config(vendor, spec=spec))
        if stack.config.meta:
            raise ConfigError("a MAX-style graph computes real values; a shape-only stack cannot run it",
                              hint="compose the stack with meta = false")
        self.stack = stack

    def load(self, graph: Graph) -> Model:
        """Compile ``graph`` for this session's stack."""
        return Model(self, graph)
