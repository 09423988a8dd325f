"""fornax's framework-neutral graph IR: a typed SSA graph of tensor ops.

Front ends produce it; compilers take it.  Every value is defined once (by a
graph input, a constant, or one node output) and carries a
:class:`TensorType` (shape and dtype).  Every op in :data:`OPS` has shape and
dtype inference, a verifier message for bad use, and a float64 numpy
reference implementation; composite ops (softmax, ...) also carry their
decomposition into primitive ops.

    g = Graph("mlp")
    x = g.input("x", (8, 16), DType.FLOAT32)
    w = g.constant(np.ones((16, 4), np.float32), "w")
    y = g.op("relu", g.op("matmul", x, w))
    g.output(y)

This module holds :class:`Graph`; the element types (:class:`DType`,
:class:`TensorType`, :class:`Value`, :class:`Node`) live in
:mod:`fornax.layers.ir` and the op registry with every op family in
:mod:`fornax.layers.ops`.  Importing this module imports the whole op set,
and re-exports those names, so ``from fornax.layers.graph import OPS,
DType, Graph`` keeps working.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Mapping, SupportsInt

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .errors import GraphError
from .ir import DType, Node, TensorType, Value, promote_types, to_f64
from .ops import OPS, OpDef, pad_widths, promote_indices, slice_bounds

#: the former private name of :func:`fornax.layers.ir.to_f64`
_to_f64 = to_f64

__all__ = ["Graph", "DType", "TensorType", "Value", "Node", "OPS", "OpDef", "promote_types",
           "slice_bounds", "pad_widths", "to_f64"]


# ---- the graph ---------------------------------------------------------------------------
class Graph:
    """A typed SSA graph: inputs, constants, nodes in definition order, and outputs."""

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.inputs: list[Value] = []
        self.constants: list[Value] = []
        self.nodes: list[Node] = []
        self.outputs: list[Value] = []
        self._names: set[str] = set()

    def _fresh(self, base: str) -> str:
        name = base
        n = itertools.count(1)
        while name in self._names:
            name = f"{base}{next(n)}"
        self._names.add(name)
        return name

    # -- building ---------------------------------------------------------
    def input(self, name: str, shape: Iterable[SupportsInt], dtype: object) -> Value:
        """A graph input of ``shape`` (positive dims) and ``dtype`` (a DType, name or numpy dtype)."""
        dims = tuple(int(d) for d in shape)
        if any(d <= 0 for d in dims):
            raise GraphError(f"input {name!r}: dimensions must be positive, got {dims}")
        v = Value(TensorType(dims, DType.of(dtype)), self._fresh(name))
        self.inputs.append(v)
        return v

    def constant(self, array: ArrayLike | None, name: str = "c") -> Value:
        """A constant holding ``array``; an array whose dtype is not a graph dtype (``None``
        included, e.g. a :class:`Value`'s absent ``const``) raises :class:`GraphError`."""
        arr = np.asarray(array)
        v = Value(TensorType(tuple(arr.shape), DType.of(arr.dtype)), self._fresh(name), const=arr)
        self.constants.append(v)
        return v

    def op(self, name: str, *inputs: Value, **attrs: Any) -> Value:
        """Add a node of op ``name``; operands are promoted (casts inserted) as the op says, and
        the result type is inferred (bad use raises :class:`GraphError`)."""
        opdef = OPS.get(name)
        if opdef is None:
            raise GraphError(f"unknown op {name!r}; known ops: {', '.join(sorted(OPS))}", op=name)
        if opdef.arity >= 0 and len(inputs) != opdef.arity:
            raise GraphError(f"{name} takes {opdef.arity} operand(s), got {len(inputs)}", op=name)
        if opdef.arity < 0 and not inputs:
            raise GraphError(f"{name} takes one or more operands, got none", op=name)
        unknown = set(attrs) - set(opdef.attrs)
        if unknown:
            raise GraphError(f"{name}: unknown attribute(s) {', '.join(sorted(unknown))}", op=name)
        for v in inputs:
            if not isinstance(v, Value):
                raise GraphError(f"{name}: operands must be graph values, got {type(v).__name__}", op=name)
        types = [v.type for v in inputs]
        casts: dict[int, DType] = {}
        idx = promote_indices(opdef, len(inputs))
        if idx:
            common = promote_types(*(inputs[i].dtype for i in idx))
            if opdef.promote_to_float and not common.is_float:
                common = DType.FLOAT32
            for i in idx:
                if inputs[i].dtype is not common:
                    casts[i] = common
                    types[i] = TensorType(inputs[i].shape, common)
        out_type = opdef.infer(types, attrs)      # checked before any cast is added
        if casts:
            inputs = tuple(self.op("cast", v, dtype=casts[i].value) if i in casts else v
                           for i, v in enumerate(inputs))
        out = Value(out_type, self._fresh(f"v{len(self.nodes)}"))
        node = Node(name, tuple(inputs), (out,), dict(attrs))
        out.producer = node
        self.nodes.append(node)
        return out

    def rename(self, value: Value, name: str, strict: bool = True) -> Value:
        """Give a value a readable name (kept by the compiler for its buffer).

        A name already in use is an error, or (``strict=False``) leaves the value as it is."""
        if name == value.name:
            return value
        if name in self._names:
            if not strict:
                return value
            raise GraphError(f"rename: name {name!r} is already used in graph {self.name!r}")
        self._names.discard(value.name)
        self._names.add(name)
        value.name = name
        return value

    def output(self, *values: Value, names: tuple[str, ...] | list[str] | None = None) -> None:
        """Mark graph outputs, optionally giving them readable names."""
        if names is not None:
            if len(names) != len(values):
                raise GraphError(f"output: {len(values)} value(s) but {len(names)} name(s)")
            for v, name in zip(values, names):
                if name != v.name:
                    if name in self._names:
                        raise GraphError(f"output: name {name!r} is already used in graph {self.name!r}")
                    self._names.discard(v.name)
                    self._names.add(name)
                    v.name = name
        self.outputs.extend(values)

    # -- checking ---------------------------------------------------------
    def verify(self) -> Graph:
        """Check SSA form and re-infer every type; raise :class:`GraphError` naming the node."""
        defined = {id(v) for v in self.inputs} | {id(v) for v in self.constants}
        for i, node in enumerate(self.nodes):
            opdef = OPS.get(node.op)
            if opdef is None:
                raise GraphError(f"node {i}: unknown op {node.op!r}", op=node.op)
            for v in node.inputs:
                if id(v) not in defined:
                    raise GraphError(f"node {i} ({node.op}) uses %{v.name} before it is defined",
                                     op=node.op)
            expect = opdef.infer([v.type for v in node.inputs], node.attrs)
            if len(node.outputs) != 1 or node.outputs[0].type != expect:
                raise GraphError(f"node {i} ({node.op}) declares {node.outputs[0].type}, "
                                 f"inference gives {expect}", op=node.op)
            for v in node.outputs:
                if id(v) in defined:
                    raise GraphError(f"node {i} ({node.op}) redefines %{v.name} (not SSA)", op=node.op)
                defined.add(id(v))
        if not self.outputs:
            raise GraphError(f"graph {self.name!r} has no outputs")
        for v in self.outputs:
            if id(v) not in defined:
                raise GraphError(f"graph output %{v.name} is never defined")
        return self

    def users(self) -> dict[int, list[Node]]:
        out: dict[int, list[Node]] = {}
        for node in self.nodes:
            for v in node.inputs:
                out.setdefault(id(v), []).append(node)
        return out

    # -- reference --------------------------------------------------------
    def reference(self, feeds: Mapping[str, ArrayLike]) -> list[NDArray[Any]]:
        """Evaluate the graph in float64 numpy (the numerics oracle)."""
        env: dict[int, NDArray[Any]] = {}
        for v in self.inputs:
            env[id(v)] = to_f64(np.asarray(feeds[v.name]))
        for v in self.constants:
            if v.const is None:
                raise GraphError(f"constant %{v.name} has no value")
            env[id(v)] = to_f64(v.const)
        with np.errstate(all="ignore"):
            for node in self.nodes:
                fn = OPS[node.op].reference
                env[id(node.outputs[0])] = fn(*(env[id(v)] for v in node.inputs), **node.attrs)
        return [env[id(v)] for v in self.outputs]

    def __str__(self) -> str:
        lines = [f"graph {self.name}("
                 + ", ".join(f"%{v.name}: {v.type}" for v in self.inputs) + ") {"]
        for v in self.constants:
            lines.append(f"  %{v.name} = constant : {v.type}")
        for node in self.nodes:
            lines.append(f"  {node!r}")
        lines.append("  return " + ", ".join(f"%{v.name}" for v in self.outputs))
        lines.append("}")
        return "\n".join(lines)
