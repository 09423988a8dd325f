"""The graph of the MAX-style front end: typed tensor values, ops recorded in program order,
custom ops whose kernels the user writes.

A :class:`Graph` is built the way MAX's graph API builds one: from its input types, either
inside ``with Graph(name, input_types=[...]) as g:`` (``g.inputs``, then ``g.output(...)``)
or with ``Graph(name, forward=fn, input_types=[...])``.  Every op (:mod:`.ops`) records a
:class:`Node` in the graph that is being built and returns :class:`TensorValue` s whose
types are inferred at once by fornax's op table, so a shape or dtype mistake is an error
at the line that made it.  Nothing computes while a graph is built; an
:class:`~fornax.frameworks.max.engine.InferenceSession` compiles and runs it whole.
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...layers.errors import GraphError
from ...layers.graph import DType as IRDType
from ...layers.graph import Graph as IRGraph
from ...layers.graph import TensorType as IRTensorType
from ...layers.graph import Value as IRValue
from ...sim import isa


class DType(enum.Enum):
    """Element types (``max.dtype.DType``'s names for the ones fornax stores)."""

    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"
    int32 = "int32"
    int64 = "int64"
    bool = "bool"

    @property
    def ir(self) -> IRDType:
        return IRDType(self.value)

    @classmethod
    def of(cls, dtype: object) -> DType:
        """A DType from itself, a numpy dtype or a name."""
        if isinstance(dtype, DType):
            return dtype
        return cls(IRDType.of(dtype).value)


@dataclass(frozen=True)
class TensorType:
    """A tensor's element type and static shape."""

    dtype: DType
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DType.of(self.dtype))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if any(d <= 0 for d in self.shape):
            raise GraphError(f"TensorType dimensions must be positive, got {self.shape}",
                             seam="framework", hint="give every dimension a size of 1 or more")

    @property
    def rank(self) -> int:
        return len(self.shape)


_ids = itertools.count()


class TensorValue:
    """A value of the graph being built: its type, and Python operators for the common ops
    (``+ - * / @``, unary ``-``), as MAX's ``TensorValue`` offers them."""

    def __init__(self, graph: Graph, type_: TensorType):
        self.graph, self.type, self.id = graph, type_, next(_ids)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    def __repr__(self) -> str:
        return f"TensorValue({self.dtype.value}, {list(self.shape)})"

    def _bin(self, name: str, other: Any, swap: bool = False) -> TensorValue:
        other_v = other if isinstance(other, TensorValue) else \
            self.graph._constant(np.asarray(other, self.dtype.ir.numpy))
        a, b = (other_v, self) if swap else (self, other_v)
        return self.graph._op(name, [a, b])

    def __add__(self, o: Any) -> TensorValue:
        return self._bin("add", o)

    def __radd__(self, o: Any) -> TensorValue:
        return self._bin("add", o, swap=True)

    def __sub__(self, o: Any) -> TensorValue:
        return self._bin("sub", o)

    def __rsub__(self, o: Any) -> TensorValue:
        return self._bin("sub", o, swap=True)

    def __mul__(self, o: Any) -> TensorValue:
        return self._bin("mul", o)

    def __rmul__(self, o: Any) -> TensorValue:
        return self._bin("mul", o, swap=True)

    def __truediv__(self, o: Any) -> TensorValue:
        return self._bin("div", o)

    def __matmul__(self, o: TensorValue) -> TensorValue:
        return self._bin("matmul", o)

    def __neg__(self) -> TensorValue:
        return self.graph._op("neg", [self])

    def reshape(self, *shape: Any) -> TensorValue:
        dims = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return self.graph._op("reshape", [self], shape=reshaped(self.shape, dims))

    @property
    def T(self) -> TensorValue:
        """The last two dimensions swapped."""
        perm = list(range(self.type.rank))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        return self.graph._op("transpose", [self], perm=tuple(perm))


def reshaped(shape: tuple[int, ...], dims: Sequence[int]) -> tuple[int, ...]:
    """``dims`` for a tensor of ``shape``, one -1 inferred from the size."""
    out = [int(d) for d in dims]
    total = int(np.prod(shape))
    if out.count(-1) > 1:
        raise GraphError(f"reshape {shape} -> {tuple(out)}: at most one -1", seam="framework")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        if known <= 0 or total % known:
            raise GraphError(f"cannot reshape {shape} to {tuple(out)}", seam="framework")
        out[out.index(-1)] = total // known
    return tuple(out)


@dataclass(frozen=True)
class CustomOp:
    """An op whose kernel the user writes in fornax's tile-ISA builder
    (:class:`~fornax.layers.kernel_builder.KernelBuilder`), as MAX custom ops bring their own
    kernels.

    ``kernel(input_types)`` returns the program and its launch grid for those input types;
    the program's pointer parameters, in declaration order, are the op's inputs, then its
    outputs.  ``out_types(input_types)`` gives the outputs' types; ``reference(*arrays)``
    computes the same outputs on the host in float64 (what a run's numerics are checked
    against).  The stack's library seam packs the program into the family's binary format
    and launches it: the one place vendor-specific code enters a graph."""

    name: str
    kernel: Callable[[list[TensorType]], tuple[isa.Program, tuple[int, int, int]]]
    out_types: Callable[[list[TensorType]], list[TensorType]]
    reference: Callable[..., Sequence[np.ndarray]]


@dataclass
class Node:
    """One recorded op: a graph-IR op name (or a custom op), its inputs, attributes, outputs,
    and for a constant its array."""

    op: str
    inputs: list[TensorValue]
    attrs: dict[str, Any]
    outputs: list[TensorValue]
    const: np.ndarray | None = None
    custom: CustomOp | None = None


_building = threading.local()


def current() -> Graph:
    """The graph being built on this thread (ops outside ``with Graph(...)`` are an error)."""
    stack: list[Graph] = getattr(_building, "stack", [])
    if not stack:
        raise GraphError("an op was called outside a graph: build inside `with Graph(...) as g:` "
                         "or pass forward= to Graph", seam="framework",
                         hint="open the graph with a with-statement first")
    return stack[-1]


@dataclass
class Graph:
    """A MAX-style graph (see the module docstring)."""

    name: str
    forward: Callable[..., Any] | None = None
    input_types: Sequence[TensorType] = ()
    nodes: list[Node] = field(default_factory=list)
    inputs: list[TensorValue] = field(default_factory=list)
    outputs: list[TensorValue] = field(default_factory=list)

    def __post_init__(self) -> None:
        types = [t if isinstance(t, TensorType) else TensorType(*t) for t in self.input_types]
        self.input_types = types
        self._shadow = IRGraph(self.name)          # types every op at once through fornax's op table
        self._ir: dict[int, IRValue] = {}
        for i, t in enumerate(types):
            v = TensorValue(self, t)
            self._ir[v.id] = self._shadow.input(f"input{i}", t.shape, t.dtype.ir)
            self.inputs.append(v)
        if self.forward is not None:
            with self:
                out = self.forward(*self.inputs)
                self.output(*(out if isinstance(out, (tuple, list)) else (out,)))

    def __enter__(self) -> Graph:
        stack = getattr(_building, "stack", None)
        if stack is None:
            stack = _building.stack = []
        stack.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _building.stack.pop()

    def output(self, *values: TensorValue) -> None:
        """Set the graph's outputs (values of this graph)."""
        if not values:
            raise GraphError(f"graph {self.name!r}: output() needs at least one value", seam="framework")
        for v in values:
            self._own(v)
        self.outputs = list(values)

    def _own(self, v: object) -> TensorValue:
        if not isinstance(v, TensorValue) or v.graph is not self:
            raise GraphError(f"graph {self.name!r}: {v!r} is not a value of this graph", seam="framework",
                             hint="use values made inside this graph (its inputs, or ops on them)")
        return v

    def _value(self, t: IRTensorType) -> TensorValue:
        return TensorValue(self, TensorType(DType(t.dtype.value), t.shape))

    def _op(self, name: str, inputs: list[TensorValue], **attrs: Any) -> TensorValue:
        """Record a graph-IR op; its output's type comes from fornax's op table (a bad shape or
        dtype raises here, naming the op)."""
        ins = [self._own(v) for v in inputs]
        ir = self._shadow.op(name, *(self._ir[v.id] for v in ins), **attrs)
        out = self._value(ir.type)
        self._ir[out.id] = ir
        self.nodes.append(Node(name, ins, attrs, [out]))
        return out

    def _constant(self, array: np.ndarray) -> TensorValue:
        ir = self._shadow.constant(array, "const")
        out = self._value(ir.type)
        self._ir[out.id] = ir
        self.nodes.append(Node("constant", [], {}, [out], const=np.ascontiguousarray(array)))
        return out

    def _custom(self, op: CustomOp, inputs: list[TensorValue]) -> list[TensorValue]:
        ins = [self._own(v) for v in inputs]
        types = op.out_types([v.type for v in ins])
        outs = [TensorValue(self, t) for t in types]
        for v in outs:           # downstream ops type against a fresh shadow input
            self._ir[v.id] = self._shadow.input(f"{op.name}_out{v.id}", v.shape, v.dtype.ir)
        self.nodes.append(Node(op.name, ins, {}, outs, custom=op))
        return outs
