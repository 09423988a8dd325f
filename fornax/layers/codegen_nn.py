"""Kernel generators for the indexed ops of :mod:`fornax.layers.nn_ops`.

They build on the kernel builder (:mod:`fornax.layers.kernel_builder`) and the
emitter (:mod:`fornax.layers.emitter`); :mod:`fornax.layers.codegen` hands
``EMITTERS`` to every emitter it opens.

* ``EMITTERS``: ops whose kernel computes its own load offsets (gather,
  index_select, scatter, im2col, counter-based RNG).  Each opens a pointwise kernel
  over its output (the compiler's ``indexed`` op kind); the Emitter calls
  the generator for the node and elementwise consumers fuse after it.
* ``scatter`` is a pointwise kernel over its output too, in pull form: each
  output element loops over the update axis and takes or adds the updates
  whose index names it (one fixed order per element: deterministic, no
  atomics; a kernel's stores become visible only when it completes, so a
  copy-then-``store_reduce`` kernel could not read its own copy).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ..sim import isa
from .errors import CompileError
from .emitter import Emitter, IndexedEmitter
from .graph import Node, Value
from .kernel_builder import KernelBuilder, offsets, strides
from .nn_ops import MASK32, THREEFRY_PARITY, THREEFRY_ROTATIONS, _im2col_geometry

#: im2col's geometry: kernel, stride, dilation, lhs dilation (per spatial dim), the (low, high)
#: padding pairs, the group count and the output positions per spatial dim
Im2colGeometry = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...],
                       tuple[tuple[int, int], ...], int, tuple[int, ...]]
#: :func:`fornax.layers.nn_ops._im2col_geometry` (``x_shape``, the op's attributes) at its type
_geometry: Callable[[tuple[int, ...], dict[str, Any]], Im2colGeometry] = _im2col_geometry


def _operand(em: Emitter, v: Value, node: Node) -> str:
    """The buffer parameter of ``v``, which an indexed op must read from memory."""
    op = em.inputs.get(id(v))
    if op is None or id(v) in em.regs:
        raise CompileError(f"kernel {em.kb.name}: {node.op} must read its operands from memory",
                           seam="compiler", op=node.op)
    return op.param


def _out_index(em: Emitter, node: Node) -> Sequence[str]:
    """The index registers of the node's output dims (the space's trailing dims)."""
    out = node.outputs[0]
    return em.index[len(em.space) - len(out.shape):]


def _i64(kb: KernelBuilder, reg: str) -> str:
    return kb.emit(isa.Convert(kb.reg(), reg, "int64"))


def _and(kb: KernelBuilder, a: str | None, b: str) -> str:
    return b if a is None else kb.binary("and", a, b)


def _clamped(kb: KernelBuilder, reg: str, n: int) -> str:
    lo = kb.binary("max", reg, kb.const(0, "int64"))
    return kb.binary("min", lo, kb.const(n - 1, "int64"))


def emit_gather(em: Emitter, node: Node) -> str:
    """gather / index_select: load the index at the output position (clamped into range), then
    the source element it names along ``axis``."""
    kb = em.kb
    x, idx = node.inputs
    px, pi = _operand(em, x, node), _operand(em, idx, node)
    axis = node.attrs.get("axis", 0) % len(x.shape)
    index = _out_index(em, node)
    if node.op == "gather":
        ioffs = offsets(kb, idx.shape, idx.shape, index)
    else:                                                       # index_select: a 1-D index
        ioffs = index[axis] if idx.shape[0] > 1 else kb.const(0, "int64")
    iv = _clamped(kb, _i64(kb, kb.emit(isa.Load(kb.reg(), pi, ioffs, em.mask))), x.shape[axis])
    src = list(index)
    src[axis] = iv
    return kb.emit(isa.Load(kb.reg(), px, offsets(kb, x.shape, x.shape, src), em.mask))


def emit_im2col(em: Emitter, node: Node) -> str:
    """out[g, c*K + kk, n*L + l] = x[n, g*Cg + c, pos(l, kk)] (0 where pos is padding or a hole)."""
    kb = em.kb
    (x,) = node.inputs
    px = _operand(em, x, node)
    kernel, st, dil, lhs, pads, groups, out = _geometry(x.shape, node.attrs)
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    cg, ktot, L = c // groups, math.prod(kernel), math.prod(out)
    gi, j, p = _out_index(em, node)

    def const(v: int) -> str:
        return kb.const(v, "int64")

    chan = kb.iadd(kb.imul(gi, cg), kb.binary("floordiv", j, const(ktot)))
    kk = kb.binary("mod", j, const(ktot))
    batch = kb.binary("floordiv", p, const(L))
    pos = kb.binary("mod", p, const(L))
    xs = strides(x.shape)
    off = kb.iadd(kb.imul(batch, xs[0]), kb.imul(chan, xs[1]))
    valid = em.mask
    kst, ost = strides(tuple(kernel)), strides(tuple(out))
    for d in range(len(kernel)):
        kd = kb.binary("mod", kb.binary("floordiv", kk, const(kst[d])), const(kernel[d]))
        od = kb.binary("mod", kb.binary("floordiv", pos, const(ost[d])), const(out[d]))
        # coordinate in the zero-stuffed, padded input
        q = kb.iadd(kb.imul(od, st[d]), kb.imul(kd, dil[d]))
        q = kb.binary("sub", q, const(pads[d][0]))
        if lhs[d] > 1:
            valid = _and(kb, valid, kb.binary("eq", kb.binary("mod", q, const(lhs[d])), const(0)))
            q = kb.binary("floordiv", q, const(lhs[d]))
        valid = _and(kb, valid, kb.binary("ge", q, const(0)))
        valid = _and(kb, valid, kb.binary("lt", q, const(spatial[d])))
        off = kb.iadd(off, kb.imul(q, xs[2 + d]))
    if valid is None or valid is em.mask:
        return kb.emit(isa.Load(kb.reg(), px, off, em.mask))
    # padding and holes read element 0 under the kernel's own mask, then become zeros
    off = kb.emit(isa.Where(kb.reg(), valid, off, const(0)))
    v = kb.emit(isa.Load(kb.reg(), px, off, em.mask))
    return kb.emit(isa.Where(kb.reg(), valid, v, kb.const(0, x.dtype.value)))


def _threefry(kb: KernelBuilder, k0: str, k1: str, c0: str, c1: str) -> tuple[str, str]:
    """Threefry-2x32-20 on 32-bit words held in int64 registers."""
    m = kb.const(MASK32, "int64")

    def wrap(r: str) -> str:
        return kb.binary("bitand", r, m)

    def add(a: str, b: str) -> str:
        return wrap(kb.binary("add", a, b))

    k2 = kb.binary("xor", kb.binary("xor", k0, k1), kb.const(THREEFRY_PARITY, "int64"))
    ks = (k0, k1, k2)
    x0, x1 = add(c0, k0), add(c1, k1)
    for block in range(5):
        for r in THREEFRY_ROTATIONS[(block % 2) * 4:(block % 2) * 4 + 4]:
            x0 = add(x0, x1)
            rot = kb.binary("bitor", kb.binary("shl", x1, kb.const(r, "int64")),
                            kb.binary("shr", x1, kb.const(32 - r, "int64")))
            x1 = kb.binary("xor", wrap(rot), x0)
        x0 = add(x0, ks[(block + 1) % 3])
        x1 = add(x1, kb.binary("add", ks[(block + 2) % 3], kb.const(block + 1, "int64")))
    return x0, x1


def emit_random(em: Emitter, node: Node) -> str:
    """Counter-based RNG: Threefry-2x32 of the key and each output's flat index (plus
    ``offset``) gives raw bits, uniforms in [minval, maxval) or Box-Muller normals."""
    kb = em.kb
    (key,) = node.inputs
    out = node.outputs[0]
    pk = _operand(em, key, node)
    m = kb.const(MASK32, "int64")
    k0 = kb.binary("bitand", kb.emit(isa.Load(kb.reg(), pk, kb.const(0, "int64"))), m)
    k1 = kb.binary("bitand", kb.emit(isa.Load(kb.reg(), pk, kb.const(1, "int64"))), m)
    counter = offsets(kb, out.shape, out.shape, _out_index(em, node))
    counter = kb.binary("add", counter, kb.const(int(node.attrs.get("offset", 0)), "int64"))
    c0 = kb.binary("shr", counter, kb.const(32, "int64"))
    c1 = kb.binary("bitand", counter, m)
    x0, x1 = _threefry(kb, k0, k1, c0, c1)
    if node.op == "random_bits":
        return kb.binary("xor", x0, x1)
    dt = out.dtype.value
    unit = kb.const(2.0 ** -24, dt)

    def top24(word: str, plus: int = 0) -> str:
        """The top 24 bits of a 32-bit ``word`` (plus ``plus``) scaled into [0, 1)."""
        w = kb.binary("shr", word, kb.const(8, "int64"))
        if plus:
            w = kb.binary("add", w, kb.const(plus, "int64"))
        return kb.binary("mul", kb.emit(isa.Convert(kb.reg(), w, dt)), unit)

    if node.op == "random_uniform":
        lo, hi = float(node.attrs.get("minval", 0.0)), float(node.attrs.get("maxval", 1.0))
        u = top24(kb.binary("xor", x0, x1))
        return kb.binary("add", kb.binary("mul", u, kb.const(hi - lo, dt)), kb.const(lo, dt))
    u1, u2 = top24(x0, 1), top24(x1)                                   # (0, 1] and [0, 1)
    radius = kb.unary("sqrt", kb.binary("mul", kb.unary("log", u1), kb.const(-2.0, dt)))
    return kb.binary("mul", radius, kb.unary("cos", kb.binary("mul", u2, kb.const(2.0 * math.pi, dt))))


def emit_scatter(em: Emitter, node: Node) -> str:
    """Scatter in pull form: each output element starts from the input and walks the update
    axis in order, taking (``set``) or adding (``add``) every update whose index names it.
    Deterministic (a fixed order per element), no atomics; out-of-range updates match nothing."""
    kb = em.kb
    x, idx, upd = node.inputs
    px, pi, pu = (_operand(em, v, node) for v in (x, idx, upd))
    axis = node.attrs.get("axis", 0) % len(x.shape)
    index = _out_index(em, node)
    acc = kb.emit(isa.Load(kb.reg(), px, offsets(kb, x.shape, x.shape, index), em.mask))
    inner = None                            # the update tile is smaller than the input in this dim
    for d in range(len(x.shape)):
        if d != axis and upd.shape[d] < x.shape[d]:
            inner = _and(kb, inner, kb.binary("lt", index[d], kb.const(upd.shape[d], "int64")))
    zero = kb.const(0, "int64")
    var = kb.reg()
    start = len(kb.body)
    src = list(index)
    src[axis] = var
    uoff = offsets(kb, upd.shape, upd.shape, src)
    if inner is not None:
        uoff = kb.emit(isa.Where(kb.reg(), inner, uoff, zero))
    iv = _i64(kb, kb.emit(isa.Load(kb.reg(), pi, uoff, em.mask)))
    hit = kb.binary("eq", iv, index[axis])
    if inner is not None:
        hit = kb.binary("and", hit, inner)
    u = kb.emit(isa.Load(kb.reg(), pu, uoff, em.mask))
    new = kb.binary("add", acc, u) if node.attrs.get("mode", "add") == "add" else u
    kb.emit(isa.Where(acc, hit, new, acc))
    body = tuple(kb.body[start:])
    del kb.body[start:]
    kb.body.extend(i for i in body if isinstance(i, isa.Const))     # constants hoisted
    kb.emit(isa.Loop(var, 0, upd.shape[axis], 1, tuple(i for i in body if not isinstance(i, isa.Const))))
    return acc


EMITTERS: dict[str, IndexedEmitter] = {"gather": emit_gather, "index_select": emit_gather, "im2col": emit_im2col,
            "scatter": emit_scatter,
            "random_bits": emit_random, "random_uniform": emit_random, "random_normal": emit_random}


