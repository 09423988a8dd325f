"""Matrix product lowerings: ``mm``, ``bmm``, ``mv``, ``dot``, ``vdot``, ``addmm``, ``addmv``,
``baddbmm`` (floating point only: :func:`require_float` refuses integer operands)."""

from __future__ import annotations

from fornax.frameworks.builders import reshape as _reshape

from .promotion import opmath
from .table import lowering


def require_float(ctx, *vals):
    for v in vals:
        if not v.dtype.is_float:
            raise ctx.fail(f"matrix products of {v.dtype} tensors are not lowered (the graph's matmul is "
                           "floating-point only)")


@lowering("aten::mm.default", "aten::bmm.default")
def mm(ctx, self, mat2):
    require_float(ctx, self, mat2)
    return ctx.op("matmul", self, mat2)


@lowering("aten::mv.default")
def mv(ctx, self, vec):
    require_float(ctx, self, vec)
    return _reshape(ctx, ctx.op("matmul", self, _reshape(ctx, vec, (vec.shape[0], 1))), (self.shape[0],))


@lowering("aten::vdot.default")
def vdot(ctx, self, other):
    return dot(ctx, self, other)


@lowering("aten::dot.default")
def dot(ctx, self, tensor):
    require_float(ctx, self, tensor)
    return ctx.op("dot_general", self, tensor, lhs_contracting=(0,), rhs_contracting=(0,))


@lowering("aten::addmm.default")
def addmm(ctx, self, mat1=None, mat2=None, beta=1, alpha=1, batch1=None, batch2=None, vec=None):
    """``beta*self + alpha*(mat1 @ mat2)``; ``self`` is ignored (NaNs too) when beta is 0.
    Half types are computed in float32 and rounded once, as a BLAS GEMM with a float32
    accumulator and epilogue does (cuBLAS/rocBLAS ``gemmEx`` with a float32 compute type)."""
    if batch1 is not None:
        mat1, mat2 = batch1, batch2
    out = mat1.dtype
    acc = opmath(out) if out.is_float else out
    if acc != out and (alpha != 1 or beta != 0):
        mat1, mat2, vec = (None if v is None else ctx.cast(v, acc) for v in (mat1, mat2, vec))
    p = mv(ctx, mat1, vec) if vec is not None else mm(ctx, mat1, mat2)
    dt = p.dtype
    if alpha != 1:
        p = ctx.op("mul", p, ctx.scalar(alpha, dt))
    if beta != 0:
        b = ctx.cast(self, dt)
        if beta != 1:
            b = ctx.op("mul", b, ctx.scalar(beta, dt))
        p = ctx.op("add", b, p)
    return ctx.cast(p, out)


@lowering("aten::addmv.default")
def addmv(ctx, self, mat, vec, beta=1, alpha=1):
    return addmm(ctx, self, mat, None, beta, alpha, vec=vec)


@lowering("aten::baddbmm.default")
def baddbmm(ctx, self, batch1, batch2, beta=1, alpha=1):
    return addmm(ctx, self, batch1, batch2, beta, alpha)
