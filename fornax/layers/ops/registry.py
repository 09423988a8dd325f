"""The op registry: :class:`OpDef`, the table :data:`OPS`, and the helpers op definitions share.

Every op a graph node may name is one :class:`OpDef` in :data:`OPS`, put there
by :func:`register` when its family module (``elementwise``, ``reductions``,
``layout``, ...) is imported; :mod:`fornax.layers.ops` imports every family.
An op has shape and dtype inference (which is also its verifier: bad use
raises :class:`~fornax.layers.errors.GraphError`), a float64 numpy reference
implementation, and, for composites, a decomposition into other ops built on
a :class:`GraphBuilder` (what :class:`fornax.layers.graph.Graph` provides).

The helpers below are the checks and decomposition steps several families
use: operand dtypes that must agree (:func:`same_dtype`), float-only ops
(:func:`float_only`), axis normalisation (:func:`norm_axis`), broadcasting
(:func:`broadcast_shape`), integer tuples (:func:`int_tuple`), and the
identity-skipping :func:`permute` / :func:`reshape` / :func:`scalar` a
decomposition emits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..errors import GraphError
from ..ir import DType, TensorType, Value

#: an op's attributes (their values are op-specific: ints, tuples, strings, floats)
Attrs = dict[str, Any]
#: a float64 (or integer/bool) numpy array, the reference implementations' currency
Array = NDArray[Any]


class GraphBuilder(Protocol):
    """What a decomposition builds with: adding op nodes and constants to a graph."""

    def op(self, name: str, *inputs: Value, **attrs: Any) -> Value: ...

    def constant(self, array: ArrayLike, name: str = "c") -> Value: ...


#: (operand types, attributes) -> result type; raises GraphError for bad use
InferFn = Callable[[list[TensorType], Attrs], TensorType]
#: (float64 operand arrays..., **attributes) -> result array
ReferenceFn = Callable[..., Array]
#: (graph, operands, attributes) -> the value that replaces the composite's result
DecomposeFn = Callable[[GraphBuilder, Sequence[Value], Attrs], Value]


@dataclass(frozen=True)
class OpDef:
    """One op of the graph IR."""

    name: str
    kind: str                                   # elementwise | reduce | matmul | composite | layout | ...
    arity: int                                  # operand count; -1: one or more (variadic)
    infer: InferFn
    reference: ReferenceFn
    decompose: DecomposeFn | None = None        # for composites
    attrs: tuple[str, ...] = ()
    #: operands Graph.op brings to one dtype by inserting casts: indices, or "all" (variadic ops)
    promote: tuple[int, ...] | str = ()
    #: after promotion, an integer or bool common dtype becomes float32 (true division)
    promote_to_float: bool = False


#: every registered op, by name
OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> None:
    """Add ``op`` to :data:`OPS` (a later registration of the same name replaces it)."""
    OPS[op.name] = op


def promote_indices(opdef: OpDef, n: int) -> tuple[int, ...]:
    """The operand indices (of ``n`` operands) that ``opdef`` brings to one dtype."""
    if isinstance(opdef.promote, str):
        return tuple(range(n)) if opdef.promote == "all" else ()
    return tuple(i for i in opdef.promote if i < n)


# ---- checks ---------------------------------------------------------------------------------
def broadcast_shape(op: str, types: Sequence[TensorType]) -> tuple[int, ...]:
    """The broadcast shape of ``types`` (numpy's rules)."""
    try:
        return tuple(np.broadcast_shapes(*(t.shape for t in types)))
    except ValueError:
        raise GraphError(f"{op}: shapes {' and '.join(str(t.shape) for t in types)} do not broadcast",
                         op=op) from None


def same_dtype(op: str, types: Sequence[TensorType]) -> DType:
    """The operands' one dtype; operands of different dtypes are an error (casts come first)."""
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise GraphError(f"{op}: operand dtypes differ ({', '.join(sorted(d.value for d in dtypes))}); "
                         "insert a cast", op=op,
                         hint="Graph.op inserts the casts of type promotion; a hand-built node must carry them")
    return dtypes.pop()


def float_only(op: str, dtype: DType) -> None:
    """Raise unless ``dtype`` is a floating-point type."""
    if not dtype.is_float:
        raise GraphError(f"{op}: needs a floating-point operand, got {dtype}", op=op)


def norm_axis(op: str, axis: object, rank: int) -> int:
    """``axis`` (an int in ``[-rank, rank)``) as a non-negative dim index."""
    if not isinstance(axis, int) or not -rank <= axis < rank:
        raise GraphError(f"{op}: axis {axis!r} is out of range for rank {rank}", op=op)
    return axis % rank


def is_int(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_tuple(op: str, name: str, value: object, rank: int) -> tuple[int, ...]:
    """``value`` as a tuple of exactly ``rank`` ints (one per dim)."""
    if not isinstance(value, (tuple, list)) or len(value) != rank or not all(is_int(d) for d in value):
        raise GraphError(f"{op}: {name} must be a tuple of {rank} ints (one per dim), got {value!r}",
                         op=op)
    return tuple(value)


# ---- decomposition steps --------------------------------------------------------------------
def permute(g: GraphBuilder, v: Value, perm: Sequence[int]) -> Value:
    """``transpose(v, perm)``, or ``v`` itself for the identity permutation."""
    return v if tuple(perm) == tuple(range(len(v.shape))) else g.op("transpose", v, perm=tuple(perm))


def reshape(g: GraphBuilder, v: Value, shape: Sequence[int]) -> Value:
    """``reshape(v, shape)``, or ``v`` itself when it already has that shape."""
    return v if tuple(shape) == tuple(v.shape) else g.op("reshape", v, shape=tuple(shape))


def scalar(g: GraphBuilder, value: float, dtype: DType, name: str) -> Value:
    """A rank-0 constant of ``dtype``."""
    return g.constant(np.array(value, dtype=dtype.numpy), name)
