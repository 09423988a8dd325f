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
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..sim import isa
from .errors import CompileError
from .graph import DType, Node, Value, pad_widths, slice_bounds

POINTWISE_REGISTERS = 32     # 32-bit registers per lane a generated kernel declares for addressing

#: graph op -> ("unary" | "binary", ISA function)
ELEMENTWISE = {
    "neg": ("unary", "neg"), "abs": ("unary", "abs"), "exp": ("unary", "exp"),
    "log": ("unary", "log"), "tanh": ("unary", "tanh"), "sqrt": ("unary", "sqrt"),
    "rsqrt": ("unary", "rsqrt"), "relu": ("unary", "relu"), "sigmoid": ("unary", "sigmoid"),
    "add": ("binary", "add"), "sub": ("binary", "sub"), "mul": ("binary", "mul"),
    "div": ("binary", "div"), "maximum": ("binary", "max"), "minimum": ("binary", "min"),
    "lt": ("binary", "lt"), "gt": ("binary", "gt"), "eq": ("binary", "eq"),
    "erf": ("unary", "erf"), "sin": ("unary", "sin"), "cos": ("unary", "cos"),
    "floor": ("unary", "floor"), "ceil": ("unary", "ceil"), "round": ("unary", "round"),
    "sign": ("unary", "sign"), "reciprocal": ("unary", "recip"), "logical_not": ("unary", "not"),
    "isnan": ("unary", "isnan"),
    "le": ("binary", "le"), "ge": ("binary", "ge"), "ne": ("binary", "ne"),
    "pow": ("binary", "pow"), "atan2": ("binary", "atan2"), "floor_divide": ("binary", "floordiv"),
    "remainder": ("binary", "mod"), "logical_and": ("binary", "and"), "logical_or": ("binary", "or"),
    "bitwise_and": ("binary", "bitand"), "bitwise_or": ("binary", "bitor"),
    "bitwise_xor": ("binary", "xor"),
    # lowered by Emitter.node as a short sequence of ISA instructions
    "gelu": ("expand", "gelu"), "silu": ("expand", "silu"), "clamp": ("expand", "clamp"),
    "iota": ("expand", "iota"),
}
#: bitwise ops on bool operands: the ISA's bit operations take integer tiles, so use logic
BOOL_BITWISE = {"bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "ne"}
REDUCTIONS = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min",
              "argmax": "argmax", "argmin": "argmin"}
#: layout ops: lowered as loads through a rearranged index (slice, pad, concat: with masks)
LAYOUT = ("transpose", "reshape", "broadcast_to", "slice", "pad", "concat")
IDENTITY = {"sum": 0.0, "max": -math.inf, "min": math.inf, "argmax": -math.inf, "argmin": math.inf}


def identity(fn: str, dtype: DType):
    """The value masked lanes take in a reduction: neutral for ``fn`` in ``dtype``."""
    ident = IDENTITY[fn]
    if dtype.is_float or ident == 0:
        return ident
    info = np.iinfo(dtype.numpy)
    return int(info.min) if ident < 0 else int(info.max)


def _gelu(kb: "KernelBuilder", x: str, dt: str, approximate: str) -> str:
    half = kb.binary("mul", x, kb.const(0.5, dt))
    if approximate == "tanh":
        x3 = kb.binary("mul", kb.binary("mul", x, x), x)
        inner = kb.binary("add", x, kb.binary("mul", x3, kb.const(0.044715, dt)))
        t = kb.unary("tanh", kb.binary("mul", inner, kb.const(math.sqrt(2 / math.pi), dt)))
    else:
        t = kb.unary("erf", kb.binary("mul", x, kb.const(1 / math.sqrt(2), dt)))
    return kb.binary("mul", half, kb.binary("add", t, kb.const(1.0, dt)))


def strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class KernelBuilder:
    """Emits ISA instructions into registers with fresh names."""

    def __init__(self, name: str):
        self.name = name
        self.params: list[isa.Param] = []
        self.body: list = []
        self._regs = itertools.count()
        self._consts: dict[tuple, str] = {}

    def reg(self) -> str:
        return f"%r{next(self._regs)}"

    def param(self, name: str, kind: str, dtype: str) -> str:
        self.params.append(isa.Param(name, kind, dtype))
        return name

    def emit(self, ins) -> str | None:
        self.body.append(ins)
        return getattr(ins, "dst", None)

    def const(self, value, dtype: str) -> str:
        key = (value, dtype)
        if key not in self._consts:
            self._consts[key] = self.emit(isa.Const(self.reg(), value, dtype))
        return self._consts[key]

    def pid(self, axis: int = 0) -> str:
        return self.emit(isa.ProgramId(self.reg(), axis))

    def arange(self, n: int) -> str:
        return self.emit(isa.Arange(self.reg(), n))

    def unary(self, fn: str, x: str) -> str:
        return self.emit(isa.Unary(self.reg(), fn, x))

    def binary(self, fn: str, a: str, b: str) -> str:
        return self.emit(isa.Binary(self.reg(), fn, a, b))

    def imul(self, a: str, k: int) -> str:
        return a if k == 1 else self.binary("mul", a, self.const(k, "int64"))

    def iadd(self, a: str | None, b: str | None) -> str | None:
        if a is None:
            return b
        if b is None:
            return a
        return self.binary("add", a, b)

    def program(self, **meta) -> isa.Program:
        return isa.verify(isa.Program(self.name, tuple(self.params), tuple(self.body), dict(meta)))


@dataclass
class Operand:
    """A materialised tensor a kernel reads or writes (a buffer parameter)."""

    param: str
    value: Value


def _offsets(kb: KernelBuilder, shape: tuple[int, ...], space: tuple[int, ...],
             index: list[str | None]) -> str:
    """Element offsets of an operand of ``shape`` broadcast into ``space``."""
    rank = len(space)
    aligned = (1,) * (rank - len(shape)) + tuple(shape)
    st = strides(aligned)
    off = None
    for d in range(rank):
        if aligned[d] == 1 or index[d] is None:
            continue
        off = kb.iadd(off, kb.imul(index[d], st[d]))
    return off if off is not None else kb.const(0, "int64")


class Emitter:
    """Lowers fused graph nodes into a kernel over an iteration space."""

    def __init__(self, kb: KernelBuilder, space: tuple[int, ...], index: list[str | None],
                 mask: str | None, inputs: dict[int, Operand]):
        self.kb = kb
        self.space = space
        self.index = index
        self.mask = mask
        self.inputs = inputs
        self.regs: dict[int, str] = {}
        #: masks made here (pad, concat) -> how many of their lanes are true over the whole grid
        self.active: dict[str, int] = {}
        #: the dims of ``space`` whose index ``mask`` guards (None: every dim)
        self.mask_dims: tuple[int, ...] | None = None

    def value(self, v: Value) -> str:
        if id(v) in self.regs:
            return self.regs[id(v)]
        operand = self.inputs.get(id(v))
        if operand is None:
            raise CompileError(f"kernel {self.kb.name}: value %{v.name} is neither computed here "
                               "nor passed in", seam="compiler")
        offs = _offsets(self.kb, v.shape, self.space, self.index)
        reg = self.kb.emit(isa.Load(self.kb.reg(), operand.param, offs, self._mask_for(v.shape)))
        self.regs[id(v)] = reg
        return reg

    def _mask_for(self, shape: tuple[int, ...]) -> str | None:
        """The kernel's mask if an operand of ``shape`` is indexed along a masked dim.

        An operand constant along every masked dim (a scalar; a row statistic in a
        reduction kernel) is loaded unmasked: its offsets are in bounds for every
        lane, and a masked load would fill some lanes with zeros that a later
        store of the reduced value could write."""
        if self.mask is None:
            return None
        rank = len(self.space)
        aligned = (1,) * (rank - len(shape)) + tuple(shape)
        dims = range(rank) if self.mask_dims is None else self.mask_dims
        return self.mask if any(aligned[d] != 1 and self.index[d] is not None for d in dims) else None

    def node(self, node: Node, reduce_axis_tile: int | None = None) -> str:
        kb = self.kb
        out = node.outputs[0]
        if node.op in BOOL_BITWISE and node.inputs[0].dtype is DType.BOOL:
            reg = kb.binary(BOOL_BITWISE[node.op], *(self.value(v) for v in node.inputs))
        elif node.op in ELEMENTWISE and ELEMENTWISE[node.op][0] != "expand":
            kind, fn = ELEMENTWISE[node.op]
            args = [self.value(v) for v in node.inputs]
            reg = kb.unary(fn, args[0]) if kind == "unary" else kb.binary(fn, *args)
        elif node.op == "gelu":
            reg = _gelu(kb, self.value(node.inputs[0]), out.dtype.value,
                        node.attrs.get("approximate", "none"))
        elif node.op == "silu":
            x = self.value(node.inputs[0])
            reg = kb.binary("mul", x, kb.unary("sigmoid", x))
        elif node.op == "clamp":
            x, lo, hi = (self.value(v) for v in node.inputs)
            reg = kb.binary("min", kb.binary("max", x, lo), hi)
        elif node.op == "iota":
            axis = node.attrs.get("axis", 0) % len(out.shape)
            idx = self.index[len(self.space) - len(out.shape) + axis]
            if out.shape[axis] == 1 or idx is None:
                idx = kb.const(0, "int64")
            reg = kb.emit(isa.Convert(kb.reg(), idx, out.dtype.value))
        elif node.op == "where":
            c, a, b = (self.value(v) for v in node.inputs)
            reg = kb.emit(isa.Where(kb.reg(), c, a, b))
        elif node.op == "cast":
            reg = kb.emit(isa.Convert(kb.reg(), self.value(node.inputs[0]), out.dtype.value))
        elif node.op in LAYOUT:
            reg = self.layout(node)
        elif node.op in REDUCTIONS:
            fn = REDUCTIONS[node.op]
            x = self.value(node.inputs[0])
            src = node.inputs[0]
            if src.shape[node.attrs.get("axis", -1) % len(src.shape)] == 1:
                # a length-1 axis: the operand's offsets do not vary along it, so its tile has
                # no axis to reduce; give it the one-lane row tile
                x = kb.emit(isa.Broadcast(kb.reg(), x, (1,)))
            if self.mask is not None:
                ident = kb.const(identity(fn, node.inputs[0].dtype), node.inputs[0].dtype.value)
                x = kb.emit(isa.Where(kb.reg(), self.mask, x, ident))
            reg = kb.emit(isa.Reduce(kb.reg(), fn, x, reduce_axis_tile if reduce_axis_tile is not None else -1))
        else:
            from .codegen_nn import EMITTERS      # gather, im2col, RNG: kernels that compute offsets
            if node.op not in EMITTERS:
                raise CompileError(f"no code generator for op {node.op!r}", seam="compiler", op=node.op)
            reg = EMITTERS[node.op](self, node)
        self.regs[id(out)] = reg
        return reg

    def layout(self, node: Node) -> str:
        """Load a layout op's operand through a rearranged index (no compute of its own)."""
        kb, src, out = self.kb, node.inputs[0], node.outputs[0]
        for v in node.inputs:
            if self.inputs.get(id(v)) is None or id(v) in self.regs:
                raise CompileError(f"kernel {kb.name}: {node.op} must read its operands from memory",
                                   seam="compiler", op=node.op)
        operand = self.inputs[id(src)]
        rank = len(self.space)
        out_index = self.index[rank - len(out.shape):]
        if node.op in ("slice", "pad", "concat"):
            return self.masked_layout(node, out_index)
        if node.op == "transpose":
            perm = node.attrs.get("perm") or tuple(reversed(range(len(src.shape))))
            src_index: list[str | None] = [None] * len(src.shape)
            for j, p in enumerate(perm):
                src_index[p] = out_index[j]
            offs = _offsets(kb, src.shape, src.shape, src_index)
        elif node.op == "reshape":
            # a contiguous tensor keeps its flat order: the offset is the output's flat index
            offs = _offsets(kb, out.shape, out.shape, out_index)
        else:  # broadcast_to
            offs = _offsets(kb, src.shape, out.shape, out_index)
        return kb.emit(isa.Load(kb.reg(), operand.param, offs, self.mask))

    def _and_mask(self, extra: str | None, lanes: int) -> str | None:
        """``extra`` and the kernel's own mask; ``lanes`` of the result are true over the grid."""
        if extra is None:
            return self.mask
        m = extra if self.mask is None else self.kb.binary("and", self.mask, extra)
        self.active[m] = lanes
        return m

    def masked_layout(self, node: Node, out_index: list[str | None]) -> str:
        """slice, pad and concat: loads through a remapped index, masked where no source exists."""
        kb, out = self.kb, node.outputs[0]
        src = node.inputs[0]
        idx = [i if i is not None else kb.const(0, "int64") for i in out_index]
        if node.op == "slice":
            src_index = [kb.iadd(kb.imul(i, step), kb.const(start, "int64") if start else None)
                         for i, (start, _, step) in zip(idx, slice_bounds(src.shape, node.attrs))]
            offs = _offsets(kb, src.shape, src.shape, src_index)
            return kb.emit(isa.Load(kb.reg(), self.inputs[id(src)].param, offs, self.mask))
        if node.op == "pad":
            value = node.attrs.get("value", 0.0)
            value = float(value) if out.dtype.is_float else (bool(value) if out.dtype is DType.BOOL
                                                              else int(value))
            inside, src_index = None, []
            for d, (i, (lo, _), n) in enumerate(zip(idx, pad_widths(src.shape, node.attrs), src.shape)):
                if lo == 0 and n == out.shape[d]:
                    src_index.append(i)
                    continue
                j = kb.binary("sub", i, kb.const(lo, "int64")) if lo else i
                ok = kb.binary("lt", j, kb.const(n, "int64"))
                if lo:
                    ok = kb.binary("and", kb.binary("ge", i, kb.const(lo, "int64")), ok)
                inside = ok if inside is None else kb.binary("and", inside, ok)
                src_index.append(j)
            mask = self._and_mask(inside, src.type.numel)
            offs = _offsets(kb, src.shape, src.shape, src_index)
            return kb.emit(isa.Load(kb.reg(), self.inputs[id(src)].param, offs, mask, value))
        # concat: each operand fills its own range along the axis
        axis = node.attrs.get("axis", 0) % len(out.shape)
        result, start = None, 0
        for v in node.inputs:
            n = v.shape[axis]
            j = kb.binary("sub", idx[axis], kb.const(start, "int64")) if start else idx[axis]
            ok = kb.binary("lt", j, kb.const(n, "int64"))
            if start:
                ok = kb.binary("and", kb.binary("ge", idx[axis], kb.const(start, "int64")), ok)
            src_index = list(idx)
            src_index[axis] = j
            offs = _offsets(kb, v.shape, v.shape, src_index)
            part = kb.emit(isa.Load(kb.reg(), self.inputs[id(v)].param, offs,
                                    self._and_mask(ok, v.type.numel)))
            result = part if result is None else kb.emit(isa.Where(kb.reg(), ok, part, result))
            start += n
        return result

    def store(self, v: Value, param: str, mask: str | None) -> None:
        offs = _offsets(self.kb, v.shape, self.space, self.index)
        self.kb.emit(isa.Store(param, offs, self.value(v), mask))


def _bind(kb: KernelBuilder, inputs: list[Value], outputs: list[Value]) -> tuple[dict, dict]:
    ins, outs = {}, {}
    for i, v in enumerate(inputs):
        ins[id(v)] = Operand(kb.param(f"in{i}", "ptr", v.dtype.value), v)
    for i, v in enumerate(outputs):
        outs[id(v)] = Operand(kb.param(f"out{i}", "ptr", v.dtype.value), v)
    return ins, outs


def _flat_index(kb: KernelBuilder, flat: str, space: tuple[int, ...]) -> list[str]:
    index = []
    for d, (size, st) in enumerate(zip(space, strides(space))):
        q = flat if st == 1 else kb.binary("floordiv", flat, kb.const(st, "int64"))
        index.append(q if d == 0 else kb.binary("mod", q, kb.const(size, "int64")))
    return index


def pointwise_kernel(name: str, nodes: list[Node], inputs: list[Value], outputs: list[Value],
                     space: tuple[int, ...], block: int, group_size: int):
    """A fused elementwise kernel; returns (program, grid)."""
    kb = KernelBuilder(name)
    ins, outs = _bind(kb, inputs, outputs)
    n = math.prod(space)
    block = min(block, next_pow2(n))
    flat = kb.iadd(kb.imul(kb.pid(0), block), kb.arange(block))
    mask = kb.binary("lt", flat, kb.const(n, "int64"))
    em = Emitter(kb, space, _flat_index(kb, flat, space), mask, ins)
    for node in nodes:
        em.node(node)
    for v in outputs:
        em.store(v, outs[id(v)].param, mask)
    grid = (math.ceil(n / block), 1, 1)
    program = kb.program(group_size=group_size, kind="pointwise", block=block,
                         registers=POINTWISE_REGISTERS, shared_memory=0)
    return _attach(program, pointwise_estimate(program, grid, mask, n, ins, outs, em.active)), grid


def reduction_kernel(name: str, nodes: list[Node], inputs: list[Value], outputs: list[Value],
                     space: tuple[int, ...], axis: int, group_size: int):
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
    em = Emitter(kb, space, index, mask, ins)
    em.mask_dims = (axis,)
    for node in nodes:
        em.node(node, reduce_axis_tile=-1)
    reduced_index = list(index)
    reduced_index[axis] = None
    for v in outputs:
        full = len(v.shape) == len(space) and v.shape[axis] == length
        if full:
            em.store(v, outs[id(v)].param, mask)
        else:
            # a reduced value: one element per row, laid out like the row index
            offs = _offsets(kb, tuple(s for d, s in enumerate(space) if d != axis) or (1,),
                            outer or (1,), row_index or [None])
            kb.emit(isa.Store(outs[id(v)].param, offs, em.value(v), None))
    program = kb.program(group_size=group_size, kind="reduction", width=width,
                         registers=POINTWISE_REGISTERS, shared_memory=group_size * 8)  # partials
    grid = (rows, 1, 1)
    # the row mask, and the masks of masked loads (slice, pad, concat) inside the row
    active = {mask: rows * length} if mask is not None else {}
    est = static_counters(program, grid, {**active, **em.active})
    est.update(kind="counters",
               read=_footprint([(o.param, o.value.type.nbytes) for o in ins.values()]),
               write=_footprint([(o.param, o.value.type.nbytes) for o in outs.values()]))
    return _attach(program, est), grid


def gemm_kernel(name: str, dtype: DType, m: int | str, n: int | str, k: int | str, batch: int,
                b_batched: bool, tile: tuple[int, int, int], group_size: int,
                epilogue: list[Node] | None = None, product: Value | None = None,
                extra_inputs: list[Value] | None = None, outputs: list[Value] | None = None,
                trans_a: bool = False, trans_b: bool = False):
    """Tiled GEMM ``C[b] = op(A[b]) @ op(B[b])`` with an optional fused elementwise epilogue.

    ``trans_a`` / ``trans_b``: the operand is stored transposed (A as k x m, B as
    n x k, row-major) and read through transposed offsets, so the tile the matrix
    unit sees is the same and nothing is copied.

    ``m``, ``n``, ``k`` are either sizes baked into the kernel (a compiler's
    specialised kernel) or the names of scalar parameters (a library's
    shape-generic kernel, launched for any size).  Parameters are ``a``,
    ``b``, then the epilogue's extra inputs ``in0..``, then ``c`` (or the
    epilogue outputs ``out0..``), then the size scalars.
    """
    bm, bn, bk = tile
    if isinstance(m, int):
        bm, bn, bk = min(bm, next_pow2(m)), min(bn, next_pow2(n)), min(bk, next_pow2(k))
    kb = KernelBuilder(name)
    dt = dtype.value
    acc_dt = "float64" if dtype is DType.FLOAT64 else "float32"
    pa, pb = kb.param("a", "ptr", dt), kb.param("b", "ptr", dt)
    epilogue = epilogue or []
    extra = extra_inputs or []
    ins = {id(v): Operand(kb.param(f"in{i}", "ptr", v.dtype.value), v) for i, v in enumerate(extra)}
    if epilogue:
        outs = {id(v): Operand(kb.param(f"out{i}", "ptr", v.dtype.value), v)
                for i, v in enumerate(outputs)}
    else:
        pc = kb.param("c", "ptr", dt)

    def dim(x):
        if isinstance(x, int):
            return x, kb.const(x, "int64")
        kb.param(x, "scalar", "int64")
        return x, kb.emit(isa.ScalarArg(kb.reg(), x))

    def scale(reg, x, x_reg):
        return kb.imul(reg, x) if isinstance(x, int) else kb.binary("mul", reg, x_reg)

    (m, m_r), (n, n_r), (k, k_r) = dim(m), dim(n), dim(k)
    mk = m * k if isinstance(m, int) else kb.binary("mul", m_r, k_r)
    kn = k * n if isinstance(k, int) else kb.binary("mul", k_r, n_r)
    mn = m * n if isinstance(m, int) else kb.binary("mul", m_r, n_r)

    pid_n, pid_m, pid_b = kb.pid(0), kb.pid(1), kb.pid(2)
    rm = kb.emit(isa.Reshape(kb.reg(), kb.iadd(kb.imul(pid_m, bm), kb.arange(bm)), (bm, 1)))
    rn = kb.emit(isa.Reshape(kb.reg(), kb.iadd(kb.imul(pid_n, bn), kb.arange(bn)), (1, bn)))
    rk_row = kb.emit(isa.Reshape(kb.reg(), kb.arange(bk), (1, bk)))
    rk_col = kb.emit(isa.Reshape(kb.reg(), kb.arange(bk), (bk, 1)))
    a_base = scale(pid_b, mk, mk)
    b_base = scale(pid_b, kn, kn) if b_batched else None
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
    if not epilogue:
        c_off = kb.iadd(scale(pid_b, mn, mn), kb.binary("add", scale(rm, n, n_r), rn))
        kb.emit(isa.Store(pc, c_off, result, out_mask))
    else:
        space = (batch, m, n) if len(product.shape) == 3 else (m, n)
        index = ([pid_b] if len(space) == 3 else []) + [rm, rn]
        em = Emitter(kb, space, index, out_mask, ins)
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
    if not isinstance(m, int):
        # shape-generic: the device evaluates the estimate from the launch's sizes and grid
        est = {"kind": "gemm", "m": m, "n": n, "k": k, "batch": "grid", "dtype": dt,
               "tile": [bm, bn, bk], "b_batched": b_batched}
        return _attach(kb.program(**meta), est), None
    grid = (math.ceil(n / bn), math.ceil(m / bm), batch)
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
        est["read"].update(_footprint([(op.param, op.value.type.nbytes) for op in ins.values()]))
        est["write"] = _footprint([(op.param, op.value.type.nbytes) for op in outs.values()])
    return _attach(kb.program(**meta), est), grid


# ---- cost estimates (what the executor would count, without executing) -----------------------
def _bcast(*tiles: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*tiles))


def static_counters(program: isa.Program, grid: tuple[int, int, int],
                    active: dict[str, int] | None = None, args: dict | None = None) -> dict:
    """Count a program's work the way the executor does, from tile shapes alone.

    Registers are followed by tile shape, dtype and whether they vary across
    instances; ``active`` gives, for each mask register, how many of its
    lanes (over all instances) are true — the one thing that needs the
    kernel's meaning rather than its shapes.  Vector FLOPs (index arithmetic
    included), matrix FLOPs and the bytes of every load and store come out
    as the executor counts them.  Loop trip counts come from the program or,
    for scalar bounds, from ``args``.
    """
    active = active or {}
    args = args or {}
    n = grid[0] * grid[1] * grid[2]
    params = {p.name: p for p in program.params}
    regs: dict[str, tuple[tuple[int, ...], str, bool]] = {}
    out = {"instances": n, "matrix_flops": {}, "vector_flops": {}, "bytes_read": 0,
           "bytes_written": 0, "instructions": 0}

    def flops(table: str, dtype: str, amount: float) -> None:
        out[table][dtype] = out[table].get(dtype, 0.0) + float(amount)

    def lanes(mask: str | None, tile: tuple[int, ...], varying: bool) -> int:
        """Active lanes of an access of ``tile`` over all instances."""
        if mask is None:
            return n * math.prod(tile)
        mtile = regs[mask][0]
        return active[mask] * math.prod(tile) // math.prod(mtile)

    def walk(body, reps: int) -> None:
        for ins in body:
            out["instructions"] += reps
            t = type(ins)
            if t is isa.ProgramId:
                regs[ins.dst] = ((), "int64", True)
            elif t is isa.Arange:
                regs[ins.dst] = ((ins.n,), "int64", False)
            elif t is isa.Const:
                regs[ins.dst] = ((), ins.dtype, False)
            elif t is isa.ScalarArg:
                regs[ins.dst] = ((), params[ins.param].dtype, False)
            elif t is isa.Unary:
                tile, dt, var = regs[ins.src]
                flops("vector_flops", dt, reps * n * math.prod(tile))
                regs[ins.dst] = (tile, "bool" if ins.fn in ("not", "isnan") else dt, var)
            elif t is isa.Binary:
                (ta, da, va), (tb, _, vb) = regs[ins.a], regs[ins.b]
                tile = _bcast(ta, tb)
                flops("vector_flops", da, reps * n * math.prod(tile))
                res = "bool" if ins.fn in ("lt", "le", "gt", "ge", "eq", "ne", "and", "or") else da
                regs[ins.dst] = (tile, res, va or vb)
            elif t is isa.Where:
                (tc, _, vc), (ta, da, va), (tb, _, vb) = regs[ins.cond], regs[ins.a], regs[ins.b]
                regs[ins.dst] = (_bcast(tc, ta, tb), da, vc or va or vb)
            elif t is isa.Convert:
                tile, _, var = regs[ins.src]
                regs[ins.dst] = (tile, ins.dtype, var)
            elif t in (isa.Reshape, isa.Broadcast):
                _, dt, var = regs[ins.src]
                regs[ins.dst] = (tuple(ins.shape), dt, var)
            elif t is isa.Reduce:
                tile, dt, var = regs[ins.src]
                flops("vector_flops", dt, reps * (n if var else 1) * math.prod(tile))
                ax = ins.axis if ins.axis >= 0 else len(tile) + ins.axis
                regs[ins.dst] = (tuple(1 if d == ax else s for d, s in enumerate(tile)),
                                 "int64" if ins.fn in isa.ARG_REDUCE else dt, var)
            elif t is isa.Load:
                to, _, vo = regs[ins.offsets]
                tm, _, vm = regs[ins.mask] if ins.mask is not None else ((), "bool", False)
                tile = _bcast(to, tm)
                item = isa.np_dtype(params[ins.ptr].dtype).itemsize
                out["bytes_read"] += reps * lanes(ins.mask, tile, vo or vm) * item
                regs[ins.dst] = (tile, params[ins.ptr].dtype, vo or vm)
            elif t is isa.Store:
                to, _, vo = regs[ins.offsets]
                tv, _, vv = regs[ins.value]
                tm, _, vm = regs[ins.mask] if ins.mask is not None else ((), "bool", False)
                tile = _bcast(to, tv, tm)
                item = isa.np_dtype(params[ins.ptr].dtype).itemsize
                if ins.mask is None:
                    count = (n if (vo or vv) else 1) * math.prod(tile)
                else:
                    count = lanes(ins.mask, tile, True)
                out["bytes_written"] += reps * count * item
            elif t is isa.Dot:
                (ta, da, _), (tb, _, _) = regs[ins.a], regs[ins.b]
                flops("matrix_flops", da, reps * 2.0 * ta[0] * tb[1] * ta[1] * n)
                regs[ins.dst] = (regs[ins.acc][0], ins.acc_dtype, True)
            elif t is isa.Loop:
                stop = ins.stop if isinstance(ins.stop, int) else None
                if stop is None:
                    src = next(i for i in program.instructions()
                               if getattr(i, "dst", None) == ins.stop)
                    stop = int(args[src.param])
                regs[ins.var] = ((), "int64", False)
                walk(ins.body, reps * len(range(ins.start, stop, ins.step)))
    walk(program.body, 1)
    return out


def _attach(program: isa.Program, estimate: dict) -> isa.Program:
    program.meta["estimate"] = estimate
    return program


def _footprint(params: list[tuple[str, int]]) -> dict:
    """Byte ranges [0, nbytes) relative to each parameter's base (every element touched)."""
    return {name: [0, nbytes] for name, nbytes in params}


def pointwise_estimate(program: isa.Program, grid, mask: str, numel: int,
                       inputs: dict, outputs: dict, active: dict | None = None) -> dict:
    est = static_counters(program, grid, {mask: numel, **(active or {})})
    est.update(kind="counters",
               read=_footprint([(o.param, o.value.type.nbytes) for o in inputs.values()]),
               write=_footprint([(o.param, o.value.type.nbytes) for o in outputs.values()]))
    return est
