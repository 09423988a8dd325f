"""The PyTorch graph path: ``torch.compile(model, backend="fornax")`` and ``export``
(:func:`.exported.export`).

Both paths end in an FX graph of core ATen ops and lower it node by node with
:mod:`.lowering` into fornax graph IR, compiled by the active stack's compiler seam:

* **torch.compile** — the Dynamo backend :func:`fornax_backend` (registered as
  ``"fornax"`` by :func:`register_backend`) hands Dynamo's graph to AOTAutograd with
  :func:`decompositions` (PyTorch's core ATen table); the forward, backward and
  inference graphs it produces (functionalized: views are functional ops here) are each
  lowered into a :class:`Program`.
* **torch.export** — :func:`.exported.export` runs ``torch.export.export`` and
  ``run_decompositions`` with the same table and lowers the result; the returned
  :class:`.exported.Exported` is called like the module (parameters and buffers are fed from the
  exported program's state dict) and shows its fornax graph (``.graph``).

How a :class:`Program` runs:

* on CPU tensors, every fornax graph goes through ``framework.run`` (host arrays in and
  out; graph ops the family cannot run are counted CPU fallbacks of the framework seam);
* on ``fornax`` tensors, through ``framework.prepare`` (compiled once per stack) and
  the resident plan launched on the tensors' device addresses (non-contiguous inputs are
  gathered first), outputs allocated on the device.  When ``framework.device_route``
  says a graph op must fall back, that graph takes the CPU route instead (counted, with
  the reason) — the program never fails for want of a device kernel.

**Splitting.**  An FX node without a lowering (:class:`~.lowering.NotLowerable`: an op
missing from the table, a dtype without a graph dtype, random numbers, data-dependent
shapes, a zero-element operand) does not stop the compile: the graph is split around
it and the node runs with PyTorch on the CPU (operands copied to the host and results
back when the program runs on ``fornax`` tensors; seeded random ops draw from the CPU
generator, so ``torch.manual_seed`` reproduces eager) — but a library's custom operator
with a device-generic body runs eagerly on the device (:mod:`.fx_rewrites`).  Every
lowered node goes into the earliest piece its inputs allow, so only nodes that depend
on a torch-run result land after it.  A piece the compiler seam refuses runs its FX
nodes with PyTorch on the CPU the same way.  ``_assert_tensor_metadata`` nodes (left
by ``torch.export``) are dropped: static graph types guarantee what they assert.

**The SDPA trap.**  PyTorch's core ATen table decomposes the CPU flash-attention op
``_scaled_dot_product_flash_attention_for_cpu`` into the math form, but the second
output of that decomposition is the attention probabilities, not the log-sum-exp its
fused backward (``..._for_cpu_backward``, which autograd has already recorded)
consumes: ``scaled_dot_product_attention`` (and ``nn.MultiheadAttention``, which
Dynamo does not inline) would get silently wrong gradients.  :func:`decompositions`
leaves the forward and backward pair out of the table, so both reach the lowering
whole and consistent: the forward as the graph's ``attention`` op plus the real
log-sum-exp, the backward recomputed from it (and where either cannot be lowered,
both run with PyTorch on the CPU).

**Shapes are static.**  A graph with symbolic sizes (``torch.compile(dynamic=True)``, or
the automatic-dynamic recompile PyTorch does after a shape changes) is not lowered: it
runs eagerly (Dynamo's graph with torch, op by op on the eager device for ``fornax``
tensors), counted as a fallback with the reason.  ``torch.compile(..., dynamic=False)``
compiles every shape it sees.

**Accounting** (``fornax.frameworks.torch.report()``), in the session's op table:

* ``graph:<aten overload>`` — once per FX node compiled: ``native`` (lowered into a
  fornax graph) or ``fallback`` (runs with PyTorch on the CPU; the reason says why);
* ``graph run:<graph name>`` — every run of a fornax graph: ``native`` (on CPU tensors
  through ``framework.run``, on ``fornax`` tensors as a resident plan) or ``fallback``
  (the host route, or PyTorch, with the reason); graphs are named ``forward<n>``,
  ``backward<n>``, ``inference<n>``, ``export_<module><n>`` (``_seg<k>`` for later pieces),
  and ``dynamo<n>`` for a graph run eagerly because of symbolic shapes;
* ``graph op:<fornax op>`` — graph ops the framework seam ran on the host inside a
  ``framework.run`` (the family's own CPU fallbacks, with its reason).

**Dynamo and the device's Python kernels.**  :func:`skip_fornax_frames` puts fornax's
machinery on Dynamo's skip list; without it a graph break on ``fornax`` tensors makes
Dynamo trace the eager kernels and the simulator as user code.

Honest limits: outputs never alias inputs (an output that is a view of an input is a
copy with the view's sizes and strides; AOTAutograd regenerates real aliases of inputs
itself); a zero-element tensor feeding an op sends that op to PyTorch (but ``cat`` drops
empty pieces, and ``empty*`` lower as zeros: :mod:`.fx_rewrites`); exported programs run
without autograd, and buffers an exported program mutates (BatchNorm in training) are
updated in the :class:`Exported`'s own copy of the state dict, not in the module; graphs
whose inputs are ``torch.Generator`` s, opaque objects or effect tokens are not supported
by :func:`.exported.export`.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import re
import threading
import weakref
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import torch
import torch.fx
from torch.fx.node import map_aggregate
import torch.utils._pytree as pytree
from torch.utils._pytree import tree_map

from ...layers.errors import (BinaryError, CompileError, FornaxError, GraphError, InvalidArgumentError,
                              NotSupportedError)
from ...layers.graph import Graph, Value
from . import hazards
from . import tensors as T
from .eager import materialize
from .fx_rewrites import eager_on_device, rewrite
from .lowering import (DTYPE_TO_TORCH, TORCH_TO_DTYPE, LowerCtx, NotLowerable, OutMeta, lower,
                       op_key)
from .dynamo_skip import skip_fornax_frames
from .session import Session, current
from .streams import current_runtime_stream

BACKEND = "fornax"
#: what the stack says when it cannot compile a graph (device faults and OOM are not refusals)
_REFUSALS = (GraphError, CompileError, BinaryError, NotSupportedError)
aten = torch.ops.aten
_ids = itertools.count()
_ids_lock = threading.Lock()

#: metadata assertions torch.export leaves in graphs: the lowered graph's static types (and the
#: input check of :meth:`Program.__call__`) guarantee what they check, so they are dropped
_METADATA_CHECKS = (aten._assert_tensor_metadata.default,)

#: left out of the core table: their decomposition breaks the fused backward (see module docstring)
_KEEP_FUSED = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward")


@functools.lru_cache(maxsize=1)
def _table() -> dict:
    from torch._decomp import core_aten_decompositions
    table = dict(core_aten_decompositions())
    for name in _KEEP_FUSED:
        packet = getattr(aten, name, None)
        if packet is not None:
            for ov in packet.overloads():
                table.pop(getattr(packet, ov), None)
    return table


def decompositions() -> dict:
    """PyTorch's core ATen decompositions, less the CPU flash-attention pair (a fresh dict)."""
    return dict(_table())


def _next_name(kind: str) -> str:
    with _ids_lock:
        return f"{kind}{next(_ids)}"


# ---------------------------------------------------------------------------------------------
# the Dynamo backend
def _symbolic(x) -> bool:
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(x, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in x.shape) or \
            any(isinstance(s, torch.SymInt) for s in x.stride())
    return False


_DYNAMIC_REASON = ("symbolic shapes (torch.compile with dynamic=True, or PyTorch's automatic-dynamic "
                   "recompile after a shape change): fornax graphs have static shapes, so this graph "
                   "runs eagerly; use torch.compile(..., dynamic=False) to compile every shape")


def _eager(gm: torch.fx.GraphModule, name: str, reason: str):
    def run(args):
        current().stats.record(f"graph run:{name}", "fallback", reason)
        return gm(*args)
    setattr(run, "_boxed_call", True)               # AOTAutograd passes the inputs as one list
    return run


def _saved_layouts(gm: torch.fx.GraphModule, user_outputs: int) -> frozenset[int]:
    """The flat outputs of AOTAutograd's forward graph ``gm`` that only its backward reads
    (saved activations: after the mutated inputs, the ``user_outputs`` outputs of the traced
    module and the bases of its outputs that are views), which the program returns contiguous instead of in the layout eager
    PyTorch gave them, as Inductor does.  Their strides are reported to AOTAutograd
    (``TracingContext.output_strides``), which compiles the backward for them; a saved
    activation eager PyTorch laid out as a strided view (q, k and v split from one
    projection) then costs neither a strided copy here nor a gather in the backward."""
    ctx = torch._guards.TracingContext.try_get()
    meta = ctx.fw_metadata if ctx is not None else None
    reported = ctx.output_strides if ctx is not None else None
    out = [n for n in gm.graph.nodes if n.op == "output"]
    if meta is None or reported is None or not out or not isinstance(out[-1].args[0], (list, tuple)):
        return frozenset()
    flat = out[-1].args[0]
    # then the bases of outputs that are views of intermediates, which regenerate those
    # views at run time and keep their traced layout
    first = int(meta.num_mutated_inp_runtime_indices) + user_outputs + \
        int(getattr(meta, "num_intermediate_bases", 0))
    natural = []
    strides: list = []
    for i, n in enumerate(flat):
        val = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
        if i >= first and isinstance(val, torch.Tensor) and n.op != "placeholder" and \
                not val.is_contiguous():
            natural.append(i)
            strides.append(tuple(T.contiguous_strides(tuple(val.shape))))
        else:
            strides.append(None)                     # as traced
    reported.extend(strides)
    return frozenset(natural)


def _compiler(kind: str, user_outputs: int | None = None):
    def compile_fx(gm: torch.fx.GraphModule, example_inputs):
        name = _next_name(kind)
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if any(_symbolic(n.meta.get("val")) for n in phs) or any(_symbolic(x) for x in example_inputs):
            return _eager(gm, name, _DYNAMIC_REASON)
        natural = _saved_layouts(gm, user_outputs) if user_outputs is not None else frozenset()
        program = Program(gm, name, natural=natural)

        def run(args):
            return program(*args)
        setattr(run, "_boxed_call", True)
        setattr(run, "program", program)
        return run
    return compile_fx


def fornax_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The ``"fornax"`` Dynamo backend: AOTAutograd over core ATen, every forward / backward /
    inference graph lowered into fornax graphs (:class:`Program`)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    skip_fornax_frames()                  # also when the backend was found through an entry point
    if any(_symbolic(x) for x in example_inputs):
        name = _next_name("dynamo")

        def run(*args):
            current().stats.record(f"graph run:{name}", "fallback", _DYNAMIC_REASON)
            return gm.forward(*args)
        return run
    graph_out = [n for n in gm.graph.nodes if n.op == "output"]
    user_outputs = len(pytree.arg_tree_leaves(*graph_out[-1].args)) if graph_out else 0
    return aot_autograd(fw_compiler=_compiler("forward", user_outputs),
                        bw_compiler=_compiler("backward"),
                        inference_compiler=_compiler("inference"),
                        # as Inductor partitions: the backward recomputes what is cheap to
                        # recompute (a weight's transpose, an activation) instead of the forward
                        # saving it, so layout work folds into the backward's GEMMs
                        partition_fn=min_cut_rematerialization_partition,
                        decompositions=decompositions())(gm, example_inputs)


def register_backend() -> None:
    """Register :func:`fornax_backend` as Dynamo's ``"fornax"`` backend and skip fornax's
    frames in Dynamo (idempotent; imports ``torch._dynamo``)."""
    if BACKEND not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(compiler_fn=fornax_backend, name=BACKEND)
    skip_fornax_frames()


# ---------------------------------------------------------------------------------------------
# host arrays
def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _from_numpy(a, dtype: torch.dtype) -> torch.Tensor:
    a = np.array(a, copy=True, order="C")
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a).to(dtype)


def _cpu(x):
    if T.is_fornax(x):
        return T.read(x)
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, torch.device) and x.type == T.DEVICE:
        return torch.device("cpu")
    return x


def _dev(x):
    if isinstance(x, torch.Tensor) and not T.is_fornax(x):
        return T.to_device(x.detach())
    return x


def _safe(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]", "_", name) or "v"


def _node_name(node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return op_key(t)
    if isinstance(t, torch._ops.OpOverloadPacket):
        return f"{t._qualified_op_name}"
    return getattr(t, "__name__", str(t))


def _out_metas(node) -> list[OutMeta | None]:
    """torch's description of each tensor output of an FX node (from its FakeTensor)."""
    val = node.meta.get("val", node.meta.get("example_value"))
    if isinstance(val, torch.Tensor):
        return [OutMeta.of(val)]
    if isinstance(val, (tuple, list)):
        outs = []
        for v in val:
            if not isinstance(v, (torch.Tensor, int, float, bool)) and v is not None:
                raise NotLowerable(f"{_node_name(node)}: a nested or symbolic result")
            outs.append(OutMeta.of(v) if isinstance(v, torch.Tensor) else None)
        return outs
    raise NotLowerable(f"{_node_name(node)}: torch recorded no tensor result for it")


# ---------------------------------------------------------------------------------------------
# steps of a program
@dataclass
class _Segment:
    """A run of consecutive lowered FX nodes: one fornax graph."""

    g: Graph
    inputs: list = field(default_factory=list)          # FX nodes feeding graph.inputs, in order
    vals: dict = field(default_factory=dict)            # FX node -> Value | None | list
    members: list = field(default_factory=list)         # lowered FX nodes (getitems included), in order
    consts: dict = field(default_factory=dict)          # LowerCtx's scalar-constant cache, shared
    outputs: list = field(default_factory=list)         # FX node per graph output
    passthrough: list = field(default_factory=list)     # (FX node, FX input node | ndarray)
    empties: list = field(default_factory=list)         # (FX node, OutMeta | None): zero-element results
    plans: dict = field(default_factory=dict)           # session id -> ResidentPlan | reason
    out_index: dict = field(default_factory=dict)       # FX node in outputs -> its graph output position
    refused: str = ""                                   # why the stack cannot compile it (torch runs it)


@dataclass
class _TorchStep:
    node: torch.fx.Node
    reason: str | None      # None: runs where its operands are (getitem, a library's op), not counted


class Program:
    """An FX graph of core ATen ops lowered into fornax graphs (a :class:`Graph` per piece
    between nodes that run with PyTorch).  Call it with the FX graph's inputs, as a list."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, session: Session | None = None,
                 natural: frozenset[int] = frozenset()):
        self.gm = gm
        self.name = name
        self.session = session or current()
        #: positions of the flat outputs only a backward graph reads (AOTAutograd's saved
        #: activations): they keep the layout the program computes them in (contiguous), not
        #: the eager layout the trace recorded, as Inductor's are (see :func:`_saved_layouts`)
        self.natural = natural
        nodes = list(gm.graph.nodes)
        self.placeholders = [n for n in nodes if n.op == "placeholder"]
        self.attrs = {n: _get_attr(gm, n.target) for n in nodes if n.op == "get_attr"}
        out = [n for n in nodes if n.op == "output"]
        self.output_node = out[-1] if out else None
        #: the device the graph was traced on; outputs there follow the inputs' device
        self.traced_on = T.DEVICE if any(isinstance(n.meta.get("val"), torch.Tensor) and
                                         n.meta["val"].device.type == T.DEVICE for n in self.placeholders) else "cpu"
        self.position = {n: i for i, n in enumerate(nodes)}
        self.steps: list = []
        self._lower(nodes)
        self._finalizer = weakref.finalize(self, _release, [s for s in self.steps if isinstance(s, _Segment)])
        self._finalizer.atexit = False     # at exit nothing waits on the simulated device

    # -- lowering ------------------------------------------------------------------------------
    def _lower(self, nodes) -> None:
        """Lower every node, each into the earliest piece its inputs allow: a lowered node
        goes into stage ``k``, the max over its inputs of their stage (lowered inputs) or
        their stage + 1 (inputs computed by torch); a node torch runs goes after the
        piece of the latest stage it reads.  The program runs piece 0, the torch nodes
        of stage 0, piece 1, ...: nodes independent of a torch node are never split off
        by it."""
        stats = self.session.stats
        stage: dict = {}
        lowered: set = set()
        segs: dict[int, _Segment] = {}
        torch_steps: dict[int, list] = {}
        for node in nodes:
            if node.op in ("placeholder", "get_attr", "output") or node in lowered:
                continue
            deps = [d for d in node.all_input_nodes if d in stage]
            after = max((stage[d] for d in deps), default=0)
            if node.target in _METADATA_CHECKS:
                continue                              # static graph types already guarantee it
            name = _node_name(node)
            if node.op == "call_function" and node.target is operator.getitem:
                stage[node] = after                   # an item of a tuple torch computed
                torch_steps.setdefault(after, []).append(_TorchStep(node, None))
                continue
            k = max((stage[d] + (d not in lowered) for d in deps), default=0)
            try:
                if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
                    raise NotLowerable(f"{name}: not an ATen operator ({node.op})")
                if k not in segs:
                    segs[k] = _Segment(Graph(f"{self.name}_seg{k}" if k else self.name))
                for m in self._lower_node(segs[k], node):
                    stage[m] = k
                    lowered.add(m)
                stats.record(f"graph:{name}", "native")
            except NotLowerable as exc:
                local, reason = eager_on_device(node), str(exc)     # local: runs on the operands' device
                stats.record(f"graph:{name}", *(("decomposed", local) if local else
                                                ("fallback", f"{reason}; runs with PyTorch on the CPU")))
                stage[node] = after
                torch_steps.setdefault(after, []).append(_TorchStep(node, None if local else reason))
        for k in sorted(set(segs) | set(torch_steps)):
            if k in segs and self._close(segs[k]):
                self.steps.append(segs[k])
            self.steps.extend(torch_steps.get(k, ()))

    def _value(self, seg: _Segment, n, added: list) -> Value:
        """The Value of FX node ``n`` inside ``seg`` (a new graph input or constant if ``n``
        comes from outside)."""
        if n in seg.vals:
            v = seg.vals[n]
            if v is None:
                raise NotLowerable(f"%{n.name} has no elements (fornax graphs have no empty tensors)")
            if isinstance(v, list):
                raise NotLowerable(f"%{n.name} is a tuple of tensors used whole")
            return v
        val = n.meta.get("val")
        if n.op == "get_attr":
            val = self.attrs[n]
        if not isinstance(val, torch.Tensor):
            raise NotLowerable(f"%{n.name} is not a tensor ({type(val).__name__})")
        if val.numel() == 0:
            raise NotLowerable(f"%{n.name} has no elements (fornax graphs have no empty tensors)")
        if val.dtype not in TORCH_TO_DTYPE:
            raise NotLowerable(f"%{n.name}: {str(val.dtype).removeprefix('torch.')} has no fornax dtype")
        if n.op == "get_attr":
            v = seg.g.constant(_to_numpy(_cpu(val)), _safe(n.name))
        else:
            v = seg.g.input(_safe(n.name), tuple(val.shape), TORCH_TO_DTYPE[val.dtype])
            seg.inputs.append(n)
        seg.vals[n] = v
        added.append(n)
        return v

    def _lower_node(self, seg: _Segment, node) -> list:
        """Lower ``node`` into ``seg``; returns the FX nodes now computed there (``node`` and
        the getitems of a tuple result).  On failure the segment is left as it was."""
        g = seg.g
        mark = (len(g.nodes), len(g.inputs), len(g.constants), len(seg.inputs), dict(seg.consts))
        added: list = []
        try:
            def conv(a):
                return self._value(seg, a, added) if isinstance(a, torch.fx.Node) else a
            outs = _out_metas(node)
            if outs and all(o is not None and math.prod(o.shape) == 0 for o in outs):
                res: list[Value | None] = [None] * len(outs)      # nothing to compute: every result is empty
            else:
                target, args, kwargs = rewrite(node)       # empties as zeros, no empty cat pieces
                ctx = LowerCtx(g, outs, seg.consts)
                res = lower(ctx, target, tuple(map_aggregate(args, conv)), dict(map_aggregate(kwargs, conv)))
            multi = not isinstance(node.meta.get("val"), torch.Tensor)
            if multi and any(u.op != "call_function" or u.target is not operator.getitem for u in node.users):
                raise NotLowerable(f"{_node_name(node)}: its tuple result is used whole")
        except Exception as exc:
            del g.nodes[mark[0]:], g.inputs[mark[1]:], g.constants[mark[2]:], seg.inputs[mark[3]:]
            seg.consts.clear()
            seg.consts.update(mark[4])
            for n in added:
                seg.vals.pop(n, None)
            if isinstance(exc, NotLowerable):
                raise
            raise NotLowerable(f"{_node_name(node)}: the lowering failed ({type(exc).__name__}: {exc})") from exc
        seg.members.append(node)
        if not multi:
            seg.vals[node] = res[0]
            return [node]
        seg.vals[node] = list(res)
        for u in node.users:
            seg.vals[u] = res[u.args[1]]
            seg.members.append(u)
        return [node, *node.users]

    def _close(self, seg: _Segment) -> bool:
        """Finish a segment: its graph outputs are the values used outside it."""
        if not seg.members:
            return False
        members = set(seg.members)
        inputs = {id(v): n for n, v in seg.vals.items() if n in seg.inputs}
        consts = {id(v) for v in seg.g.constants}
        outs: dict[int, Value] = {}
        for m in seg.members:
            if all(u in members for u in m.users):
                continue
            v = seg.vals[m]
            if v is None:                       # zero elements (or a None torch returns)
                meta = m.meta.get("val")
                seg.empties.append((m, OutMeta.of(meta) if isinstance(meta, torch.Tensor) else None))
            elif isinstance(v, list):
                continue                        # only read through its getitems (members)
            elif id(v) in inputs:
                seg.passthrough.append((m, inputs[id(v)]))
            elif id(v) in consts:
                seg.passthrough.append((m, v.const))
            else:
                outs.setdefault(id(v), v)
                seg.outputs.append(m)
        order = list(outs.values())
        seg.out_index = {m: order.index(seg.vals[m]) for m in seg.outputs}
        if order:
            _prune(seg, order, self.position)
            seg.g.output(*order)
            try:
                seg.g.verify()
            except FornaxError as exc:           # a lowering bug: the pieces run with torch instead
                seg.refused = f"graph {seg.g.name} does not verify ({exc.message})"
        return True

    # -- what it built ---------------------------------------------------------------------------
    @property
    def graphs(self) -> list[Graph]:
        """The fornax graphs, in the order they run."""
        return [s.g for s in self.steps if isinstance(s, _Segment) and s.g.outputs]

    @property
    def graph(self) -> Graph | None:
        """The fornax graph when the FX graph lowered whole (else None: see :attr:`graphs`)."""
        gs = self.graphs
        return gs[0] if len(gs) == 1 and not self.fallbacks else None

    @property
    def fallbacks(self) -> list[dict]:
        """FX nodes that run with PyTorch on the CPU, with the reason."""
        out = []
        for s in self.steps:
            if isinstance(s, _TorchStep) and s.reason is not None:
                out.append({"op": _node_name(s.node), "node": s.node.name, "reason": s.reason})
            elif isinstance(s, _Segment) and s.refused:
                out.append({"op": f"graph {s.g.name}", "node": "", "reason": s.refused})
        return out

    def __str__(self) -> str:
        parts = []
        for s in self.steps:
            if isinstance(s, _Segment):
                if s.g.outputs:
                    parts.append(str(s.g))
            elif s.reason is not None:
                parts.append(f"# %{s.node.name} = {_node_name(s.node)} runs with PyTorch on the CPU: {s.reason}")
        return "\n".join(parts)

    # -- running ---------------------------------------------------------------------------------
    def __call__(self, *args):
        if len(args) != len(self.placeholders):
            raise InvalidArgumentError(f"program {self.name!r} takes {len(self.placeholders)} input(s), "
                                       f"got {len(args)}", seam="framework", op=self.name)
        for ph, a in zip(self.placeholders, args):
            want = ph.meta.get("val")
            if isinstance(want, torch.Tensor) and not _symbolic(want) and (
                    not isinstance(a, torch.Tensor) or tuple(a.shape) != tuple(want.shape) or a.dtype != want.dtype):
                got = f"{str(a.dtype).removeprefix('torch.')}{list(a.shape)}" if isinstance(a, torch.Tensor) \
                    else type(a).__name__
                raise InvalidArgumentError(
                    f"program {self.name!r}: input {ph.name!r} must be {str(want.dtype).removeprefix('torch.')}"
                    f"{list(want.shape)}, got {got}", seam="framework", op=self.name,
                    hint="fornax graphs have static shapes: export (or compile) again for other shapes")
        session = current()
        hazards.before_use(session, args)
        device = any(T.is_fornax(a) for a in args) or any(T.is_fornax(t) for t in self.attrs.values())
        env: dict = dict(zip(self.placeholders, args))
        env.update(self.attrs)
        with torch.no_grad(), session.lock:
            for step in self.steps:
                if isinstance(step, _Segment):
                    self._run_segment(session, step, env, device)
                else:
                    self._run_node(step, env, device)
            if self.output_node is None:
                return ()
            return self._outputs(self.output_node, env, args, device)

    def _outputs(self, output_node: torch.fx.Node, env: dict, args, device: bool):
        sources = {id(a) for a in args if isinstance(a, torch.Tensor)}
        sources |= {id(t) for t in self.attrs.values()}

        def out(n, natural: bool = False):
            if not isinstance(n, torch.fx.Node):
                return n
            t = env[n]
            if not isinstance(t, torch.Tensor) or n.op == "placeholder":
                return t
            meta = n.meta.get("val")
            if isinstance(meta, torch.Tensor) and meta.device.type != self.traced_on:
                # an explicit transfer in the program (x.cpu(), device="fornax"): where torch says
                if meta.device.type == "cpu" and T.is_fornax(t):
                    t = T.read(t)
                elif meta.device.type == T.DEVICE and not T.is_fornax(t):
                    t = T.to_device(t.detach())
            if isinstance(meta, torch.Tensor) and meta.numel() > 1 and tuple(t.shape) == tuple(meta.shape):
                # a saved activation is contiguous, as reported; anything else has eager's strides
                want = T.contiguous_strides(tuple(meta.shape)) if natural else tuple(meta.stride())
            else:
                want = None
            if want is not None and want != tuple(t.stride()):
                r = torch.empty_strided(t.shape, want, dtype=t.dtype, device=t.device)
                r.copy_(t)
                return r
            if id(t) in sources:                 # a copy the graph made must not alias its input
                return t.clone()
            return t
        flat = output_node.args[0]
        if self.natural and isinstance(flat, (list, tuple)):
            # by position: a node may also be a user output, which keeps eager's strides
            picked = [out(n, i in self.natural) for i, n in enumerate(flat)]
            return tuple(picked) if isinstance(flat, tuple) else picked
        return map_aggregate(flat, out)

    def _run_node(self, step: _TorchStep, env: dict, device: bool) -> None:
        node = step.node
        args = map_aggregate(node.args, lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
        kwargs = map_aggregate(dict(node.kwargs), lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
        if step.reason is not None:
            args, kwargs = tree_map(_cpu, (args, kwargs))
        target = node.target
        if not callable(target):                         # a call_method node's name
            raise TypeError(f"{node.format_node()}: its target {target!r} is not callable")
        res = target(*args, **kwargs)
        if step.reason is not None and device:
            res = tree_map(_dev, res)
        env[node] = res

    def _run_segment(self, session: Session, seg: _Segment, env: dict, device: bool) -> None:
        outs: list | None = None
        name = seg.g.name
        why = ""                                    # why the device could not run it
        if seg.g.outputs and not seg.refused:
            plan = self._plan(session, seg) if device else None
            if plan is None or isinstance(plan, str):
                why = plan or ""
                outs = self._run_host(session, seg, env, device)
            else:
                outs = self._run_device(session, seg, plan, env)
        if seg.g.outputs and outs is None:          # the stack refused the graph: torch runs its nodes
            session.stats.record(f"graph run:{name}", "fallback", f"{why + '; ' if why else ''}{seg.refused}; "
                                 "its ATen ops run with PyTorch on the CPU")
            for node in seg.members:
                if node.op == "call_function" and node.target is operator.getitem and \
                        node.args[0] in seg.members:
                    env[node] = env[node.args[0]][node.args[1]]
                else:
                    self._run_node(_TorchStep(node, seg.refused), env, device)
            return
        if seg.g.outputs:
            session.stats.record(f"graph run:{name}", "fallback" if why else "native", why)
        if outs is not None:                        # None: the segment has no graph outputs
            for m in seg.outputs:
                env[m] = outs[seg.out_index[m]]
        for m, src in seg.passthrough:
            if isinstance(src, torch.fx.Node):
                env[m] = env[src]
            else:
                t = _from_numpy(src, DTYPE_TO_TORCH[seg.vals[m].dtype])
                env[m] = T.to_device(t) if device else t
        for m, meta in seg.empties:
            env[m] = None if meta is None else \
                torch.empty(meta.shape, dtype=meta.dtype, device=T.DEVICE if device else "cpu")

    def _plan(self, session: Session, seg: _Segment):
        """The resident plan of ``seg`` on this session's stack, or why there is none."""
        plan = seg.plans.get(session.id)
        if plan is None:
            fw = session.framework
            route = fw.device_route(seg.g)
            if route is not None:
                plan = f"{route.reason} (op {route.op}); the graph takes the host route (framework.run)"
            else:
                try:
                    plan = fw.prepare(seg.g, current_runtime_stream(session))
                except _REFUSALS as exc:
                    plan = (f"the {exc.seam or 'compiler'} seam refused the graph on the device: "
                            f"{exc.message}; it takes the host route (framework.run)")
                else:
                    if len(plan.plan.inputs) != len(seg.g.inputs) or \
                            len(plan.plan.outputs) != len(seg.g.outputs):
                        plan.release()
                        plan = "the compiled plan does not take every graph input; the graph takes the host route (framework.run)"
            seg.plans[session.id] = plan
        return plan

    def _run_device(self, session: Session, seg: _Segment, plan, env: dict) -> list:
        stream = current_runtime_stream(session)
        temps: list = []
        ptrs = []
        for n in seg.inputs:
            t = env[n]
            if not T.is_fornax(t):
                t = T.to_device(t.detach())
                temps.append(t)
            ptrs.append(materialize(session, t, temps, stream))
        outs = [T.empty(v.shape, DTYPE_TO_TORCH[v.dtype], session=session) for v in seg.g.outputs]
        plan(ptrs, [T.address(o, session) for o in outs], stream)
        del temps
        return outs

    def _run_host(self, session: Session, seg: _Segment, env: dict, device: bool) -> list | None:
        """``framework.run`` on host arrays; None (and ``seg.refused`` set) if the stack refuses."""
        feeds = {v.name: _to_numpy(_cpu(env[n])) for n, v in zip(seg.inputs, seg.g.inputs)}
        try:
            res = session.framework.run(seg.g, feeds)
        except _REFUSALS as exc:
            seg.refused = f"the stack could not compile graph {seg.g.name}: {exc.message}"
            return None
        for fb in res.fallbacks:
            session.stats.record(f"graph op:{fb['op']}", "fallback", fb["reason"])
        outs = [_from_numpy(a, DTYPE_TO_TORCH[v.dtype]) for a, v in zip(res.outputs, seg.g.outputs)]
        return [T.to_device(o) for o in outs] if device else outs


def _prune(seg: _Segment, outputs: list[Value], position: dict) -> None:
    """Drop graph nodes, inputs and constants no output needs (results of multi-output ops
    nobody reads), and order the inputs as the FX graph's placeholders."""
    g = seg.g
    live = {id(v) for v in outputs}
    kept = []
    for node in reversed(g.nodes):
        if any(id(o) in live for o in node.outputs):
            kept.append(node)
            live.update(id(v) for v in node.inputs)
    g.nodes[:] = kept[::-1]
    g.constants[:] = [v for v in g.constants if id(v) in live]
    pairs = sorted(((n, v) for n, v in zip(seg.inputs, g.inputs) if id(v) in live),
                   key=lambda p: position[p[0]])
    seg.inputs[:] = [n for n, _ in pairs]
    g.inputs[:] = [v for _, v in pairs]


def _get_attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _release(segments) -> None:
    for seg in segments:
        for plan in seg.plans.values():
            if not isinstance(plan, str):
                try:
                    plan.release()
                except Exception:            # at interpreter exit the runtime may be gone
                    pass


__all__ = ["BACKEND", "Program", "decompositions", "fornax_backend",
           "register_backend", "skip_fornax_frames"]
