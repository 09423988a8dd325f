"""jaxpr equations → fornax's graph IR: the context, the rule table, the dtype map.

A rule lowers one primitive.  It is a function registered with :func:`lowering`
under the primitive's name; it takes the context, the equation (for its
``params`` and the avals of ``eqn.invars`` / ``eqn.outvars``) and one graph
:class:`~fornax.layers.graph.Value` per operand, and returns one Value per
result (a single Value for a one-result primitive)::

    @lowering("tanh")
    def tanh(ctx, eqn, x):
        return ctx.op("tanh", x)

Semantics are XLA's, as ``jax.jit`` on CPU computes them: result dtypes are the
jaxpr's avals exactly (:func:`lower_eqn` checks every result's shape and device
dtype), arithmetic on float16/bfloat16 is done in float32 and rounded once per
primitive (XLA CPU's float normalisation), dot products and reductions of
bfloat16/float16 accumulate in float32.

Device dtypes (:func:`device_dtype`): float64/32/16, bfloat16, int64/32 and bool
map to themselves; the unsigned and narrow integers the graph IR lacks are
*carried* in a wider graph integer (uint32 in int64, uint8/uint16/int8/int16 in
int32) holding the jax value exactly, so every rule that can overflow the jax
type wraps its result back into range (:meth:`LowerCtx.wrap`).  A PRNG key array
``key<fry>[*s]`` is carried as its raw data, uint32[*s, 2] in int64.

A rule that cannot lower its equation raises :class:`NotLowerable` with the
reason (``ctx.fail(...)``); the program builder then runs that equation on the
host, counted as a named fallback.  Control flow (``cond``, ``while``, ``scan``)
and call primitives (``jit``, ``custom_jvp_call``, ``custom_vjp_call``,
``checkpoint``, ...) are not rules: the program builder inlines calls and runs
control flow around compiled segments (:mod:`.program`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import jax
import ml_dtypes
import numpy as np

from ...layers.graph import DType, Graph, Value


class NotLowerable(Exception):
    """This equation has no device lowering; the message says why."""


@dataclass(frozen=True)
class Carried:
    """How a jax dtype lives on the device: the graph dtype, and for a carried integer the
    jax type's range (``bits``, ``signed``)."""

    dtype: DType
    bits: int = 0                  # 0: the graph dtype is the jax dtype itself
    signed: bool = True

    @property
    def carried(self) -> bool:
        return self.bits > 0

    @property
    def lo(self) -> int:
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def hi(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1


_NATIVE = {np.dtype(np.float64): DType.FLOAT64, np.dtype(np.float32): DType.FLOAT32,
           np.dtype(np.float16): DType.FLOAT16, np.dtype(ml_dtypes.bfloat16): DType.BFLOAT16,
           np.dtype(np.int64): DType.INT64, np.dtype(np.int32): DType.INT32,
           np.dtype(np.bool_): DType.BOOL}
_CARRIED = {np.dtype(np.uint32): Carried(DType.INT64, 32, False),
            np.dtype(np.uint16): Carried(DType.INT32, 16, False),
            np.dtype(np.uint8): Carried(DType.INT32, 8, False),
            np.dtype(np.int16): Carried(DType.INT32, 16, True),
            np.dtype(np.int8): Carried(DType.INT32, 8, True)}


def is_key(dtype) -> bool:
    """A PRNG key dtype (``key<fry>``)."""
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


#: dtype -> :func:`carried` (a dtype's device form never changes; every buffer asks)
_CARRIED_OF: dict[Any, "Carried | None"] = {}


def carried(dtype) -> Carried | None:
    """How values of jax ``dtype`` live on the device, or None (no device form: uint64,
    complex, float8 ...).  A key dtype is carried as its uint32 data."""
    try:
        return _CARRIED_OF[dtype]
    except (KeyError, TypeError):
        pass
    if is_key(dtype):
        c: Carried | None = _CARRIED[np.dtype(np.uint32)]
    else:
        try:
            dt = np.dtype(dtype)
        except TypeError:
            return None
        c = Carried(_NATIVE[dt]) if dt in _NATIVE else _CARRIED.get(dt)
    try:
        if len(_CARRIED_OF) < 1024:
            _CARRIED_OF[dtype] = c
    except TypeError:                  # an unhashable dtype-like: asked again next time
        pass
    return c


def device_dtype(dtype) -> DType | None:
    c = carried(dtype)
    return None if c is None else c.dtype


def carried_of(dtype) -> Carried:
    """:func:`carried` of a dtype that has a device form (every operand and result of an
    equation a rule sees: :func:`lower_eqn` checks); :class:`NotLowerable` for one without."""
    c = carried(dtype)
    if c is None:
        raise NotLowerable(f"{dtype} has no fornax device dtype")
    return c


def device_dtype_of(dtype) -> DType:
    """:func:`device_dtype` of a dtype that has a device form; :class:`NotLowerable` for one
    without."""
    return carried_of(dtype).dtype


def key_shape(dtype) -> tuple[int, ...]:
    """The trailing data shape of one key of a key dtype (``(2,)`` for threefry)."""
    return tuple(dtype._impl.key_shape)


def device_shape(aval) -> tuple[int, ...]:
    """The shape a value of ``aval`` has on the device (a key array adds its data dims)."""
    shape = tuple(int(d) for d in aval.shape)
    return shape + key_shape(aval.dtype) if is_key(aval.dtype) else shape


def device_nbytes(aval) -> int:
    """The bytes a value of ``aval`` takes on the device."""
    return math.prod(device_shape(aval)) * device_dtype_of(aval.dtype).itemsize


def to_device_array(value, aval, copy: bool = True) -> np.ndarray:
    """The host array the device holds for a jax ``value`` of ``aval`` (key data for a key
    array, a carried integer widened).  ``copy=False``: ``value``'s own memory where it already
    is that array (the caller copies it before ``value`` can change, as a staged copy does)."""
    if is_key(aval.dtype):
        value = jax.random.key_data(value)
    dt = device_dtype_of(aval.dtype)
    host = np.asarray(value).astype(dt.numpy, copy=False)
    host = np.array(host, order="C") if copy else np.ascontiguousarray(host)
    return host.reshape(device_shape(aval))


def from_device_array(arr: np.ndarray, aval):
    """The jax value (a numpy array, or a key array) for the device array ``arr``."""
    if is_key(aval.dtype):
        data = np.asarray(arr).astype(np.uint32)
        # jax accepts any array-like key data at run time; its annotation names only jax.Array
        return jax.random.wrap_key_data(data, impl=aval.dtype._impl.name)  # type: ignore[arg-type]
    return np.asarray(arr).astype(np.dtype(aval.dtype), copy=False).reshape(aval.shape)


class LowerCtx:
    """The graph a rule adds to, with constants shared per value and dtype.

    ``where`` names the equation being lowered (for messages); :meth:`inline` lowers a
    sub-jaxpr into the same graph (a rule whose primitive carries a jaxpr, such as a
    scatter's combiner, uses it).  ``axes``: inside a ``shard_map`` body, each mesh axis's
    (index of the device the graph runs on, size); None outside."""

    def __init__(self, graph: Graph, axes: dict[str, tuple[int, int]] | None = None):
        self.graph = graph
        self.axes = axes
        self.where = ""
        self._consts: dict = {}

    # -- building ----------------------------------------------------------------------------
    def op(self, name: str, *vals: Value, **attrs) -> Value:
        return self.graph.op(name, *vals, **attrs)

    def scalar(self, value, dtype: DType) -> Value:
        """A 0-d constant of graph dtype ``dtype`` (one per value and dtype in this graph)."""
        dtype = DType.of(dtype)
        key = (type(value).__name__, repr(value), dtype)
        if key not in self._consts:
            if not dtype.is_float and isinstance(value, float) and not math.isfinite(value):
                raise self.fail(f"{value} is not representable in {dtype}")
            self._consts[key] = self.graph.constant(np.array(value).astype(dtype.numpy), "s")
        return self._consts[key]

    def const(self, array, aval_dtype=None) -> Value:
        """A constant array; ``aval_dtype``: the jax dtype it has (converted to its device
        form), else the array's own dtype."""
        arr = np.asarray(array)
        if aval_dtype is not None:
            arr = arr.astype(device_dtype_of(aval_dtype).numpy)
        return self.graph.constant(np.array(arr, order="C"), "c")        # 0-d stays 0-d

    def cast(self, v: Value, dtype) -> Value:
        dtype = DType.of(dtype)
        return v if v.dtype is dtype else self.graph.op("cast", v, dtype=dtype.value)

    def wrap(self, v: Value, jax_dtype) -> Value:
        """Bring a carried integer back into the range of ``jax_dtype`` (two's complement
        wrap-around, as the jax type overflows); other dtypes pass through."""
        c = carried(jax_dtype)
        if c is None or not c.carried:
            return v
        mask = self.scalar((1 << c.bits) - 1, v.dtype)
        v = self.op("bitwise_and", v, mask)
        if c.signed:
            half = self.scalar(1 << (c.bits - 1), v.dtype)
            full = self.scalar(1 << c.bits, v.dtype)
            v = self.op("where", self.op("ge", v, half), self.op("sub", v, full), v)
        return v

    def fail(self, why: str) -> NotLowerable:
        return NotLowerable(f"{self.where}: {why}" if self.where else why)

    def inline(self, jaxpr, consts: list, invals: list[Value]) -> list[Value]:
        """Lower a straight-line (open) jaxpr with ``consts`` into this graph; its results."""
        where = self.where
        try:
            return lower_jaxpr(self, jaxpr, consts, invals)
        finally:
            self.where = where


# ---- the table ----------------------------------------------------------------------------------
RULES: dict[str, Callable] = {}


def lowering(*names: str):
    """Register the decorated function as the rule of each named primitive."""
    def deco(fn):
        for name in names:
            if name in RULES:
                raise ValueError(f"primitive {name!r} has two lowering rules")
            RULES[name] = fn
        return fn
    return deco


def lower_eqn(ctx: LowerCtx, eqn, invals: list[Value]) -> list[Value]:
    """Lower one equation; returns one Value per ``eqn.outvars`` (checked against their
    avals).  Raises :class:`NotLowerable` when there is no rule or the rule refuses."""
    name = eqn.primitive.name
    rule = RULES.get(name)
    if rule is None:
        raise NotLowerable(f"no fornax lowering for the jax primitive {name!r}")
    for v in (*eqn.invars, *eqn.outvars):
        dt = getattr(v.aval, "dtype", None)
        if dt is None or device_dtype(dt) is None:
            raise NotLowerable(f"{name}: {dt} has no fornax device dtype")
        if 0 in device_shape(v.aval):
            raise NotLowerable(f"{name}: zero-size arrays run on the host")
    ctx.where = name
    if any(is_key(v.aval.dtype) for v in (*eqn.invars, *eqn.outvars)) and name in KEY_LAYOUT:
        eqn, invals = _key_data_eqn(ctx, eqn, invals)
    out = rule(ctx, eqn, *invals)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    if len(outs) != len(eqn.outvars):
        raise AssertionError(f"lowering of {name} returned {len(outs)} value(s) for "
                             f"{len(eqn.outvars)} result(s)")
    for i, (v, var) in enumerate(zip(outs, eqn.outvars)):
        want = (device_shape(var.aval), device_dtype(var.aval.dtype))
        if (tuple(v.shape), v.dtype) != want:
            raise AssertionError(f"lowering of {name}: result {i} is {v.dtype}{list(v.shape)}, "
                                 f"the jaxpr says {want[1]}{list(want[0])}")
    return outs


# ---- layout primitives on key arrays ------------------------------------------------------------
def _trailing(n: int, k: tuple) -> tuple:
    return tuple(range(n, n + len(k)))


#: layout primitives that move whole keys: how their params change when the key array is seen as
#: its data (``key<fry>[*s]`` as ``uint32[*s, 2]``); ``n`` is the key array's rank, ``k`` the data dims
KEY_LAYOUT: dict[str, Callable] = {
    "broadcast_in_dim": lambda p, n, k: {**p, "shape": tuple(p["shape"]) + k, "broadcast_dimensions":
                                         tuple(p["broadcast_dimensions"]) + _trailing(len(p["shape"]), k)},
    "reshape": lambda p, n, k: {**p, "new_sizes": tuple(p["new_sizes"]) + k, "dimensions": None},
    "transpose": lambda p, n, k: {**p, "permutation": tuple(p["permutation"]) + _trailing(n, k)},
    "slice": lambda p, n, k: {**p, "start_indices": tuple(p["start_indices"]) + (0,) * len(k),
                              "limit_indices": tuple(p["limit_indices"]) + k,
                              "strides": None if p["strides"] is None else tuple(p["strides"]) + (1,) * len(k)},
    "pad": lambda p, n, k: {**p, "padding_config": tuple(p["padding_config"]) + ((0, 0, 0),) * len(k)},
    "squeeze": lambda p, n, k: p, "rev": lambda p, n, k: p, "concatenate": lambda p, n, k: p,
    "split": lambda p, n, k: p, "copy": lambda p, n, k: p, "copy_p": lambda p, n, k: p,
    "optimization_barrier": lambda p, n, k: p, "select_n": lambda p, n, k: p,
}


class _Var:
    def __init__(self, aval):
        self.aval = aval


class _DataEqn:
    """An equation on key arrays seen as one on their raw data."""

    def __init__(self, eqn, params, invars, outvars):
        self.primitive, self.params = eqn.primitive, params
        self.invars, self.outvars = invars, outvars


def _data_aval(aval):
    if not is_key(aval.dtype):
        return aval
    return jax.core.ShapedArray(device_shape(aval), np.dtype(np.uint32))


def _key_data_eqn(ctx: LowerCtx, eqn, invals: list[Value]):
    """``eqn`` (a layout primitive moving whole keys) as the same primitive on the keys' data:
    the key data dims ride along at the end; a select_n predicate is broadcast over them."""
    keyed = next(v.aval for v in (*eqn.invars, *eqn.outvars) if is_key(v.aval.dtype))
    k = key_shape(keyed.dtype)
    n = len(next(v.aval for v in eqn.invars if is_key(v.aval.dtype)).shape) \
        if any(is_key(v.aval.dtype) for v in eqn.invars) else len(keyed.shape)
    params = KEY_LAYOUT[eqn.primitive.name](dict(eqn.params), n, k)
    invars = [_Var(_data_aval(v.aval)) for v in eqn.invars]
    invals = list(invals)
    if eqn.primitive.name == "select_n" and not is_key(eqn.invars[0].aval.dtype):
        pred = eqn.invars[0].aval
        full = tuple(pred.shape) + k if pred.shape else device_shape(keyed)
        v = ctx.op("reshape", invals[0], shape=tuple(pred.shape) + (1,) * len(k)) if pred.shape else invals[0]
        invals[0] = ctx.op("broadcast_to", v, shape=full)
        invars[0] = _Var(jax.core.ShapedArray(full, pred.dtype))
    return _DataEqn(eqn, params, invars, [_Var(_data_aval(v.aval)) for v in eqn.outvars]), invals


# ---- straight-line jaxprs -----------------------------------------------------------------------
#: call primitives and the parameter holding the jaxpr they run (inlined: their body is part of
#: the caller's program; under a transformation the custom rules were applied when tracing)
CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
         "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr",
         "custom_vjp_call_jaxpr": "fun_jaxpr", "remat2": "jaxpr", "checkpoint": "jaxpr",
         "custom_lin": None}


def open_jaxpr(j):
    """(jaxpr, consts) of a ClosedJaxpr or an open Jaxpr."""
    if hasattr(j, "jaxpr") and hasattr(j, "consts"):
        return j.jaxpr, list(j.consts)
    return j, []


def call_body(eqn):
    """The jaxpr a call primitive runs, or None when ``eqn`` is not a call."""
    param = CALLS.get(eqn.primitive.name)
    if param is None:
        return None
    return eqn.params[param]


def literal(ctx: LowerCtx, lit) -> Value:
    """A graph constant for a jaxpr literal (or a closed-over constant) of its aval's type."""
    aval = lit.aval
    if is_key(aval.dtype):
        return ctx.const(to_device_array(lit.val, aval))
    return ctx.const(np.asarray(lit.val).reshape(aval.shape), aval.dtype)


def lower_jaxpr(ctx: LowerCtx, jaxpr, consts: list, invals: list[Value]) -> list[Value]:
    """Lower a straight-line jaxpr into ``ctx.graph`` (calls inlined); its results.  Raises
    :class:`NotLowerable` at the first equation that has no rule (control flow included)."""
    from jax.extend.core import Literal
    env: dict = {}

    def read(a):
        if isinstance(a, Literal):
            return literal(ctx, a)
        return env[a]
    for var, c in zip(jaxpr.constvars, consts):
        env[var] = literal(ctx, Literal(c, var.aval))
    for var, v in zip(jaxpr.invars, invals):
        env[var] = v
    for eqn in jaxpr.eqns:
        ins = [read(a) for a in eqn.invars]
        body = call_body(eqn)
        if body is not None:
            inner, inner_consts = open_jaxpr(body)
            outs = lower_jaxpr(ctx, inner, inner_consts, ins)
        else:
            outs = lower_eqn(ctx, eqn, ins)
        for var, v in zip(eqn.outvars, outs):
            env[var] = v
    return [read(a) for a in jaxpr.outvars]
