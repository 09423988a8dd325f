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
    #: operands Graph.op brings to one dtype by inserting casts: indices, or "all" (variadic ops)
    promote: tuple[int, ...] | str = ()
    #: after promotion, an integer or bool common dtype becomes float32 (true division)
    promote_to_float: bool = False


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
                         "insert a cast", op=op,
                         hint="Graph.op inserts the casts of type promotion; a hand-built node must carry them")
    return dtypes.pop()


_PROMOTION_KIND = {DType.BOOL: 0, DType.INT32: 1, DType.INT64: 1, DType.FLOAT16: 2,
                   DType.BFLOAT16: 2, DType.FLOAT32: 2, DType.FLOAT64: 2}


def promote_types(*dtypes: DType) -> DType:
    """The common dtype of operands, by PyTorch's rules for tensors of any rank.

    bool < integers < floats; two of one kind give the wider; an integer with a
    float gives the float; float16 with bfloat16 gives float32."""
    out = DType.of(dtypes[0])
    for d in dtypes[1:]:
        d = DType.of(d)
        if d is out:
            continue
        ka, kb = _PROMOTION_KIND[out], _PROMOTION_KIND[d]
        if ka != kb:
            out = out if ka > kb else d
        elif {out, d} == {DType.FLOAT16, DType.BFLOAT16}:
            out = DType.FLOAT32
        else:
            out = out if out.itemsize >= d.itemsize else d
    return out


def _promote_indices(opdef: "OpDef", n: int) -> tuple[int, ...]:
    return tuple(range(n)) if opdef.promote == "all" else tuple(i for i in opdef.promote if i < n)


def _float_only(op: str, dtype: DType) -> None:
    if not dtype.is_float:
        raise GraphError(f"{op}: needs a floating-point operand, got {dtype}", op=op)


def _unary(name: str, ref: Callable, floats: bool = True, out_bool: bool = False,
           no_bool: bool = False, infer_attrs: Callable | None = None, attrs: tuple[str, ...] = ()) -> None:
    def infer(types, attrs):
        if floats:
            _float_only(name, types[0].dtype)
        if no_bool and types[0].dtype is DType.BOOL:
            raise GraphError(f"{name}: needs a numeric operand, got bool", op=name)
        if infer_attrs is not None:
            infer_attrs(attrs)
        return TensorType(types[0].shape, DType.BOOL) if out_bool else types[0]
    _register(OpDef(name, "elementwise", 1, infer, ref, attrs=attrs))


def _binary(name: str, ref: Callable, out_bool: bool = False, to_float: bool = False,
            no_bool: bool = False, ints_only: bool = False) -> None:
    def infer(types, attrs):
        dt = _same_dtype(name, types)
        if no_bool and dt is DType.BOOL:
            raise GraphError(f"{name}: needs numeric operands, got bool", op=name)
        if ints_only and dt.is_float:
            raise GraphError(f"{name}: needs integer or bool operands, got {dt}", op=name)
        if to_float:
            _float_only(name, dt)
        return TensorType(_broadcast(name, types), DType.BOOL if out_bool else dt)
    _register(OpDef(name, "elementwise", 2, infer, ref, promote=(0, 1), promote_to_float=to_float))


def _gelu_ref(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def _erf(x):
    from scipy.special import erf
    return erf(x)


def _check_gelu(attrs):
    if attrs.get("approximate", "none") not in ("none", "tanh"):
        raise GraphError(f"gelu: approximate must be 'none' or 'tanh', got {attrs['approximate']!r}",
                         op="gelu")


_unary("neg", np.negative, floats=False)
_unary("abs", np.abs, floats=False)
_unary("exp", np.exp)
_unary("log", np.log)
_unary("tanh", np.tanh)
_unary("sqrt", np.sqrt)
_unary("rsqrt", lambda x: 1 / np.sqrt(x))
_unary("relu", lambda x: np.maximum(x, 0))
_unary("sigmoid", lambda x: 1 / (1 + np.exp(-x)))
_unary("erf", _erf)
_unary("sin", np.sin)
_unary("cos", np.cos)
_unary("reciprocal", lambda x: 1 / x)
_unary("floor", np.floor, floats=False, no_bool=True)
_unary("ceil", np.ceil, floats=False, no_bool=True)
_unary("round", np.round, floats=False, no_bool=True)       # half to even, as torch.round
_unary("sign", np.sign, floats=False, no_bool=True)
_unary("logical_not", np.logical_not, floats=False, out_bool=True)
_unary("isnan", np.isnan, floats=False, out_bool=True)
_unary("gelu", _gelu_ref, infer_attrs=_check_gelu, attrs=("approximate",))
_unary("silu", lambda x: x / (1 + np.exp(-x)))
_binary("add", np.add)
_binary("sub", np.subtract, no_bool=True)
_binary("mul", np.multiply)
_binary("div", np.true_divide, to_float=True)
_binary("maximum", np.maximum)
_binary("minimum", np.minimum)
_binary("pow", np.power, no_bool=True)
_binary("atan2", np.arctan2, to_float=True)
_binary("floor_divide", np.floor_divide, no_bool=True)
_binary("remainder", np.mod, no_bool=True)                  # sign of the divisor, as torch.remainder
_binary("lt", np.less, out_bool=True)
_binary("le", np.less_equal, out_bool=True)
_binary("gt", np.greater, out_bool=True)
_binary("ge", np.greater_equal, out_bool=True)
_binary("eq", np.equal, out_bool=True)
_binary("ne", np.not_equal, out_bool=True)
_binary("logical_and", np.logical_and, out_bool=True)
_binary("logical_or", np.logical_or, out_bool=True)
_binary("bitwise_and", np.bitwise_and, ints_only=True)
_binary("bitwise_or", np.bitwise_or, ints_only=True)
_binary("bitwise_xor", np.bitwise_xor, ints_only=True)


def _infer_where(types, attrs):
    cond, a, b = types
    if cond.dtype is not DType.BOOL:
        raise GraphError(f"where: condition must be bool, got {cond.dtype}", op="where")
    return TensorType(_broadcast("where", types), _same_dtype("where", [a, b]))


_register(OpDef("where", "elementwise", 3, _infer_where, lambda c, a, b: np.where(c, a, b),
                promote=(1, 2)))


def _infer_clamp(types, attrs):
    dt = _same_dtype("clamp", types)
    if dt is DType.BOOL:
        raise GraphError("clamp: needs numeric operands, got bool", op="clamp")
    shape = _broadcast("clamp", types)
    if shape != types[0].shape:
        raise GraphError(f"clamp: bounds {types[1].shape} and {types[2].shape} must broadcast to "
                         f"the operand's shape {types[0].shape}", op="clamp")
    return TensorType(shape, dt)


# clamp(x, lo, hi) = min(max(x, lo), hi), as torch.clamp
_register(OpDef("clamp", "elementwise", 3, _infer_clamp,
                lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi), promote="all"))


def _infer_cast(types, attrs):
    return TensorType(types[0].shape, DType.of(attrs["dtype"]))


_register(OpDef("cast", "elementwise", 1, _infer_cast,
                lambda x, dtype: x.astype(np.float64 if DType.of(dtype).is_float else DType.of(dtype).numpy),
                attrs=("dtype",)))


def _norm_axis(op: str, axis, rank: int) -> int:
    if not isinstance(axis, int) or not -rank <= axis < rank:
        raise GraphError(f"{op}: axis {axis!r} is out of range for rank {rank}", op=op)
    return axis % rank


def _reduced_type(name: str, types: list[TensorType], attrs: dict) -> TensorType:
    """The type of reducing ``types[0]`` along ``attrs['axis']`` (keepdims by default)."""
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


def _reduce(name: str, ref: Callable) -> None:
    def infer(types, attrs):
        return _reduced_type(name, types, attrs)

    def reference(x, axis=-1, keepdims=True):
        return ref(x, axis=axis, keepdims=keepdims)
    _register(OpDef(name, "reduce", 1, infer, reference, attrs=("axis", "keepdims")))


_reduce("reduce_sum", np.sum)
_reduce("reduce_max", np.max)
_reduce("reduce_min", np.min)


def _arg_reduce(name: str, ref: Callable) -> None:
    """argmax / argmin along one axis: the int64 index of the first extreme element."""
    def infer(types, attrs):
        return TensorType(_reduced_type(name, types, attrs).shape, DType.INT64)

    def reference(x, axis=-1, keepdims=True):
        return ref(x, axis=axis, keepdims=keepdims).astype(np.int64)
    _register(OpDef(name, "reduce", 1, infer, reference, attrs=("axis", "keepdims")))


_arg_reduce("argmax", np.argmax)
_arg_reduce("argmin", np.argmin)


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
    return _reduced_type("reduce_mean", types, attrs)


_register(OpDef("reduce_mean", "composite", 1, _infer_mean,
                lambda x, axis=-1, keepdims=True: np.mean(x, axis=axis, keepdims=keepdims),
                _mean_decompose, attrs=("axis", "keepdims")))


def _infer_var(types, attrs):
    (t,) = types
    _float_only("var", t.dtype)
    out = _reduced_type("var", types, attrs)
    corr = attrs.get("correction", 1)
    if isinstance(corr, bool) or not isinstance(corr, int) or corr < 0:
        raise GraphError(f"var: correction must be a non-negative int, got {corr!r}", op="var")
    n = t.shape[attrs.get("axis", -1) % len(t.shape)]
    if n - corr <= 0:
        raise GraphError(f"var: correction {corr} leaves no degrees of freedom along an axis of "
                         f"size {n}", op="var", hint="use correction=0 (population variance)")
    return out


def _var_decompose(g: "Graph", inputs, attrs):
    (x,) = inputs
    axis = attrs.get("axis", -1)
    n = x.shape[axis % len(x.shape)]
    mean = g.op("reduce_mean", x, axis=axis, keepdims=True)
    d = g.op("sub", x, mean)
    s = g.op("reduce_sum", g.op("mul", d, d), axis=axis, keepdims=attrs.get("keepdims", True))
    return g.op("mul", s, g.constant(np.array(1.0 / (n - attrs.get("correction", 1)),
                                              dtype=x.dtype.numpy), "inv_dof"))


# variance along one axis with Bessel's correction (torch.var's ``correction``, default 1)
_register(OpDef("var", "composite", 1, _infer_var,
                lambda x, axis=-1, keepdims=True, correction=1:
                    np.var(x, axis=axis, keepdims=keepdims, ddof=correction),
                _var_decompose, attrs=("axis", "keepdims", "correction")))


def _log_softmax_ref(x, axis=-1):
    z = x - np.max(x, axis=axis, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))


def _log_softmax_decompose(g: "Graph", inputs, attrs):
    (x,) = inputs
    axis = attrs.get("axis", -1)
    z = g.op("sub", x, g.op("reduce_max", x, axis=axis, keepdims=True))
    return g.op("sub", z, g.op("log", g.op("reduce_sum", g.op("exp", z), axis=axis, keepdims=True)))


def _infer_log_softmax(types, attrs):
    _float_only("log_softmax", types[0].dtype)
    _norm_axis("log_softmax", attrs.get("axis", -1), len(types[0].shape))
    return types[0]


_register(OpDef("log_softmax", "composite", 1, _infer_log_softmax, _log_softmax_ref,
                _log_softmax_decompose, attrs=("axis",)))


def _int_tuple(op: str, name: str, value, rank: int) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or len(value) != rank or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise GraphError(f"{op}: {name} must be a tuple of {rank} ints (one per dim), got {value!r}",
                         op=op)
    return tuple(value)


def _infer_iota(types, attrs):
    shape = attrs.get("shape")
    if not isinstance(shape, (tuple, list)) or not shape or not all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise GraphError(f"iota: shape must be a non-empty tuple of positive ints, got {shape!r}",
                         op="iota")
    axis = _norm_axis("iota", attrs.get("axis", 0), len(shape))
    dtype = DType.of(attrs.get("dtype", "int64"))
    if dtype is DType.BOOL:
        raise GraphError("iota: dtype must be numeric, got bool", op="iota")
    if dtype in (DType.FLOAT16, DType.BFLOAT16) and shape[axis] > 256:
        raise GraphError(f"iota: {dtype} cannot count to {shape[axis]} exactly (at most 256)", op="iota")
    return TensorType(tuple(shape), dtype)


def _iota_ref(shape, axis=0, dtype="int64"):
    shape = tuple(shape)
    ax = axis % len(shape)
    r = np.arange(shape[ax]).reshape([-1 if d == ax else 1 for d in range(len(shape))])
    dt = DType.of(dtype)
    return np.broadcast_to(r, shape).astype(np.float64 if dt.is_float else dt.numpy)


# the index along ``axis`` at every position of a tensor of ``shape`` (no operands)
_register(OpDef("iota", "elementwise", 0, _infer_iota, _iota_ref, attrs=("shape", "axis", "dtype")))


def slice_bounds(shape: tuple[int, ...], attrs: dict) -> list[tuple[int, int, int]]:
    """Normalised (start, stop, step) per dim of a slice; negative start/stop count from the end."""
    rank = len(shape)
    start = _int_tuple("slice", "start", attrs.get("start", (0,) * rank), rank)
    stop = _int_tuple("slice", "stop", attrs.get("stop", shape), rank)
    step = _int_tuple("slice", "step", attrs.get("step", (1,) * rank), rank)
    out = []
    for d, (a, b, s, n) in enumerate(zip(start, stop, step, shape)):
        if s <= 0:
            raise GraphError(f"slice: step {s} in dim {d} must be positive", op="slice")
        a2, b2 = a + n if a < 0 else a, b + n if b < 0 else b
        if not 0 <= a2 < b2 <= n:
            raise GraphError(f"slice: [{a}:{b}] in dim {d} is out of range or empty for size {n}",
                             op="slice", hint=f"need -{n} <= start < stop <= {n} after counting "
                                              "negatives from the end")
        out.append((a2, b2, s))
    return out


def _infer_slice(types, attrs):
    (t,) = types
    bounds = slice_bounds(t.shape, attrs)
    return TensorType(tuple(-(-(b - a) // s) for a, b, s in bounds), t.dtype)


def _slice_ref(x, start=None, stop=None, step=None):
    bounds = slice_bounds(x.shape, {"start": start or (0,) * x.ndim, "stop": stop or x.shape,
                                    "step": step or (1,) * x.ndim})
    return x[tuple(slice(a, b, s) for a, b, s in bounds)].copy()


_register(OpDef("slice", "layout", 1, _infer_slice, _slice_ref, attrs=("start", "stop", "step")))


def _infer_concat(types, attrs):
    if not types:
        raise GraphError("concat: needs at least one operand", op="concat")
    first = types[0]
    axis = _norm_axis("concat", attrs.get("axis", 0), len(first.shape))
    dt = _same_dtype("concat", types)
    for i, t in enumerate(types[1:], 1):
        if len(t.shape) != len(first.shape) or any(a != b for d, (a, b) in enumerate(
                zip(t.shape, first.shape)) if d != axis):
            raise GraphError(f"concat: operand {i} has shape {t.shape}, operand 0 {first.shape}; "
                             f"they must agree in every dim but axis {axis}", op="concat")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return TensorType(tuple(shape), dt)


_register(OpDef("concat", "layout", -1, _infer_concat,
                lambda *xs, axis=0: np.concatenate(xs, axis=axis), attrs=("axis",), promote="all"))


def pad_widths(shape: tuple[int, ...], attrs: dict) -> list[tuple[int, int]]:
    pads = attrs.get("pads")
    if not isinstance(pads, (tuple, list)) or len(pads) != len(shape) or not all(
            isinstance(p, (tuple, list)) and len(p) == 2 and all(
                isinstance(q, int) and not isinstance(q, bool) for q in p) for p in pads):
        raise GraphError(f"pad: pads must be one (before, after) pair of ints per dim "
                         f"({len(shape)} pairs), got {pads!r}", op="pad")
    for d, (lo, hi) in enumerate(pads):
        if lo < 0 or hi < 0:
            raise GraphError(f"pad: negative padding ({lo}, {hi}) in dim {d}; use slice to crop",
                             op="pad")
    return [tuple(p) for p in pads]


def _infer_pad(types, attrs):
    (t,) = types
    value = attrs.get("value", 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GraphError(f"pad: value must be a number, got {value!r}", op="pad")
    if not t.dtype.is_float and value != int(value):
        raise GraphError(f"pad: value {value} is not representable in {t.dtype}", op="pad")
    return TensorType(tuple(n + lo + hi for n, (lo, hi) in zip(t.shape, pad_widths(t.shape, attrs))),
                      t.dtype)


_register(OpDef("pad", "layout", 1, _infer_pad,
                lambda x, pads, value=0.0: np.pad(x, [tuple(p) for p in pads], constant_values=value),
                attrs=("pads", "value")))


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
        idx = _promote_indices(opdef, len(inputs))
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


from . import nn_ops  # noqa: E402,F401  (registers dot_general, convolution, gather, RNG, norms, attention)
