"""``PJRT_Client_Compile``: a StableHLO module in, an executable of the stack out.

The module arrives as MLIR bytecode (a StableHLO portable artifact, or plain bytecode) with
serialized ``CompileOptionsProto`` s.  :func:`compile_program` reads both, turns the
``main`` function into a jaxpr of lax primitives (:mod:`.stablehlo`) and builds a fornax
program for the device the options assign (:func:`..program.build_program`): segments of
graph IR compiled by the stack's compiler seam, control flow around them on the host,
named host fallbacks.
"""

from __future__ import annotations

import re
import time
from collections import Counter

import jax
import numpy as np

from ..program import build_program
from . import capi
from .objects import Client, Executable
from .stablehlo import to_jaxpr
from .types import Unsupported
from .table import PjrtError


class Compiled:
    """One compiled program on one device: what ``PJRT_LoadedExecutable_Execute`` runs."""

    def __init__(self, name: str, program, out_avals: list, donated: list[int], ops: Counter,
                 compile_s: float = 0.0):
        self.name, self.program, self.out_avals, self.donated, self.ops = name, program, out_avals, donated, ops
        #: host seconds from the bytes JAX handed over to the compiled program
        self.compile_s = compile_s

    def execute(self, device, args: list, donate: list[int]) -> list:
        prog = self.program
        if len(args) != len(prog.ins):
            raise PjrtError(f"{self.name} takes {len(prog.ins)} argument(s), got {len(args)}", capi.INVALID_ARGUMENT)
        for i, (b, ref) in enumerate(zip(args, prog.ins)):
            if tuple(b.shape) != tuple(ref.aval.shape) or np.dtype(b.dtype) != np.dtype(ref.aval.dtype):
                raise PjrtError(f"{self.name}: argument {i} is {b.dtype}{list(b.shape)}, the program takes "
                                f"{ref.aval.str_short()}", capi.INVALID_ARGUMENT)
            if b.placement is not device.placement():
                raise PjrtError(f"{self.name}: argument {i} is on fornax:{b.placement.index}, the program runs on "
                                f"{device.describe()}", capi.INVALID_ARGUMENT,
                                hint="jax.device_put the argument onto the executable's device")
        client = device.client.fornax
        with client.lock:
            client.counts["executions"] += 1
            # the jaxpr was traced with 64-bit types enabled (StableHLO's types are exact): its
            # host fallbacks run the same way, so a 64-bit value stays 64-bit
            with jax.enable_x64(True):
                outs = prog.run(list(args))
            for k, b in enumerate(outs):
                if not hasattr(b, "placement"):
                    raise PjrtError(f"{self.name}: result {k} ({b.aval.str_short()}) has no fornax device form",
                                    capi.UNIMPLEMENTED)
            outs = device.placement().own_results(args, outs)
            for i in donate:                 # donation: the input's memory goes back at once
                args[i].delete()
            return outs

    def cost(self) -> dict:
        return {"stablehlo_ops": int(sum(self.ops.values()))}

    def memory_stats(self) -> dict:
        def nbytes(avals):
            return int(sum(int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize for a in avals))
        return {"argument_size_in_bytes": nbytes([r.aval for r in self.program.ins]),
                "output_size_in_bytes": nbytes(self.out_avals)}


def parse_module(fmt: str, code: bytes):
    """The StableHLO module of a ``PJRT_Program`` (format ``mlir``)."""
    from jax._src.interpreters import mlir as jmlir
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo
    if fmt != "mlir":
        raise PjrtError(f"program format {fmt!r}: the fornax plugin compiles StableHLO (format 'mlir'), "
                        "not serialized HLO", capi.INVALID_ARGUMENT)
    ctx = jmlir.make_ir_context()
    with ctx:
        try:
            module = stablehlo.deserialize_portable_artifact(ctx, code)
        except Exception:
            try:
                module = ir.Module.parse(code)
            except Exception as exc:
                raise PjrtError(f"the program is neither a StableHLO portable artifact nor MLIR: {exc}",
                                capi.INVALID_ARGUMENT) from None
    return ctx, module


def compile_options(options: bytes) -> tuple[int, int, int | None]:
    """(replicas, partitions, assigned device id or None) from a serialized CompileOptionsProto."""
    from jax._src.lib import xla_client as xc
    opts = xc.CompileOptions.ParseFromString(options)
    build = opts.executable_build_options
    replicas, partitions = max(1, build.num_replicas), max(1, build.num_partitions)
    da = build.device_assignment
    device = None
    if da is not None:
        # jaxlib shows a DeviceAssignment only as text: DeviceAssignment{..., Computation0{3}}
        m = re.search(r"Computation0\{(\d+)", str(da))
        device = int(m.group(1)) if m else None
    return replicas, partitions, device


def compile_program(client: Client, fmt: str, code: bytes, options: bytes) -> Executable:
    t0 = time.perf_counter()
    replicas, partitions, device_id = compile_options(options)
    if replicas * partitions != 1:
        raise PjrtError(f"a program of {replicas} replica(s) x {partitions} partition(s): the fornax plugin "
                        "compiles single-device programs", capi.UNIMPLEMENTED,
                        hint="multi-device programs (shard_map, pmap) run through fornax.frameworks.jax")
    index = 0 if device_id is None else device_id
    if not 0 <= index < len(client.devices):
        raise PjrtError(f"the options assign device {device_id}; the stack has {len(client.devices)}",
                        capi.INVALID_ARGUMENT)
    device = client.devices[index]
    ctx, module = parse_module(fmt, code)
    with ctx:
        text = str(module.operation)
        from jaxlib.mlir import ir
        main = None
        for op in module.body.operations:
            if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
                main = op
        name = "main"
        if "sym_name" in module.operation.attributes:
            name = ir.StringAttr(module.operation.attributes["sym_name"]).value
        donated = []
        if main is not None and "arg_attrs" in main.attributes:
            for i, a in enumerate(ir.ArrayAttr(main.attributes["arg_attrs"])):
                d = ir.DictAttr(a)
                if "tf.aliasing_output" in d or "jax.buffer_donor" in d:
                    donated.append(i)
        try:
            closed, ops = to_jaxpr(module)
        except PjrtError:                    # Unsupported included: it names the op already
            raise
        except Exception as exc:
            raise Unsupported(f"{name}: the StableHLO could not be read into lax primitives: "
                              f"{type(exc).__name__}: {exc}") from None
    with device.placement().current():
        program = build_program(device.placement(), closed, name)
    out_avals = [v.aval for v in closed.jaxpr.outvars]
    exe = Executable(client, device, Compiled(name, program, out_avals, donated, ops,
                                              time.perf_counter() - t0), text)
    exe.code_bytes = len(code)
    client.executables.append(exe)
    return exe
