"""StableHLO in: the program JAX hands the plugin, read op by op into lax primitives.

StableHLO's ops are XLA's HLO ops, and ``jax.lax`` is a thin layer over the same ops:
``stablehlo.add`` is ``lax.add_p``, ``stablehlo.dot_general`` is ``lax.dot_general_p``
with the same dimension numbers, ``stablehlo.reduce`` whose body adds is
``lax.reduce_sum_p``, ``stablehlo.while`` is ``lax.while_p`` over the same carried
values.  :func:`to_jaxpr` walks the module's ``main`` function (and the functions it
calls) and binds, for each op, the primitive of the same semantics; traced with
``jax.make_jaxpr`` over the function's argument types this yields a jaxpr whose
equations are exactly the program's ops.  The front end's lowering rules
(:mod:`..lowering`) then put them into fornax's graph IR and the stack's compiler seam
compiles them, as for any other JAX program; control flow is driven from the host around
compiled regions (:mod:`..program`).

An op with no lax counterpart (``rng_bit_generator``, a ``custom_call``, an op of another
dialect) runs on the host, compiled alone by XLA's CPU compiler (:mod:`.host_ops`); one the
CPU compiler cannot run either is an :class:`Unsupported` error naming the op.  A lax
primitive fornax has no device rule for also runs on the host.  Both are named fallbacks
in the client's report.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax import lax
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo as shlo

from .types import Unsupported, tensor


def ints(attr) -> list[int]:
    if attr is None:
        return []
    try:
        return list(ir.DenseI64ArrayAttr(attr))
    except (ValueError, TypeError):
        pass
    try:
        return [int(v) for v in np.asarray(ir.DenseIntElementsAttr(attr)).ravel()]
    except (ValueError, TypeError):
        return [ir.IntegerAttr(x).value for x in ir.ArrayAttr(attr)]


def bools(attr) -> list[bool]:
    if attr is None:
        return []
    try:
        return list(ir.DenseBoolArrayAttr(attr))
    except (ValueError, TypeError):
        return [bool(v) for v in np.asarray(ir.DenseElementsAttr(attr)).ravel()]


def integer(attr, default: int = 0) -> int:
    return default if attr is None else ir.IntegerAttr(attr).value


def constant(attr, shape, dtype) -> np.ndarray:
    """The value of a dense elements attribute."""
    d = ir.DenseElementsAttr(attr)
    if dtype != np.dtype(jax.numpy.bfloat16):
        try:
            if d.is_splat:
                splat = d.get_splat_value()
                v = ir.FloatAttr(splat).value if np.issubdtype(dtype, np.floating) else (
                    bool(ir.BoolAttr(splat).value) if dtype == np.bool_ else ir.IntegerAttr(splat).value)
                return np.full(shape, v, dtype)
            return np.asarray(d).astype(dtype).reshape(shape)
        except (ValueError, TypeError, RuntimeError):
            pass
    return _constant_from_text(str(attr), shape, dtype)


def _constant_from_text(text: str, shape, dtype) -> np.ndarray:
    body = text[text.index("<") + 1:text.rindex(">")]
    hexed = re.fullmatch(r'"?0x([0-9A-Fa-f]+)"?', body.strip())
    if hexed:
        raw = bytes.fromhex(hexed.group(1))
        n = int(np.prod(shape, dtype=np.int64))
        if len(raw) == dtype.itemsize:           # one value, splat
            return np.full(shape, np.frombuffer(raw[::-1], dtype.newbyteorder(">"))[0], dtype)
        return np.frombuffer(raw, dtype)[:n].reshape(shape).copy()
    nums = re.findall(r"-?(?:inf|nan|0x[0-9A-Fa-f]+|[0-9.]+(?:e[-+]?\d+)?)|true|false", body)
    vals = []
    for tok in nums:
        if tok.startswith(("0x", "-0x")):
            bits = int(tok.lstrip("-"), 16)
            vals.append(np.array([bits], np.dtype(f"uint{dtype.itemsize * 8}")).view(dtype)[0])
        else:
            vals.append({"true": 1, "false": 0}.get(tok, tok))
    arr = np.array([float(v) if isinstance(v, str) else v for v in vals], dtype=np.float64).astype(dtype)
    return np.full(shape, arr[0], dtype) if arr.size == 1 else arr.reshape(shape)


# -- the op table ----------------------------------------------------------------------------------------
UNARY: dict[str, Callable] = {
    "abs": lax.abs, "cbrt": lax.cbrt, "ceil": lax.ceil, "cosine": lax.cos, "count_leading_zeros": lax.clz,
    "exponential": lax.exp, "exponential_minus_one": lax.expm1, "floor": lax.floor, "is_finite": lax.is_finite,
    "log": lax.log, "log_plus_one": lax.log1p, "logistic": lax.logistic, "negate": lax.neg, "not": lax.bitwise_not,
    "popcnt": lax.population_count, "round_nearest_even": lax.round_nearest_even if hasattr(lax, "round_nearest_even")
    else (lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN)),
    "round_nearest_afz": lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO),
    "rsqrt": lax.rsqrt, "sign": lax.sign, "sine": lax.sin, "sqrt": lax.sqrt, "tan": lax.tan, "tanh": lax.tanh,
}
BINARY: dict[str, Callable] = {
    "add": lax.add, "subtract": lax.sub, "multiply": lax.mul, "divide": lax.div, "remainder": lax.rem,
    "maximum": lax.max, "minimum": lax.min, "power": lax.pow, "atan2": lax.atan2, "and": lax.bitwise_and,
    "or": lax.bitwise_or, "xor": lax.bitwise_xor, "shift_left": lax.shift_left,
    "shift_right_arithmetic": lax.shift_right_arithmetic, "shift_right_logical": lax.shift_right_logical,
}
COMPARE = {"EQ": lax.eq, "NE": lax.ne, "LT": lax.lt, "LE": lax.le, "GT": lax.gt, "GE": lax.ge}
#: a reduction body that is one of these ops, on its two block arguments
MONOID = {"add": "sum", "maximum": "max", "minimum": "min", "multiply": "prod", "and": "and", "or": "or",
          "xor": "xor"}
OF_MONOID = {v: k for k, v in MONOID.items()}


#: ops whose operands lax broadcasts when one is a scalar
ELEMENTWISE = frozenset(BINARY) | {"compare", "select", "clamp"}


class Splat:
    """A splat constant (one value in every element) kept as its scalar until an op needs the
    whole array: ``max(x, 0)`` takes the scalar, as the jaxpr it was lowered from did."""

    def __init__(self, scalar: np.ndarray, shape: tuple[int, ...]):
        self.scalar, self.shape = scalar, tuple(shape)
        self.dtype = scalar.dtype

    def materialize(self):
        if not self.shape:
            return self.scalar                 # a concrete scalar (a reduction's init value stays known)
        return lax.broadcast_in_dim(self.scalar, self.shape, ())


def _value(v):
    return v.materialize() if isinstance(v, Splat) else v


def _monoid(region) -> str | None:
    """The name of a reduction body that applies one binary op to its two arguments."""
    block = region.blocks[0]
    ops = list(block.operations)
    if len(ops) != 2 or len(block.arguments) != 2:
        return None
    op, ret = ops
    name = op.operation.name.removeprefix("stablehlo.")
    if name not in MONOID or ret.operation.name not in ("stablehlo.return", "func.return"):
        return None
    args, operands = list(block.arguments), list(op.operands)
    if operands != args and operands != args[::-1]:
        return None
    if list(ret.operands)[0] != op.results[0]:
        return None
    return MONOID[name]


class Interpreter:
    """Binds the lax primitive of every op of a function, over traced values."""

    def __init__(self, module):
        self.module = module
        self.functions = {}
        for op in module.body.operations:
            if op.operation.name == "func.func":
                self.functions[ir.StringAttr(op.attributes["sym_name"]).value] = op
        self.ops: Counter[str] = Counter()
        #: ops run on the host by XLA's CPU compiler (:mod:`.host_ops`)
        self.host_ops: Counter[str] = Counter()

    def main(self):
        f = self.functions.get("main")
        if f is None:
            raise Unsupported("the module has no main function")
        return f

    # -- functions and regions ----------------------------------------------------------------------
    def call(self, func, args: list) -> list:
        return self.region(func.regions[0], args, {})

    def region(self, region, args: list, outer: dict) -> list:
        block = region.blocks[0]
        env = dict(outer)
        for a, v in zip(block.arguments, args):
            env[a] = v
        for op in block.operations:
            name = op.operation.name
            if name in ("func.return", "stablehlo.return"):
                return [_value(env[v]) for v in op.operands]
            self.ops[name] += 1
            results = self.op(op, name, [env[v] for v in op.operands], env)
            for r, v in zip(op.results, results):
                env[r] = v
        raise Unsupported("a region ends without a return")

    def fn(self, region, outer: dict) -> Callable:
        """A region as a Python function of its block arguments (a loop or branch body)."""
        return lambda *args: self.region(region, list(args), outer)

    # -- ops ---------------------------------------------------------------------------------------------
    def op(self, op, name: str, xs: list, env: dict) -> list:
        short = name.removeprefix("stablehlo.")
        attrs = op.attributes
        outs = [tensor(r.type) for r in op.results]
        if any(isinstance(x, Splat) for x in xs):
            if short == "broadcast_in_dim" and isinstance(xs[0], Splat):
                return [Splat(xs[0].scalar, outs[0][0])]
            full = not all(isinstance(x, Splat) for x in xs)
            # lax's elementwise ops broadcast a scalar operand; anything else gets the full array
            scalar_ok = [short in ELEMENTWISE and (short != "select" or i == 0) for i in range(len(xs))]
            xs = [x.scalar if isinstance(x, Splat) and full and ok else
                  x.materialize() if isinstance(x, Splat) else x for x, ok in zip(xs, scalar_ok)]

        def attr(key):
            return attrs[key] if key in attrs else None

        if name == "func.call":
            callee = ir.FlatSymbolRefAttr(attrs["callee"]).value
            return self.call(self.functions[callee], xs)
        if not name.startswith("stablehlo.") and name not in ("chlo.erf", "chlo.erf_inv", "chlo.lgamma",
                                                               "chlo.digamma"):
            return self.host(op, xs)
        if short in UNARY:
            return [UNARY[short](xs[0])]
        if short in BINARY:
            return [BINARY[short](xs[0], xs[1])]
        if name == "chlo.erf":
            return [lax.erf(xs[0])]
        if name == "chlo.erf_inv":
            return [lax.erf_inv(xs[0])]
        if name == "chlo.lgamma":
            return [lax.lgamma(xs[0])]
        if name == "chlo.digamma":
            return [lax.digamma(xs[0])]
        shape, dtype = outs[0] if outs else ((), np.dtype(np.float32))
        if short == "constant":
            value = constant(attr("value"), shape, dtype)
            if value.ndim == 0 or ir.DenseElementsAttr(attr("value")).is_splat:
                # one value, not a tensor of copies to upload: elementwise ops take the scalar
                return [Splat(value.reshape(-1)[:1].reshape(()), shape)]
            return [value]
        if short == "compare":
            direction = str(shlo.ComparisonDirectionAttr(attr("comparison_direction")).value)
            return [COMPARE[direction](xs[0], xs[1])]
        if short == "select":
            pred, t, f = xs
            return [lax.select_n(pred, f, t)]
        if short == "clamp":
            return [lax.clamp(xs[0], xs[1], xs[2])]
        if short == "convert":
            return [lax.convert_element_type(xs[0], dtype)]
        if short == "bitcast_convert":
            return [lax.bitcast_convert_type(xs[0], dtype)]
        if short == "broadcast_in_dim":
            return [lax.broadcast_in_dim(xs[0], shape, ints(attr("broadcast_dimensions")))]
        if short == "reshape":
            return [lax.reshape(xs[0], shape)]
        if short == "transpose":
            return [lax.transpose(xs[0], ints(attr("permutation")))]
        if short == "reverse":
            return [lax.rev(xs[0], ints(attr("dimensions")))]
        if short == "slice":
            return [lax.slice(xs[0], ints(attr("start_indices")), ints(attr("limit_indices")),
                              ints(attr("strides")) or None)]
        if short == "dynamic_slice":
            return [lax.dynamic_slice(xs[0], xs[1:], ints(attr("slice_sizes")))]
        if short == "dynamic_update_slice":
            return [lax.dynamic_update_slice(xs[0], xs[1], xs[2:])]
        if short == "concatenate":
            return [lax.concatenate(xs, integer(attr("dimension")))]
        if short == "iota":
            return [lax.broadcasted_iota(dtype, shape, integer(attr("iota_dimension")))]
        if short == "pad":
            lo, hi, inner = ints(attr("edge_padding_low")), ints(attr("edge_padding_high")), ints(attr("interior_padding"))
            return [lax.pad(xs[0], xs[1], list(zip(lo, hi, inner)))]
        if short == "dot_general":
            dn = shlo.DotDimensionNumbers(attr("dot_dimension_numbers"))
            dims = ((list(dn.lhs_contracting_dimensions), list(dn.rhs_contracting_dimensions)),
                    (list(dn.lhs_batching_dimensions), list(dn.rhs_batching_dimensions)))
            return [lax.dot_general(xs[0], xs[1], dims, preferred_element_type=dtype)]
        if short == "convolution":
            return [self._convolution(xs, attr, dtype)]
        if short == "reduce":
            return self._reduce(op, xs, attr, env)
        if short == "reduce_window":
            return self._reduce_window(op, xs, attr, env)
        if short == "select_and_scatter":
            return [self._select_and_scatter(op, xs, attr)]
        if short == "gather":
            return [self._gather(xs, attr)]
        if short == "scatter":
            return [self._scatter(op, xs, attr, env)]
        if short == "sort":
            return self._sort(op, xs, attr)
        if short == "while":
            n = len(xs)
            cond, body = self.fn(op.regions[0], env), self.fn(op.regions[1], env)
            out = lax.while_loop(lambda c: cond(*c)[0], lambda c: tuple(body(*c)), tuple(xs))
            return list(out)[:n]
        if short == "if":
            t, f = self.fn(op.regions[0], env), self.fn(op.regions[1], env)
            return list(lax.cond(xs[0], lambda: tuple(t()), lambda: tuple(f())))
        if short == "case":
            branches = [self.fn(r, env) for r in op.regions]
            return list(lax.switch(xs[0], [lambda b=b: tuple(b()) for b in branches]))
        if short == "optimization_barrier":
            return list(lax.optimization_barrier(tuple(xs)))
        if short == "custom_call":
            target = ir.StringAttr(attrs["call_target_name"]).value
            if target in ("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape"):
                return list(xs)                  # a sharding annotation: on one device, the value itself
        return self.host(op, xs)                 # no lax counterpart (rng_bit_generator, custom_call, ...)

    def host(self, op, xs: list) -> list:
        from .host_ops import host_op
        self.host_ops[op.operation.name] += 1
        return host_op(op, [_value(x) for x in xs])

    # -- structured ops ---------------------------------------------------------------------------------
    def _convolution(self, xs, attr, dtype):
        dn = shlo.ConvDimensionNumbers(attr("dimension_numbers"))
        lhs_spec = (dn.input_batch_dimension, dn.input_feature_dimension, *dn.input_spatial_dimensions)
        rhs_spec = (dn.kernel_output_feature_dimension, dn.kernel_input_feature_dimension,
                    *dn.kernel_spatial_dimensions)
        out_spec = (dn.output_batch_dimension, dn.output_feature_dimension, *dn.output_spatial_dimensions)
        nsp = len(dn.input_spatial_dimensions)
        pad = ints(attr("padding"))
        padding = [(pad[2 * i], pad[2 * i + 1]) for i in range(nsp)] if pad else [(0, 0)] * nsp
        if bools(attr("window_reversal")) and any(bools(attr("window_reversal"))):
            raise Unsupported("stablehlo.convolution with window_reversal")
        return lax.conv_general_dilated(
            xs[0], xs[1], window_strides=ints(attr("window_strides")) or [1] * nsp, padding=padding,
            lhs_dilation=ints(attr("lhs_dilation")) or None, rhs_dilation=ints(attr("rhs_dilation")) or None,
            dimension_numbers=lax.ConvDimensionNumbers(lhs_spec, rhs_spec, out_spec),
            feature_group_count=integer(attr("feature_group_count"), 1),
            batch_group_count=integer(attr("batch_group_count"), 1), preferred_element_type=dtype)

    def _reduce(self, op, xs, attr, env):
        n = len(xs) // 2
        operands, inits = xs[:n], xs[n:]
        dims = tuple(ints(attr("dimensions")))
        kind = _monoid(op.regions[0]) if n == 1 else None
        if kind is not None:
            fn = BINARY[OF_MONOID[kind]]
            r = lax.reduce(operands[0], _identity(kind, np.dtype(operands[0].dtype)), fn, dims)
            if not _is_identity(inits[0], kind):
                r = fn(r, inits[0])
            return [r]
        body = self.fn(op.regions[0], env)

        def computation(acc, x):
            out = body(*acc, *x)
            return tuple(out)
        return list(lax.reduce(tuple(operands), tuple(inits), computation, dims))

    def _reduce_window(self, op, xs, attr, env):
        n = len(xs) // 2
        operands, inits = xs[:n], xs[n:]
        nd = len(np.shape(operands[0]))
        dims = ints(attr("window_dimensions"))
        strides = ints(attr("window_strides")) or [1] * nd
        pad = ints(attr("padding"))
        padding = [(pad[2 * i], pad[2 * i + 1]) for i in range(nd)] if pad else [(0, 0)] * nd
        base = ints(attr("base_dilations")) or [1] * nd
        win = ints(attr("window_dilations")) or [1] * nd
        kind = _monoid(op.regions[0]) if n == 1 else None
        if kind in ("sum", "max", "min") and _is_identity(inits[0], kind):
            return [lax.reduce_window(operands[0], _identity(kind, np.dtype(operands[0].dtype)),
                                      BINARY[OF_MONOID[kind]], dims, strides, padding, base, win)]
        body = self.fn(op.regions[0], env)
        out = lax.reduce_window(tuple(operands), tuple(inits), lambda a, b: tuple(body(*a, *b)), dims, strides,
                                padding, base, win)
        return list(out)

    def _select_and_scatter(self, op, xs, attr):
        from jax._src.lax.windowed_reductions import _select_and_scatter_add
        operand, source, init = xs
        sel = list(op.regions[0].blocks[0].operations)[0]
        direction = str(shlo.ComparisonDirectionAttr(sel.attributes["comparison_direction"]).value)
        if _monoid(op.regions[1]) != "sum" or not _is_identity(init, "sum"):
            raise Unsupported("stablehlo.select_and_scatter whose scatter is not an addition from zero")
        prim = {"GE": lax.ge_p, "LE": lax.le_p, "GT": lax.gt_p, "LT": lax.lt_p}[direction]
        nd = len(np.shape(operand))
        pad = ints(attr("padding"))
        padding = [(pad[2 * i], pad[2 * i + 1]) for i in range(nd)] if pad else [(0, 0)] * nd
        return _select_and_scatter_add(source, operand, prim, tuple(ints(attr("window_dimensions"))),
                                       tuple(ints(attr("window_strides")) or [1] * nd), tuple(padding))

    def _gather(self, xs, attr):
        operand, idx = xs
        dn = shlo.GatherDimensionNumbers(attr("dimension_numbers"))
        ivd = dn.index_vector_dim
        if ivd != len(np.shape(idx)) - 1:
            idx = lax.expand_dims(idx, (len(np.shape(idx)),)) if ivd == len(np.shape(idx)) else \
                jax.numpy.moveaxis(idx, ivd, -1)
        gdn = lax.GatherDimensionNumbers(
            offset_dims=tuple(dn.offset_dims), collapsed_slice_dims=tuple(dn.collapsed_slice_dims),
            start_index_map=tuple(dn.start_index_map), operand_batching_dims=tuple(dn.operand_batching_dims),
            start_indices_batching_dims=tuple(dn.start_indices_batching_dims))
        return lax.gather(operand, idx, gdn, tuple(ints(attr("slice_sizes"))),
                          indices_are_sorted=bool(attr("indices_are_sorted") and ir.BoolAttr(attr("indices_are_sorted")).value),
                          mode=lax.GatherScatterMode.CLIP)

    def _scatter(self, op, xs, attr, env):
        if len(xs) != 3:
            raise Unsupported("stablehlo.scatter of several operands")
        operand, idx, updates = xs
        dn = shlo.ScatterDimensionNumbers(attr("scatter_dimension_numbers"))
        if dn.index_vector_dim != len(np.shape(idx)) - 1:
            if dn.index_vector_dim == len(np.shape(idx)):
                idx = lax.expand_dims(idx, (len(np.shape(idx)),))
            else:
                raise Unsupported("stablehlo.scatter with the index vector not in the last dimension")
        sdn = lax.ScatterDimensionNumbers(
            update_window_dims=tuple(dn.update_window_dims), inserted_window_dims=tuple(dn.inserted_window_dims),
            scatter_dims_to_operand_dims=tuple(dn.scattered_dims_to_operand_dims),
            operand_batching_dims=tuple(dn.input_batching_dims),
            scatter_indices_batching_dims=tuple(dn.scatter_indices_batching_dims))
        block = op.regions[0].blocks[0]
        ops = list(block.operations)
        kind = _monoid(op.regions[0])
        fn = {"sum": lax.scatter_add, "prod": lax.scatter_mul, "max": lax.scatter_max, "min": lax.scatter_min}.get(kind or "")
        if fn is None:
            if len(ops) == 1 and list(ops[0].operands)[0] == block.arguments[1]:
                fn = lax.scatter                     # the update replaces the value
            else:
                raise Unsupported("stablehlo.scatter with a combiner other than add/mul/max/min/replace")
        sorted_ = bool(attr("indices_are_sorted") and ir.BoolAttr(attr("indices_are_sorted")).value)
        unique = bool(attr("unique_indices") and ir.BoolAttr(attr("unique_indices")).value)
        return fn(operand, idx, updates, sdn, indices_are_sorted=sorted_, unique_indices=unique,
                  mode=lax.GatherScatterMode.FILL_OR_DROP)

    def _sort(self, op, xs, attr):
        """jax's comparators sort ascending, lexicographically over the first ``num_keys``
        operands (total order: -0 and NaN made canonical first); the keys are the operand
        pairs the comparator reads."""
        dim = integer(attr("dimension"))
        block = op.regions[0].blocks[0]
        args = list(block.arguments)
        used: set[int] = set()

        def visit(o):
            for v in o.operands:
                for i, a in enumerate(args):
                    if v == a:
                        used.add(i // 2)
            for r in o.regions:
                for inner in r.blocks[0].operations:
                    visit(inner)
        compares = []
        for o in block.operations:
            visit(o)
            if o.operation.name == "stablehlo.compare":
                compares.append(str(shlo.ComparisonDirectionAttr(o.attributes["comparison_direction"]).value))
        if "LT" not in compares or "GT" in compares:
            raise Unsupported("stablehlo.sort with a comparator other than jax's ascending order")
        keys = max(used) + 1 if used else 1
        if used != set(range(keys)):
            raise Unsupported("stablehlo.sort whose comparator skips an operand")
        stable = bool(attr("is_stable") and ir.BoolAttr(attr("is_stable")).value)
        return list(lax.sort(tuple(xs), dimension=dim, is_stable=stable, num_keys=keys))


def _identity(kind: str, dtype: np.dtype) -> np.ndarray:
    """The identity of the reduction ``kind`` in ``dtype`` (a concrete value, so that jax
    recognises the monoid and binds ``reduce_sum`` / ``reduce_window_max`` ...)."""
    if kind in ("sum", "or", "xor"):
        return np.zeros((), dtype)
    if kind == "prod":
        return np.ones((), dtype)
    if kind == "and":
        return np.array(True if dtype == np.bool_ else -1).astype(dtype)
    if dtype == np.bool_:
        return np.array(kind == "min")
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.array(info.min if kind == "max" else info.max, dtype)
    return np.array(-np.inf if kind == "max" else np.inf, dtype)


def _is_identity(init, kind: str) -> bool:
    """Whether ``init`` is a concrete identity of the reduction ``kind``."""
    try:
        v = np.asarray(init)
    except Exception:                         # a traced init value: not known to be the identity
        return False
    return v.dtype != object and bool(np.all(v == _identity(kind, v.dtype)))


def to_jaxpr(module) -> tuple[Any, Counter]:
    """The ClosedJaxpr of ``module``'s main function, and the count of each op it read."""
    interp = Interpreter(module)
    main = interp.main()
    ftype = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
    avals = []
    for t in ftype.inputs:
        shape, dtype = tensor(t)
        avals.append(jax.ShapeDtypeStruct(shape, dtype))
    with jax.enable_x64(True):
        closed = jax.make_jaxpr(lambda *a: interp.call(main, list(a)))(*avals)
    return closed, interp.ops
