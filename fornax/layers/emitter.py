"""The emitter: lowers fused graph nodes into tile-ISA instructions over an iteration space.

An :class:`Emitter` holds a kernel's iteration space, the index register of
each of its dims and the kernel's mask, and turns each fused node into
registers: elementwise and expanded ops (``gelu``, ``silu``, ``clamp``,
``iota``), ``where`` and ``cast``, reductions along the row, and layout ops
(transpose, reshape, broadcast, slice, pad, concat) as loads through a
rearranged index.  Ops whose kernel computes its own load offsets (gather,
im2col, scatter, RNG: :data:`fornax.layers.codegen_nn.EMITTERS`) are looked up
in the ``indexed`` table the kernel generator hands the emitter, so this
module does not depend on their generators.

Every operand is indexed through one rule: the multi-index of the iteration
space broadcast onto the operand's shape (NumPy rules, dims aligned right).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..sim import isa
from .errors import CompileError
from .graph import DType, Node, Value, pad_widths, slice_bounds
from .kernel_builder import KernelBuilder, Operand, offsets, strides

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


def identity(fn: str, dtype: DType) -> float | int:
    """The value masked lanes take in a reduction: neutral for ``fn`` in ``dtype``."""
    ident = IDENTITY[fn]
    if dtype.is_float or ident == 0:
        return ident
    info = np.iinfo(dtype.numpy)
    return int(info.min) if ident < 0 else int(info.max)


#: layout ops a kernel can read through when they feed another layout op (no masks of their own)
CHAINABLE = ("transpose", "reshape", "broadcast_to", "slice")


def inner_layout(nodes: Sequence[Node], outputs: Sequence[Value]) -> frozenset[int]:
    """The layout nodes of a kernel that only feed later layout nodes of it (a chain the
    fuser built, :func:`fornax.layers.passes.fuse.fuse`): the kernel reads through them
    instead of computing them at its own index (which is their consumer's, not theirs)."""
    stored = {id(v) for v in outputs}
    users: dict[int, list[Node]] = {}
    for n in nodes:
        for v in n.inputs:
            users.setdefault(id(v), []).append(n)
    return frozenset(id(n) for n in nodes
                     if n.op in CHAINABLE and id(n.outputs[0]) not in stored
                     and users.get(id(n.outputs[0]))
                     and all(u.op in CHAINABLE for u in users[id(n.outputs[0])]))


def gelu(kb: KernelBuilder, x: str, dt: str, approximate: str) -> str:
    """GELU of ``x`` (dtype ``dt``): exact (erf) or the ``"tanh"`` approximation."""
    half = kb.binary("mul", x, kb.const(0.5, dt))
    if approximate == "tanh":
        x3 = kb.binary("mul", kb.binary("mul", x, x), x)
        inner = kb.binary("add", x, kb.binary("mul", x3, kb.const(0.044715, dt)))
        t = kb.unary("tanh", kb.binary("mul", inner, kb.const(math.sqrt(2 / math.pi), dt)))
    else:
        t = kb.unary("erf", kb.binary("mul", x, kb.const(1 / math.sqrt(2), dt)))
    return kb.binary("mul", half, kb.binary("add", t, kb.const(1.0, dt)))


#: a generator for an op whose kernel computes its own load offsets: (emitter, node) -> register
IndexedEmitter = Callable[["Emitter", Node], str]


class Emitter:
    """Lowers fused graph nodes into a kernel over an iteration space."""

    def __init__(self, kb: KernelBuilder, space: tuple[int, ...], index: Sequence[str],
                 mask: str | None, inputs: Mapping[int, Operand],
                 indexed: Mapping[str, IndexedEmitter] | None = None):
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
        #: generators of the ops whose kernel computes its own load offsets (gather, RNG, ...)
        self.indexed: Mapping[str, IndexedEmitter] = indexed or {}
        #: layout nodes fused into the layout op after them (:func:`inner_layout`): never
        #: emitted at the kernel's index, only read through
        self.chained: frozenset[int] = frozenset()

    def value(self, v: Value) -> str:
        """The register holding ``v``: computed here already, or loaded from its operand."""
        if id(v) in self.regs:
            return self.regs[id(v)]
        operand = self.inputs.get(id(v))
        if operand is None:
            raise CompileError(f"kernel {self.kb.name}: value %{v.name} is neither computed here "
                               "nor passed in", seam="compiler")
        offs = offsets(self.kb, v.shape, self.space, self.index)
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
        """Emit ``node`` and return its output's register (reductions along ``reduce_axis_tile``)."""
        kb = self.kb
        out = node.outputs[0]
        if node.op in BOOL_BITWISE and node.inputs[0].dtype is DType.BOOL:
            reg = kb.binary(BOOL_BITWISE[node.op], *(self.value(v) for v in node.inputs))
        elif node.op in ELEMENTWISE and ELEMENTWISE[node.op][0] != "expand":
            kind, fn = ELEMENTWISE[node.op]
            args = [self.value(v) for v in node.inputs]
            reg = kb.unary(fn, args[0]) if kind == "unary" else kb.binary(fn, *args)
        elif node.op == "gelu":
            reg = gelu(kb, self.value(node.inputs[0]), out.dtype.value,
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
            generate = self.indexed.get(node.op)   # gather, im2col, RNG: kernels that compute offsets
            if generate is None:
                raise CompileError(f"no code generator for op {node.op!r}", seam="compiler", op=node.op)
            reg = generate(self, node)
        self.regs[id(out)] = reg
        return reg

    def layout(self, node: Node) -> str:
        """Load a layout op's operand through a rearranged index (no compute of its own).

        The operand is read from memory, or is itself the output of a layout op fused
        before this one (:func:`inner_layout`): the index is then carried back through
        that op too, so a chain of layout ops is one load."""
        kb, out = self.kb, node.outputs[0]
        rank = len(self.space)
        out_index = self.index[rank - len(out.shape):]
        if node.op in ("pad", "concat"):
            for v in node.inputs:
                if self.inputs.get(id(v)) is None or id(v) in self.regs:
                    raise CompileError(f"kernel {kb.name}: {node.op} must read its operands from memory",
                                       seam="compiler", op=node.op)
            return self.masked_layout(node, out_index)
        return self._through(node, list(out_index))

    def _through(self, node: Node, out_index: list[str | None]) -> str:
        """``node``'s output at ``out_index`` (per dim of that output; None: index 0), loaded
        from the memory under the chain of layout ops that ends at ``node``."""
        kb, src, out = self.kb, node.inputs[0], node.outputs[0]
        operand = self.inputs.get(id(src))
        if operand is not None and id(src) not in self.regs:
            if node.op == "reshape":
                # a contiguous tensor keeps its flat order: the offset is the output's flat index
                offs = offsets(kb, out.shape, out.shape, out_index)
            else:
                offs = offsets(kb, src.shape, src.shape, self._source_index(node, out_index))
            return kb.emit(isa.Load(kb.reg(), operand.param, offs, self.mask))
        p = src.producer
        if p is not None and id(p) in self.chained:
            return self._through(p, self._source_index(node, out_index))
        raise CompileError(f"kernel {kb.name}: {node.op} must read its operands from memory",
                           seam="compiler", op=node.op)

    def _source_index(self, node: Node, out_index: list[str | None]) -> list[str | None]:
        """The index into a layout op's operand that its output's ``out_index`` reads."""
        kb, src, out = self.kb, node.inputs[0], node.outputs[0]
        if node.op == "transpose":
            perm = node.attrs.get("perm") or tuple(reversed(range(len(src.shape))))
            src_index: list[str | None] = [None] * len(src.shape)
            for j, p in enumerate(perm):
                src_index[p] = out_index[j]
            return src_index
        if node.op == "broadcast_to":          # dims aligned right; a size-1 source dim reads 0
            lead = len(out.shape) - len(src.shape)
            return [None if n == 1 else out_index[lead + d] for d, n in enumerate(src.shape)]
        if node.op == "slice":
            idx = [i if i is not None else kb.const(0, "int64") for i in out_index]
            return [kb.iadd(kb.imul(i, step), kb.const(start, "int64") if start else None)
                    for i, (start, _, step) in zip(idx, slice_bounds(src.shape, node.attrs))]
        if node.op == "reshape":               # through the flat index, in row-major order
            flat = offsets(kb, out.shape, out.shape, out_index)
            index: list[str | None] = []
            for d, (n, st) in enumerate(zip(src.shape, strides(src.shape))):
                if n == 1:
                    index.append(None)
                    continue
                q = flat if st == 1 else kb.binary("floordiv", flat, kb.const(st, "int64"))
                index.append(q if d == 0 else kb.binary("mod", q, kb.const(n, "int64")))
            return index
        raise CompileError(f"kernel {kb.name}: {node.op} cannot be read through another layout op",
                           seam="compiler", op=node.op)

    def _and_mask(self, extra: str | None, lanes: int) -> str | None:
        """``extra`` and the kernel's own mask; ``lanes`` of the result are true over the grid."""
        if extra is None:
            return self.mask
        m = extra if self.mask is None else self.kb.binary("and", self.mask, extra)
        self.active[m] = lanes
        return m

    def masked_layout(self, node: Node, out_index: Sequence[str]) -> str:
        """pad and concat: loads through a remapped index, masked where no source exists."""
        kb, out = self.kb, node.outputs[0]
        src = node.inputs[0]
        idx = [i if i is not None else kb.const(0, "int64") for i in out_index]
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
            offs = offsets(kb, src.shape, src.shape, src_index)
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
            offs = offsets(kb, v.shape, v.shape, src_index)
            part = kb.emit(isa.Load(kb.reg(), self.inputs[id(v)].param, offs,
                                    self._and_mask(ok, v.type.numel)))
            result = part if result is None else kb.emit(isa.Where(kb.reg(), ok, part, result))
            start += n
        if result is None:
            raise CompileError(f"kernel {kb.name}: concat of no operands", seam="compiler", op=node.op)
        return result

    def store(self, v: Value, param: str, mask: str | None) -> None:
        """Store value ``v`` (computed here or loaded) into buffer ``param`` at the space's index."""
        offs = offsets(self.kb, v.shape, self.space, self.index)
        self.kb.emit(isa.Store(param, offs, self.value(v), mask))
