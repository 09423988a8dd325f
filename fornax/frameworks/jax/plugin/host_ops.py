"""StableHLO ops with no lax counterpart, run on the host: named fallbacks.

A ``custom_call``, ``rng_bit_generator`` or any op the plugin has no lax primitive for is cut
out of the program as a module of its own (the op, its operands as parameters, its results
returned) and compiled by XLA's CPU compiler, the host's own implementation of StableHLO.
In the jaxpr it becomes one equation of a primitive named after the op
(``stablehlo.rng_bit_generator``) that has no fornax device rule, so the program runs it
on the host between compiled segments, as any fallback, and the client's report counts it
with its reason.  An op the CPU compiler cannot run either (a custom call into a vendor
library, an op that reads values from outside itself) is refused when the program is
compiled, naming the op and XLA's reason.
"""

from __future__ import annotations

from functools import lru_cache

import jax
import numpy as np
from jax.extend.core import Primitive
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func as func_d

from .. import program
from .types import Unsupported, tensor

#: the reason the client's report gives for every op run this way
REASON = "no lax counterpart: XLA's CPU compiler runs this StableHLO op on the host"

_PRIMITIVES: dict[str, Primitive] = {}


def one_op_module(op) -> str:
    """The text of a module whose ``main`` is ``op`` alone, its operands as parameters."""
    with ir.Location.unknown(op.context):
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            ftype = ir.FunctionType.get([v.type for v in op.operands], [r.type for r in op.results])
            fn = func_d.FuncOp("main", ftype)
            fn.attributes["sym_visibility"] = ir.StringAttr.get("public")
            block = fn.add_entry_block()  # type: ignore[attr-defined]  # in the bindings, not their stubs
            with ir.InsertionPoint(block):
                clone = op.operation.clone()
                for i, arg in enumerate(block.arguments):
                    clone.operands[i] = arg
                func_d.ReturnOp(list(clone.results))
        return str(module)


@lru_cache(maxsize=256)
def _compiled(text: str):
    from jax._src.lib import xla_client as xc
    cpu = jax.devices("cpu")[0]
    return cpu.client.compile_and_load(text, xc.DeviceList((cpu,)), xc.CompileOptions())


def _impl(*args, module: str, outs: tuple):
    cpu = jax.devices("cpu")[0]
    with jax.enable_x64(True):           # a 64-bit operand stays 64-bit (the module's types are exact)
        results = _compiled(module).execute([jax.device_put(np.asarray(a), cpu) for a in args])
        return [np.asarray(r) for r in results]


def _abstract(*avals, module: str, outs: tuple):
    from jax.core import ShapedArray
    return [ShapedArray(shape, np.dtype(dtype)) for shape, dtype in outs]


def _refuse(builder, e) -> str:
    """The program builder's hook: always the host, with the reason."""
    return REASON


def primitive(name: str) -> Primitive:
    """The primitive standing for StableHLO op ``name`` (made once per op name)."""
    p = _PRIMITIVES.get(name)
    if p is None:
        p = _PRIMITIVES[name] = Primitive(name)
        p.multiple_results = True
        p.def_impl(_impl)
        p.def_abstract_eval(_abstract)
        program.INSTRUCTIONS[name] = _refuse
    return p


def host_op(op, xs: list) -> list:
    """``op`` on the host: checked now (the CPU compiler must take it), run when the program runs."""
    name = op.operation.name
    outs = tuple((tuple(int(d) for d in shape), np.dtype(dtype).name)
                 for shape, dtype in (tensor(r.type) for r in op.results))
    try:
        text = one_op_module(op)
        _compiled(text)
    except Exception as exc:
        raise Unsupported("neither the fornax device nor XLA's CPU compiler runs it: "
                          f"{' '.join(str(exc).split())[:300]}", op=name) from None
    return list(primitive(name).bind(*xs, module=text, outs=outs))
