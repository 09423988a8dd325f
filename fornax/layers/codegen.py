"""Kernel generators: graph pieces -> tile-ISA programs.

Shared by every compiler and library: a family's code differs only in the
tile shapes it asks for (from its SIMD width and matrix instruction shape)
and in the container its programs are shipped in.

Three kernel shapes cover the foundation:

* **pointwise**: a fused chain of elementwise ops over one iteration space,
  flattened and cut into blocks of ``block`` elements;
* **reduction**: a fused chain of elementwise ops and reductions along one
  axis, one program instance per output row, the whole row in one tile;
* **gemm**: a tiled matrix multiply (``Dot`` accumulating in fp32, or fp64
  for fp64 inputs) over a K loop, with an optional fused elementwise epilogue.

Every generator indexes its operands through the same rule: the multi-index
of the iteration space, broadcast onto each operand's shape (NumPy rules,
dims aligned right), so bias vectors, row statistics and scalars all load
correctly without materialising a broadcast.

The pieces live in their own modules, re-exported here: the kernel builder
and index helpers (:mod:`fornax.layers.kernel_builder`), the node emitter and
its op tables (:mod:`fornax.layers.emitter`), the indexed-op generators it is
handed (:mod:`fornax.layers.codegen_nn`) and the static cost estimates
(:mod:`fornax.layers.kernel_estimate`).
"""

from __future__ import annotations

import math
from typing import overload

from ..sim import fastpath, isa
from .errors import CompileError
from .codegen_nn import EMITTERS
from .emitter import (BOOL_BITWISE, ELEMENTWISE, IDENTITY, LAYOUT, REDUCTIONS, Emitter, inner_layout,
                      IndexedEmitter, gelu, identity)
from .graph import DType, Node, Value
from .kernel_builder import (POINTWISE_REGISTERS, Grid, KernelBuilder, Operand, next_pow2, offsets,
                             strides)
from .kernel_estimate import Estimate, attach_estimate, footprint, pointwise_estimate, static_counters

#: the private name blas.py has imported GELU by (kept so its import keeps working)
_gelu = gelu

__all__ = ["BOOL_BITWISE", "ELEMENTWISE", "EMITTERS", "IDENTITY", "LAYOUT", "POINTWISE_REGISTERS",
           "REDUCTIONS", "Emitter", "Grid", "IndexedEmitter", "KernelBuilder", "Operand", "gelu",
           "gemm_kernel", "identity", "next_pow2", "offsets", "pointwise_estimate",
           "pointwise_kernel", "reduction_kernel", "static_counters", "strides"]


def _bind(kb: KernelBuilder, inputs: list[Value],
          outputs: list[Value]) -> tuple[dict[int, Operand], dict[int, Operand]]:
    """Declare the ``in<i>`` and ``out<i>`` buffer parameters, keyed by ``id`` of their value."""
    ins: dict[int, Operand] = {}
    outs: dict[int, Operand] = {}
    for i, v in enumerate(inputs):
        ins[id(v)] = Operand(kb.param(f"in{i}", "ptr", v.dtype.value), v)
    for i, v in enumerate(outputs):
        outs[id(v)] = Operand(kb.param(f"out{i}", "ptr", v.dtype.value), v)
    return ins, outs


def _flat_index(kb: KernelBuilder, flat: str, space: tuple[int, ...]) -> list[str]:
    """The multi-index over ``space`` of the row-major flat index ``flat``."""
    index = []
    for d, (size, st) in enumerate(zip(space, strides(space))):
        q = flat if st == 1 else kb.binary("floordiv", flat, kb.const(st, "int64"))
        index.append(q if d == 0 else kb.binary("mod", q, kb.const(size, "int64")))
    return index


def pointwise_kernel(name: str, nodes: list[Node], inputs: list[Value], outputs: list[Value],
                     space: tuple[int, ...], block: int, group_size: int) -> tuple[isa.Program, Grid]:
    """A fused elementwise kernel; returns (program, grid)."""
    kb = KernelBuilder(name)
    ins, outs = _bind(kb, inputs, outputs)
    n = math.prod(space)
    block = min(block, next_pow2(n))
    flat = kb.iadd(kb.imul(kb.pid(0), block), kb.arange(block))
    mask = kb.binary("lt", flat, kb.const(n, "int64"))
    em = Emitter(kb, space, _flat_index(kb, flat, space), mask, ins, EMITTERS)
    em.chained = inner_layout(nodes, outputs)
    for node in nodes:
        if id(node) not in em.chained:
            em.node(node)
    for v in outputs:
        em.store(v, outs[id(v)].param, mask)
    grid: Grid = (math.ceil(n / block), 1, 1)
    program = kb.program(group_size=group_size, kind="pointwise", block=block,
                         registers=POINTWISE_REGISTERS, shared_memory=0)
    fast = _scatter_fast(nodes, outputs, ins, outs)
    if fast is not None:
        program.meta["fast"] = fast
    return attach_estimate(program, pointwise_estimate(program, grid, mask, n, ins, outs, em.active)), grid


def _scatter_fast(nodes: list[Node], outputs: list[Value], ins: dict[int, Operand],
                  outs: dict[int, Operand]) -> dict[str, object] | None:
    """The fast-path description (:mod:`fornax.sim.fastpath`) of a kernel that is one
    scatter-add and its store, None for any other kernel."""
    if len(nodes) != 1 or nodes[0].op != "scatter" or nodes[0].attrs.get("mode", "add") != "add" \
            or len(outputs) != 1 or outputs[0] is not nodes[0].outputs[0]:
        return None
    x, idx, upd = nodes[0].inputs
    if idx.shape != upd.shape or len({id(x), id(idx), id(upd)}) != 3:
        return None
    return fastpath.describe("scatter_add", x=ins[id(x)].param, index=ins[id(idx)].param,
                             upd=ins[id(upd)].param, out=outs[id(outputs[0])].param,
                             axis=nodes[0].attrs.get("axis", 0) % len(x.shape),
                             x_shape=list(x.shape), upd_shape=list(upd.shape))


def reduction_kernel(name: str, nodes: list[Node], inputs: list[Value], outputs: list[Value],
                     space: tuple[int, ...], axis: int,
                     group_size: int) -> tuple[isa.Program, Grid]:
    """A fused kernel reducing along ``axis`` of ``space``: one instance per row."""
    kb = KernelBuilder(name)
    ins, outs = _bind(kb, inputs, outputs)
    length = space[axis]
    width = next_pow2(length)
    outer = tuple(s for d, s in enumerate(space) if d != axis)
    rows = math.prod(outer)
    pid = kb.pid(0)
    row_index = _flat_index(kb, pid, outer) if outer else []
    col = kb.arange(width)
    index = list(row_index)
    index.insert(axis, col)
    mask = kb.binary("lt", col, kb.const(length, "int64")) if width != length else None
    em = Emitter(kb, space, index, mask, ins, EMITTERS)
    em.mask_dims = (axis,)
    em.chained = inner_layout(nodes, outputs)
    for node in nodes:
        if id(node) not in em.chained:
            em.node(node, reduce_axis_tile=-1)
    for v in outputs:
        full = len(v.shape) == len(space) and v.shape[axis] == length
        if full:
            em.store(v, outs[id(v)].param, mask)
        else:
            # a reduced value: one element per row, laid out like the row index
            offs = offsets(kb, tuple(s for d, s in enumerate(space) if d != axis) or (1,),
                            outer or (1,), row_index or [None])
            kb.emit(isa.Store(outs[id(v)].param, offs, em.value(v), None))
    program = kb.program(group_size=group_size, kind="reduction", width=width,
                         registers=POINTWISE_REGISTERS, shared_memory=group_size * 8)  # partials
    grid: Grid = (rows, 1, 1)
    # the row mask, and the masks of masked loads (slice, pad, concat) inside the row
    active = {mask: rows * length} if mask is not None else {}
    est = static_counters(program, grid, {**active, **em.active})
    est.update(kind="counters",
               read=footprint([(o.param, o.value.type.nbytes) for o in ins.values()]),
               write=footprint([(o.param, o.value.type.nbytes) for o in outs.values()]))
    return attach_estimate(program, est), grid


@overload
def gemm_kernel(name: str, dtype: DType, m: int, n: int, k: int, batch: int,
                b_batched: bool, tile: tuple[int, int, int], group_size: int,
                epilogue: list[Node] | None = None, product: Value | None = None,
                extra_inputs: list[Value] | None = None, outputs: list[Value] | None = None,
                trans_a: bool = False, trans_b: bool = False) -> tuple[isa.Program, Grid]: ...


@overload
def gemm_kernel(name: str, dtype: DType, m: str, n: str, k: str, batch: int,
                b_batched: bool, tile: tuple[int, int, int], group_size: int,
                epilogue: list[Node] | None = None, product: Value | None = None,
                extra_inputs: list[Value] | None = None, outputs: list[Value] | None = None,
                trans_a: bool = False, trans_b: bool = False) -> tuple[isa.Program, None]: ...


def gemm_kernel(name: str, dtype: DType, m: int | str, n: int | str, k: int | str, batch: int,
                b_batched: bool, tile: tuple[int, int, int], group_size: int,
                epilogue: list[Node] | None = None, product: Value | None = None,
                extra_inputs: list[Value] | None = None, outputs: list[Value] | None = None,
                trans_a: bool = False, trans_b: bool = False) -> tuple[isa.Program, Grid | None]:
    """Tiled GEMM ``C[b] = op(A[b]) @ op(B[b])`` with an optional fused elementwise epilogue.

    ``trans_a`` / ``trans_b``: the operand is stored transposed (A as k x m, B as
    n x k, row-major) and read through transposed offsets, so the tile the matrix
    unit sees is the same and nothing is copied.

    ``m``, ``n``, ``k`` are either sizes baked into the kernel (a compiler's
    specialised kernel) or the names of scalar parameters (a library's
    shape-generic kernel, launched for any size; its grid, returned as None,
    comes from the launch).  Parameters are ``a``, ``b``, then the epilogue's
    extra inputs ``in0..``, then ``c`` (or the epilogue outputs ``out0..``),
    then the size scalars.  An epilogue needs baked-in sizes, ``product`` (the
    GEMM's value in the graph) and ``outputs``.
    """
    bm, bn, bk = tile
    if isinstance(m, int) and isinstance(n, int) and isinstance(k, int):
        bm, bn, bk = min(bm, next_pow2(m)), min(bn, next_pow2(n)), min(bk, next_pow2(k))
    kb = KernelBuilder(name)
    dt = dtype.value
    acc_dt = "float64" if dtype is DType.FLOAT64 else "float32"
    pa, pb = kb.param("a", "ptr", dt), kb.param("b", "ptr", dt)
    epilogue = epilogue or []
    extra = extra_inputs or []
    ins = {id(v): Operand(kb.param(f"in{i}", "ptr", v.dtype.value), v) for i, v in enumerate(extra)}
    outs: dict[int, Operand] = {}
    if epilogue:
        outs = {id(v): Operand(kb.param(f"out{i}", "ptr", v.dtype.value), v)
                for i, v in enumerate(outputs or [])}
    pc = None if epilogue else kb.param("c", "ptr", dt)

    def dim(x: int | str) -> str:
        """The register of size ``x``: a constant, or the scalar parameter named ``x``."""
        if isinstance(x, int):
            return kb.const(x, "int64")
        kb.param(x, "scalar", "int64")
        return kb.emit(isa.ScalarArg(kb.reg(), x))

    def scale(reg: str, x: int | str, x_reg: str | None = None) -> str:
        """``reg * x``: by a baked-in size, or by the register of a generic one (``x_reg``,
        or ``x`` itself when ``x`` is a register)."""
        if isinstance(x, int):
            return kb.imul(reg, x)
        return kb.binary("mul", reg, x if x_reg is None else x_reg)

    m_r, n_r, k_r = dim(m), dim(n), dim(k)
    mk = m * k if isinstance(m, int) and isinstance(k, int) else kb.binary("mul", m_r, k_r)
    kn = k * n if isinstance(k, int) and isinstance(n, int) else kb.binary("mul", k_r, n_r)
    mn = m * n if isinstance(m, int) and isinstance(n, int) else kb.binary("mul", m_r, n_r)

    pid_n, pid_m, pid_b = kb.pid(0), kb.pid(1), kb.pid(2)
    rm = kb.emit(isa.Reshape(kb.reg(), kb.iadd(kb.imul(pid_m, bm), kb.arange(bm)), (bm, 1)))
    rn = kb.emit(isa.Reshape(kb.reg(), kb.iadd(kb.imul(pid_n, bn), kb.arange(bn)), (1, bn)))
    rk_row = kb.emit(isa.Reshape(kb.reg(), kb.arange(bk), (1, bk)))
    rk_col = kb.emit(isa.Reshape(kb.reg(), kb.arange(bk), (bk, 1)))
    a_base = scale(pid_b, mk)
    b_base = scale(pid_b, kn) if b_batched else None
    mask_m = kb.binary("lt", rm, m_r)
    mask_n = kb.binary("lt", rn, n_r)
    acc = kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, acc_dt), (bm, bn)))
    loop_body_start = len(kb.body)
    kvar = "%k"
    ka = kb.binary("add", rk_row, kvar)
    kbv = kb.binary("add", rk_col, kvar)
    if trans_a:   # A stored k x m: element (i, kk) at kk*m + i
        a_off = kb.iadd(a_base, kb.binary("add", scale(ka, m, m_r), rm))
    else:
        a_off = kb.iadd(a_base, kb.binary("add", scale(rm, k, k_r), ka))
    a_mask = kb.binary("and", mask_m, kb.binary("lt", ka, k_r))
    if trans_b:   # B stored n x k: element (kk, j) at j*k + kk
        b_off = kb.iadd(b_base, kb.binary("add", scale(rn, k, k_r), kbv))
    else:
        b_off = kb.iadd(b_base, kb.binary("add", scale(kbv, n, n_r), rn))
    b_mask = kb.binary("and", kb.binary("lt", kbv, k_r), mask_n)
    ta = kb.emit(isa.Load(kb.reg(), pa, a_off, a_mask))
    tb = kb.emit(isa.Load(kb.reg(), pb, b_off, b_mask))
    kb.emit(isa.Dot(acc, ta, tb, acc, acc_dt))
    body = tuple(kb.body[loop_body_start:])
    del kb.body[loop_body_start:]
    # constants first created inside the loop body are hoisted in front of it
    kb.body.extend(i for i in body if isinstance(i, isa.Const))
    body = tuple(i for i in body if not isinstance(i, isa.Const))
    kb.emit(isa.Loop(kvar, 0, k if isinstance(k, int) else k_r, bk, body))
    result = kb.emit(isa.Convert(kb.reg(), acc, dt))
    out_mask = kb.binary("and", mask_m, mask_n)
    if pc is not None:
        c_off = kb.iadd(scale(pid_b, mn), kb.binary("add", scale(rm, n, n_r), rn))
        kb.emit(isa.Store(pc, c_off, result, out_mask))
    else:
        if product is None or outputs is None or not isinstance(m, int) or not isinstance(n, int):
            raise CompileError(f"kernel {name}: a fused GEMM epilogue needs baked-in sizes, the "
                               "product value and the outputs", seam="compiler")
        space: tuple[int, ...] = (batch, m, n) if len(product.shape) == 3 else (m, n)
        index = ([pid_b] if len(space) == 3 else []) + [rm, rn]
        em = Emitter(kb, space, index, out_mask, ins, EMITTERS)
        em.regs[id(product)] = result
        for node in epilogue:
            em.node(node)
        for v in outputs:
            em.store(v, outs[id(v)].param, out_mask)
    # launch resources the driver checks: the A and B tiles one k-step holds in shared
    # memory, and per lane its share of the bm x bn accumulator plus addressing registers
    acc_words = 2 if dtype is DType.FLOAT64 else 1
    meta = dict(group_size=group_size, kind="gemm", tile=[bm, bn, bk],
                shared_memory=(bm * bk + bk * bn) * dtype.itemsize,
                registers=-(-bm * bn * acc_words // group_size) + POINTWISE_REGISTERS)
    if not (isinstance(m, int) and isinstance(n, int) and isinstance(k, int)):
        # shape-generic: the device evaluates the estimate from the launch's sizes and grid
        est: Estimate = {"kind": "gemm", "m": m, "n": n, "k": k, "batch": "grid", "dtype": dt,
               "tile": [bm, bn, bk], "b_batched": b_batched}
        return attach_estimate(kb.program(**meta), est), None
    grid: Grid = (math.ceil(n / bn), math.ceil(m / bm), batch)
    item = dtype.itemsize
    est = {"kind": "gemm", "m": m, "n": n, "k": k, "batch": batch, "dtype": dt,
           "tile": [bm, bn, bk], "b_batched": b_batched,
           "read": {"a": [0, batch * m * k * item], "b": [0, (batch if b_batched else 1) * k * n * item]}}
    if not epilogue:
        est["write"] = {"c": [0, batch * m * n * item]}
    else:
        lanes = grid[0] * grid[1] * grid[2] * bm * bn
        vec: dict[str, float] = {}
        for node in epilogue:
            if node.op in ELEMENTWISE:
                d = node.inputs[0].dtype.value
                vec[d] = vec.get(d, 0.0) + float(lanes)
        est["epilogue"] = {
            "vector_flops": vec,
            "bytes_read": sum(batch * m * n * op.value.dtype.itemsize for op in ins.values()),
            "bytes_written": sum(batch * m * n * op.value.dtype.itemsize for op in outs.values())}
        est["read"].update(footprint([(op.param, op.value.type.nbytes) for op in ins.values()]))
        est["write"] = footprint([(op.param, op.value.type.nbytes) for op in outs.values()])
    return attach_estimate(kb.program(**meta), est), grid
