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
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

import ml_dtypes
import numpy as np

from .errors import GraphError


class DType(str, enum.Enum):
    FLOAT64 = "float64"
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    INT64 = "int64"
    INT32 = "int32"
    BOOL = "bool"

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(ml_dtypes.bfloat16) if self is DType.BFLOAT16 else np.dtype(self.value)

    @property
    def is_float(self) -> bool:
        return self in (DType.FLOAT64, DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @classmethod
    def of(cls, dtype) -> "DType":
        """The DType of a numpy dtype / array / name."""
        if isinstance(dtype, DType):
            return dtype
        if isinstance(dtype, str):
            try:
                return cls(dtype)
            except ValueError:
                raise GraphError(f"unknown dtype {dtype!r}; fornax graphs use "
                                 f"{', '.join(d.value for d in cls)}") from None
        # a scalar type (np.float16) has a class-level ``dtype`` descriptor: use it directly
        dt = np.dtype(dtype if isinstance(dtype, type) else getattr(dtype, "dtype", dtype))
        for d in cls:
            if d.numpy == dt:
                return d
        raise GraphError(f"dtype {dt} is not a fornax graph dtype")

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: DType

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


_value_ids = itertools.count()


@dataclass(eq=False)
class Value:
    type: TensorType
    name: str
    producer: "Node | None" = None
    const: np.ndarray | None = field(default=None, repr=False)
    id: int = field(default_factory=lambda: next(_value_ids))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    def __repr__(self) -> str:
        return f"%{self.name}:{self.type}"


@dataclass(eq=False)
class Node:
    op: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    attrs: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        outs = ", ".join(f"%{v.name}" for v in self.outputs)
        ins = ", ".join(f"%{v.name}" for v in self.inputs)
        attrs = "".join(f" {k}={v}" for k, v in sorted(self.attrs.items()))
        return f"{outs} = {self.op}({ins}){attrs} : {', '.join(str(v.type) for v in self.outputs)}"


# ---- op definitions ------------------------------------------------------------------------
@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str                                   # elementwise | reduce | matmul | composite | layout
    arity: int
    infer: Callable[[list[TensorType], dict], TensorType]
    reference: Callable[..., np.ndarray]        # (float64 arrays..., **attrs) -> array
    decompose: Callable | None = None           # (graph, inputs, attrs) -> Value, for composites
    attrs: tuple[str, ...] = ()


OPS: dict[str, OpDef] = {}


def _register(op: OpDef) -> None:
    OPS[op.name] = op


def _broadcast(op: str, types: list[TensorType]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*(t.shape for t in types)))
    except ValueError:
        raise GraphError(f"{op}: shapes {' and '.join(str(t.shape) for t in types)} do not broadcast",
                         op=op) from None


def _same_dtype(op: str, types: list[TensorType]) -> DType:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise GraphError(f"{op}: operand dtypes differ ({', '.join(sorted(d.value for d in dtypes))}); "
                         "insert a cast", op=op, hint="graph ops do not promote implicitly")
    return dtypes.pop()


def _float_only(op: str, dtype: DType) -> None:
    if not dtype.is_float:
        raise GraphError(f"{op}: needs a floating-point operand, got {dtype}", op=op)


def _unary(name: str, ref: Callable, floats: bool = True) -> None:
    def infer(types, attrs):
        if floats:
            _float_only(name, types[0].dtype)
        return types[0]
    _register(OpDef(name, "elementwise", 1, infer, ref))


def _binary(name: str, ref: Callable, out_bool: bool = False) -> None:
    def infer(types, attrs):
        dt = _same_dtype(name, types)
        return TensorType(_broadcast(name, types), DType.BOOL if out_bool else dt)
    _register(OpDef(name, "elementwise", 2, infer, ref))


_unary("neg", np.negative, floats=False)
_unary("abs", np.abs, floats=False)
_unary("exp", np.exp)
_unary("log", np.log)
_unary("tanh", np.tanh)
_unary("sqrt", np.sqrt)
_unary("rsqrt", lambda x: 1 / np.sqrt(x))
_unary("relu", lambda x: np.maximum(x, 0))
_unary("sigmoid", lambda x: 1 / (1 + np.exp(-x)))
_binary("add", np.add)
_binary("sub", np.subtract)
_binary("mul", np.multiply)
_binary("div", np.true_divide)
_binary("maximum", np.maximum)
_binary("minimum", np.minimum)
_binary("lt", np.less, out_bool=True)
_binary("gt", np.greater, out_bool=True)
_binary("eq", np.equal, out_bool=True)


def _infer_where(types, attrs):
    cond, a, b = types
    if cond.dtype is not DType.BOOL:
        raise GraphError(f"where: condition must be bool, got {cond.dtype}", op="where")
    return TensorType(_broadcast("where", types), _same_dtype("where", [a, b]))


_register(OpDef("where", "elementwise", 3, _infer_where, lambda c, a, b: np.where(c, a, b)))


def _infer_cast(types, attrs):
    return TensorType(types[0].shape, DType.of(attrs["dtype"]))


_register(OpDef("cast", "elementwise", 1, _infer_cast,
                lambda x, dtype: x.astype(np.float64 if DType.of(dtype).is_float else DType.of(dtype).numpy),
                attrs=("dtype",)))


def _norm_axis(op: str, axis, rank: int) -> int:
    if not isinstance(axis, int) or not -rank <= axis < rank:
        raise GraphError(f"{op}: axis {axis!r} is out of range for rank {rank}", op=op)
    return axis % rank


def _reduce(name: str, ref: Callable) -> None:
    def infer(types, attrs):
        t = types[0]
        if t.dtype is DType.BOOL:
            raise GraphError(f"{name}: cannot reduce a bool tensor", op=name)
        axis = _norm_axis(name, attrs.get("axis", -1), len(t.shape))
        keep = attrs.get("keepdims", True)
        shape = list(t.shape)
        if keep:
            shape[axis] = 1
        else:
            del shape[axis]
        return TensorType(tuple(shape), t.dtype)

    def reference(x, axis=-1, keepdims=True):
        return ref(x, axis=axis, keepdims=keepdims)
    _register(OpDef(name, "reduce", 1, infer, reference, attrs=("axis", "keepdims")))


_reduce("reduce_sum", np.sum)
_reduce("reduce_max", np.max)


def _infer_matmul(types, attrs):
    a, b = types
    dt = _same_dtype("matmul", types)
    _float_only("matmul", dt)
    if len(a.shape) not in (2, 3) or len(b.shape) not in (2, 3):
        raise GraphError(f"matmul: operands must be rank 2 or 3, got {a.shape} and {b.shape}", op="matmul")
    if a.shape[-1] != b.shape[-2]:
        raise GraphError(f"matmul: contracting dims differ: {a.shape} @ {b.shape} "
                         f"({a.shape[-1]} != {b.shape[-2]})", op="matmul")
    if len(b.shape) == 3 and (len(a.shape) != 3 or a.shape[0] != b.shape[0]):
        raise GraphError(f"matmul: batch dims differ: {a.shape} @ {b.shape}", op="matmul")
    return TensorType(a.shape[:-1] + (b.shape[-1],), dt)


_register(OpDef("matmul", "matmul", 2, _infer_matmul, np.matmul))


def _softmax_ref(x, axis=-1):
    z = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def _softmax_decompose(g: "Graph", inputs, attrs):
    (x,) = inputs
    axis = attrs.get("axis", -1)
    m = g.op("reduce_max", x, axis=axis, keepdims=True)
    e = g.op("exp", g.op("sub", x, m))
    return g.op("div", e, g.op("reduce_sum", e, axis=axis, keepdims=True))


def _infer_softmax(types, attrs):
    _float_only("softmax", types[0].dtype)
    _norm_axis("softmax", attrs.get("axis", -1), len(types[0].shape))
    return types[0]


_register(OpDef("softmax", "composite", 1, _infer_softmax, _softmax_ref, _softmax_decompose,
                attrs=("axis",)))


def _infer_reshape(types, attrs):
    (t,) = types
    shape = attrs.get("shape")
    if not isinstance(shape, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                      for d in shape):
        raise GraphError(f"reshape: shape must be a tuple of ints, got {shape!r}", op="reshape")
    shape = tuple(shape)
    if shape.count(-1) > 1 or any(d == 0 or d < -1 for d in shape):
        raise GraphError(f"reshape: bad target shape {shape} (positive sizes, at most one -1)",
                         op="reshape")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if t.numel % known:
            raise GraphError(f"reshape: cannot infer -1 in {shape} from {t.numel} elements", op="reshape")
        shape = tuple(t.numel // known if d == -1 else d for d in shape)
    if math.prod(shape) != t.numel:
        raise GraphError(f"reshape: cannot reshape {t.shape} ({t.numel} elements) to {shape} "
                         f"({math.prod(shape)} elements)", op="reshape")
    return TensorType(shape, t.dtype)


_register(OpDef("reshape", "layout", 1, _infer_reshape,
                lambda x, shape: np.reshape(x, tuple(shape)), attrs=("shape",)))


def _infer_transpose(types, attrs):
    (t,) = types
    rank = len(t.shape)
    perm = attrs.get("perm")
    if perm is None:
        perm = tuple(reversed(range(rank)))
    if not isinstance(perm, (tuple, list)) or sorted(perm) != list(range(rank)):
        raise GraphError(f"transpose: perm {perm!r} is not a permutation of 0..{rank - 1} "
                         f"for shape {t.shape}", op="transpose")
    return TensorType(tuple(t.shape[p] for p in perm), t.dtype)


def _transpose_ref(x, perm=None):
    return np.transpose(x, None if perm is None else tuple(perm))


_register(OpDef("transpose", "layout", 1, _infer_transpose, _transpose_ref, attrs=("perm",)))


def _infer_broadcast_to(types, attrs):
    (t,) = types
    shape = attrs.get("shape")
    if not isinstance(shape, (tuple, list)) or not all(isinstance(d, int) and d > 0 for d in shape):
        raise GraphError(f"broadcast_to: shape must be a tuple of positive ints, got {shape!r}",
                         op="broadcast_to")
    try:
        out = np.broadcast_shapes(t.shape, tuple(shape))
    except ValueError:
        out = None
    if out != tuple(shape):
        raise GraphError(f"broadcast_to: {t.shape} does not broadcast to {tuple(shape)}",
                         op="broadcast_to")
    return TensorType(tuple(shape), t.dtype)


_register(OpDef("broadcast_to", "layout", 1, _infer_broadcast_to,
                lambda x, shape: np.broadcast_to(x, tuple(shape)).copy(), attrs=("shape",)))


def _mean_decompose(g: "Graph", inputs, attrs):
    (x,) = inputs
    axis = attrs.get("axis", -1)
    s = g.op("reduce_sum", x, axis=axis, keepdims=attrs.get("keepdims", True))
    n = x.shape[axis % len(x.shape)]
    return g.op("mul", s, g.constant(np.array(1.0 / n, dtype=x.dtype.numpy), "inv_n"))


def _infer_mean(types, attrs):
    _float_only("reduce_mean", types[0].dtype)
    return OPS["reduce_sum"].infer(types, attrs)


_register(OpDef("reduce_mean", "composite", 1, _infer_mean,
                lambda x, axis=-1, keepdims=True: np.mean(x, axis=axis, keepdims=keepdims),
                _mean_decompose, attrs=("axis", "keepdims")))


def _infer_all_reduce(types, attrs):
    ranks = attrs.get("ranks")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise GraphError(f"all_reduce: ranks must be a positive int, got {ranks!r}", op="all_reduce")
    _float_only("all_reduce", types[0].dtype)
    return types[0]


def _all_reduce_ref(x, ranks):
    if ranks != 1:
        raise GraphError(f"all_reduce over {ranks} ranks sums values held by the other ranks; "
                         "a one-rank graph has no float64 reference for it", op="all_reduce",
                         hint="build the graph with ranks=1 to compare against numpy")
    return x


# the sum of a value over the ranks of a (tensor-parallel) group; this graph is one rank's part
_register(OpDef("all_reduce", "collective", 1, _infer_all_reduce, _all_reduce_ref, attrs=("ranks",)))


# ---- the graph ---------------------------------------------------------------------------
class Graph:
    def __init__(self, name: str = "graph"):
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
    def input(self, name: str, shape, dtype) -> Value:
        shape = tuple(int(d) for d in shape)
        if any(d <= 0 for d in shape):
            raise GraphError(f"input {name!r}: dimensions must be positive, got {shape}")
        v = Value(TensorType(shape, DType.of(dtype)), self._fresh(name))
        self.inputs.append(v)
        return v

    def constant(self, array, name: str = "c") -> Value:
        arr = np.asarray(array)
        v = Value(TensorType(tuple(arr.shape), DType.of(arr.dtype)), self._fresh(name), const=arr)
        self.constants.append(v)
        return v

    def op(self, name: str, *inputs: Value, **attrs) -> Value:
        opdef = OPS.get(name)
        if opdef is None:
            raise GraphError(f"unknown op {name!r}; known ops: {', '.join(sorted(OPS))}", op=name)
        if len(inputs) != opdef.arity:
            raise GraphError(f"{name} takes {opdef.arity} operand(s), got {len(inputs)}", op=name)
        unknown = set(attrs) - set(opdef.attrs)
        if unknown:
            raise GraphError(f"{name}: unknown attribute(s) {', '.join(sorted(unknown))}", op=name)
        for v in inputs:
            if not isinstance(v, Value):
                raise GraphError(f"{name}: operands must be graph values, got {type(v).__name__}", op=name)
        out_type = opdef.infer([v.type for v in inputs], attrs)
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
    def verify(self) -> "Graph":
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
    def reference(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Evaluate the graph in float64 numpy (the numerics oracle)."""
        env: dict[int, np.ndarray] = {}
        for v in self.inputs:
            env[id(v)] = _to_f64(np.asarray(feeds[v.name]))
        for v in self.constants:
            env[id(v)] = _to_f64(v.const)
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


def _to_f64(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f" or a.dtype == np.dtype(ml_dtypes.bfloat16):
        return a.astype(np.float64)
    return a
