"""The ATen → graph IR lowering table against PyTorch CPU eager.

Every case runs one ATen overload on CPU tensors, lowers the same call into a
one-op graph (:func:`single_op_graph`), and checks the graph's float64
reference — and, for the cases marked ``S``, a real composed stack — gives
torch's values with torch's dtypes.  Two whole-model tests trace a small
network's forward and backward to ATen (as dispatched, and after the core
ATen decompositions) and lower every node.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from fornax.frameworks.torch.lowering import (DTYPE_TO_TORCH, LOWERED_OPS, TORCH_TO_DTYPE, LowerCtx,
                                              NotLowerable, OutMeta, lookup, lower, lowering,
                                              single_op_graph)
from fornax.layers.graph import DType, Graph
from helpers import FAMILIES

A = torch.ops.aten
_gen = torch.Generator().manual_seed(0)


def r(*shape, dtype=torch.float32):
    return torch.randn(shape, generator=_gen).to(dtype)


def pos(*shape, dtype=torch.float32):
    return (torch.rand(*shape, generator=_gen) + 0.5).to(dtype)


def ri(*shape, lo=-5, hi=6, dtype=torch.int64):
    return torch.randint(lo, hi, shape, generator=_gen).to(dtype)


def rb(*shape):
    return torch.rand(*shape, generator=_gen) > 0.5


def unit(*shape):
    return torch.rand(*shape, generator=_gen) * 0.8 + 0.1


SPECIAL = torch.tensor([0.0, -0.0, 1.5, -2.5, 0.5, -0.5, 1e-6, -1e-7, 3.0, math.inf, -math.inf, math.nan])


def to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.detach().contiguous().numpy()


TOL = {torch.float64: (1e-9, 1e-9), torch.float32: (2e-5, 2e-5), torch.float16: (3e-3, 3e-3),
       torch.bfloat16: (2e-2, 2e-2)}
STACK_TOL = {torch.float64: (1e-6, 1e-6), torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2),
             torch.bfloat16: (3e-2, 3e-2)}


def _flat(res):
    if isinstance(res, torch.Tensor) or res is None:
        return [res]
    out = []
    for x in res:
        out.extend(_flat(x))
    return out


def compare(got: np.ndarray, want: torch.Tensor, tol, what: str):
    got_t = torch.from_numpy(np.asarray(got, dtype=np.float64) if want.dtype.is_floating_point
                             else np.asarray(got))
    assert tuple(got_t.shape) == tuple(want.shape), f"{what}: shape {tuple(got_t.shape)} != {tuple(want.shape)}"
    if want.dtype.is_floating_point:
        rtol, atol = tol[want.dtype]
        torch.testing.assert_close(got_t, want.double(), rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got_t.to(want.dtype), want), f"{what}: {got_t} != {want}"


def check(op, args, kwargs=None, stack=None):
    """Lower ``op(*args, **kwargs)`` into a one-op graph; its reference (and ``stack``'s run)
    must give torch's outputs and dtypes."""
    kwargs = kwargs or {}
    fresh = torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, args)
    want = op(*args, **kwargs)                     # an in-place op mutates args: lower ``fresh``
    want = _flat(want if op._schema.returns else args[0])    # _foreach_*_: the new list values
    args = fresh
    outs = [None if t is None else OutMeta.of(t) for t in want]
    g, feeds, res = single_op_graph(op, args, kwargs, outs=outs)
    assert len(res) == len(want)
    real = [(v, t) for v, t in zip(res, want) if v is not None]
    for v, t in zip(res, want):
        if v is None:
            assert t is None or t.numel() == 0
        else:
            assert v.dtype is TORCH_TO_DTYPE[t.dtype], f"{op}: dtype {v.dtype} != {t.dtype}"
    if not real:
        return g
    g.verify()
    np_feeds = {v.name: to_numpy(t) for v, t in zip(g.inputs, feeds)}
    for i, (got, (_, t)) in enumerate(zip(g.reference(np_feeds), real)):
        compare(got, t, TOL, f"{op} output {i} (reference)")
    if stack is not None:
        run = stack.run(g, np_feeds)
        for i, (got, (v, t)) in enumerate(zip(run.outputs, real)):
            assert got.dtype == v.dtype.numpy, f"{op} output {i}: stack gave {got.dtype}, expected {v.dtype}"
            compare(got.astype(np.float64) if got.dtype == ml_dtypes.bfloat16 else got, t, STACK_TOL,
                    f"{op} output {i} ({stack.config.seams['framework']} stack)")
    return g


# ---- the case table ----------------------------------------------------------------------------------------------
# (op, args-builder, kwargs, on the stack?)  args are built lazily so collection stays cheap
S = True


def _ln_backward_args(shape=(3, 4, 5), norm=(5,), affine=True):
    x = r(*shape)
    w, b = (r(*norm), r(*norm)) if affine else (None, None)
    _, mean, rstd = A.native_layer_norm(x, list(norm), w, b, 1e-5)
    return (r(*shape), x, list(norm), mean, rstd, w, b, [True, affine, affine])


def _bn_backward_args(train):
    x = r(4, 3, 2, 2)
    w, rm, rv = r(3), r(3) * 0.1, pos(3)
    _, sm, si = A.native_batch_norm(x, w, r(3), None, None, True, 0.1, 1e-5)
    return (r(4, 3, 2, 2), x, w, rm, rv, sm, si, train, 1e-5, [True, True, True])


def _gn_backward_args():
    x = r(2, 6, 3, 2)
    w = r(6)
    _, mean, rstd = A.native_group_norm(x, w, r(6), 2, 6, 6, 3, 1e-5)
    return (r(2, 6, 3, 2), x, mean, rstd, w, 2, 6, 6, 3, [True, True, True])


def _nll_backward_args(reduction, weight=True, shape=(4, 5), target=None):
    x = r(*shape).log_softmax(1)
    t = target if target is not None else ri(shape[0], lo=0, hi=shape[1])
    w = pos(shape[1]) if weight else None
    _, total = A.nll_loss_forward(x, t, w, reduction, 1) if len(shape) == 2 else \
        A.nll_loss2d_forward(x, t, w, reduction, 1)
    g = r(*t.shape) if reduction == 0 else r()
    return (g, x, t, w, reduction, 1, total)


def _maxpool_backward_args():
    x = r(2, 3, 5, 5)
    y, idx = A.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    return (r(*y.shape), x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx)


def _sdpa_backward_args(causal, mask=None):
    q, k, v = r(2, 2, 4, 3), r(2, 2, 5, 3), r(2, 2, 5, 3)
    out, lse = A._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=mask)
    return (r(*out.shape), q, k, v, out, lse, 0.0, causal), {"attn_mask": mask}


CASES = [
    # arithmetic and promotion
    (A.add.Tensor, lambda: (r(3, 4), r(4)), {}, S),
    (A.add.Tensor, lambda: (ri(3, 4, dtype=torch.int32), r(3, 4)), {"alpha": 2}, S),
    (A.add.Tensor, lambda: (ri(3, 4), 2.5), {}, S),
    (A.add.Tensor, lambda: (r(3, 4, dtype=torch.float16), r(3, 4, dtype=torch.float16)), {}, S),
    (A.add.Tensor, lambda: (r(3, 4, dtype=torch.bfloat16), r(dtype=torch.float32)), {}, S),
    (A.add.Tensor, lambda: (ri(3, 4, dtype=torch.int32), r(dtype=torch.float64)), {}, None),
    (A.add.Tensor, lambda: (rb(3, 4), rb(3, 4)), {}, S),
    (A.add.Scalar, lambda: (ri(3, 4, dtype=torch.int32), 3), {"alpha": 2}, None),
    (A.sub.Tensor, lambda: (r(3, 4), r(3, 4)), {"alpha": 0.5}, S),
    (A.rsub.Scalar, lambda: (r(3, 4), 1.0), {}, None),
    (A.mul.Tensor, lambda: (ri(2, 3), 0.5), {}, S),
    (A.mul.Tensor, lambda: (rb(2, 3), rb(2, 3)), {}, None),
    (A.div.Tensor, lambda: (ri(3, 4), ri(3, 4, lo=1, hi=4)), {}, S),
    (A.div.Tensor_mode, lambda: (ri(20), torch.tensor([3, -3] * 10)), {"rounding_mode": "trunc"}, S),
    (A.div.Tensor_mode, lambda: (ri(20), torch.tensor([3, -3] * 10)), {"rounding_mode": "floor"}, S),
    (A.div.Tensor_mode, lambda: (r(20) * 5, torch.tensor([1.5, -1.5] * 10)), {"rounding_mode": "trunc"}, S),
    (A.div.Tensor_mode, lambda: (r(20) * 5, torch.tensor([1.5, -1.5] * 10)), {"rounding_mode": "floor"}, S),
    (A.div.Scalar_mode, lambda: (ri(10), -4), {"rounding_mode": "trunc"}, None),
    (A.floor_divide.default, lambda: (ri(10), torch.tensor([3, -3] * 5)), {}, None),
    (A.remainder.Tensor, lambda: (r(12) * 5, torch.tensor([2.5, -2.5, 1.0] * 4)), {}, S),
    (A.remainder.Scalar, lambda: (ri(12), -3), {}, S),
    (A.remainder.Scalar_Tensor, lambda: (7, ri(12, lo=1, hi=5)), {}, None),
    (A.fmod.Tensor, lambda: (r(12) * 5, torch.tensor([2.5, -2.5, 1.0] * 4)), {}, S),
    (A.fmod.Scalar, lambda: (ri(12), -3), {}, S),
    (A.pow.Tensor_Scalar, lambda: (r(10), 2), {}, S),
    (A.pow.Tensor_Scalar, lambda: (r(10), 3.0), {}, None),
    (A.pow.Tensor_Scalar, lambda: (pos(10), 0.5), {}, None),
    (A.pow.Tensor_Scalar, lambda: (pos(10), -1), {}, None),
    (A.pow.Tensor_Scalar, lambda: (pos(10), 2.5), {}, S),
    (A.pow.Tensor_Scalar, lambda: (ri(10), 3), {}, S),
    (A.pow.Tensor_Scalar, lambda: (ri(10), 0.5), {}, None),
    (A.pow.Tensor_Tensor, lambda: (pos(10), r(10)), {}, None),
    (A.pow.Scalar, lambda: (2.0, r(10)), {}, S),
    (A.maximum.default, lambda: (r(3, 4), r(4)), {}, None),
    (A.minimum.default, lambda: (ri(3, 4), r(3, 4)), {}, None),
    (A.max.other, lambda: (r(3, 4), r(3, 4)), {}, None),
    (A.atan2.default, lambda: (r(10), r(10)), {}, None),
    (A.clamp.default, lambda: (r(10),), {"min": -0.5}, S),
    (A.clamp.default, lambda: (r(10),), {"min": -0.5, "max": 0.5}, S),
    (A.clamp.default, lambda: (ri(10),), {"min": 0.5}, None),
    (A.clamp.Tensor, lambda: (r(3, 4), r(4), None), {}, None),
    (A.clamp.Tensor, lambda: (r(3, 4), r(4) - 1, r(3, 1) + 1), {}, None),
    (A.clamp_min.default, lambda: (r(10), 0.1), {}, None),
    (A.clamp_max.Tensor, lambda: (r(10), r(10)), {}, None),
    (A.where.self, lambda: (rb(3, 4), ri(3, 4), r(4)), {}, S),
    (A.where.ScalarOther, lambda: (rb(3, 4), r(3, 4), 0.0), {}, None),
    (A.masked_fill.Scalar, lambda: (r(3, 4), rb(4), -1e9), {}, S),
    (A.masked_fill.Tensor, lambda: (ri(3, 4), rb(3, 4), torch.tensor(7)), {}, None),
    (A.lerp.Scalar, lambda: (r(10), r(10), 0.3), {}, None),
    (A.lerp.Tensor, lambda: (r(10), r(10), unit(10)), {}, None),
    (A.addcmul.default, lambda: (r(10), r(10), r(10)), {"value": 0.5}, None),
    (A.addcdiv.default, lambda: (r(10), r(10), pos(10)), {"value": -2}, S),
    # comparisons and logic
    (A.eq.Tensor, lambda: (ri(10, lo=0, hi=3), ri(10, lo=0, hi=3)), {}, S),
    (A.ne.Scalar, lambda: (ri(10, lo=0, hi=3), 1), {}, None),
    (A.lt.Scalar, lambda: (ri(10), 2.5), {}, S),
    (A.le.Tensor, lambda: (r(10), r(10)), {}, None),
    (A.gt.Scalar, lambda: (r(10, dtype=torch.float16), 0.1), {}, None),
    (A.ge.Tensor, lambda: (ri(10, dtype=torch.int32), r(10)), {}, None),
    (A.logical_and.default, lambda: (r(10), ri(10, lo=0, hi=2)), {}, None),
    (A.logical_or.default, lambda: (rb(10), rb(10)), {}, S),
    (A.logical_xor.default, lambda: (ri(10, lo=0, hi=2), rb(10)), {}, None),
    (A.logical_not.default, lambda: (r(10),), {}, None),
    (A.bitwise_and.Tensor, lambda: (ri(10, lo=0, hi=16), ri(10, lo=0, hi=16)), {}, S),
    (A.bitwise_or.Scalar, lambda: (ri(10, lo=0, hi=16), 5), {}, None),
    (A.bitwise_xor.Tensor, lambda: (rb(10), rb(10)), {}, None),
    (A.bitwise_not.default, lambda: (ri(10),), {}, S),
    (A.bitwise_not.default, lambda: (rb(10),), {}, None),
    (A.isnan.default, lambda: (SPECIAL,), {}, None),
    (A.isinf.default, lambda: (SPECIAL,), {}, S),
    (A.isposinf.default, lambda: (SPECIAL,), {}, None),
    (A.isneginf.default, lambda: (SPECIAL,), {}, None),
    (A.nan_to_num.default, lambda: (SPECIAL,), {}, None),
    (A.nan_to_num.default, lambda: (SPECIAL,), {"nan": 1.0, "posinf": 2.0}, None),
    # unary math
    (A.neg.default, lambda: (ri(10),), {}, None),
    (A.abs.default, lambda: (r(10),), {}, None),
    (A.exp.default, lambda: (r(10),), {}, S),
    (A.exp.default, lambda: (r(10, dtype=torch.float16),), {}, S),
    (A.exp2.default, lambda: (r(10),), {}, None),
    (A.expm1.default, lambda: (torch.tensor([1e-8, -1e-6, 1e-3, 0.5, -2.0, 30.0, -100.0, 0.0]),), {}, S),
    (A.log.default, lambda: (pos(10),), {}, None),
    (A.log1p.default, lambda: (torch.tensor([1e-8, -1e-6, 1e-3, 0.5, -0.9, 30.0, 0.0]),), {}, S),
    (A.log2.default, lambda: (pos(10),), {}, None),
    (A.log10.default, lambda: (pos(10),), {}, None),
    (A.sqrt.default, lambda: (ri(10, lo=0, hi=9),), {}, S),
    (A.rsqrt.default, lambda: (pos(10),), {}, None),
    (A.reciprocal.default, lambda: (pos(10),), {}, None),
    (A.sin.default, lambda: (r(10),), {}, None),
    (A.cos.default, lambda: (r(10, dtype=torch.float64),), {}, None),
    (A.tan.default, lambda: (r(10),), {}, None),
    (A.atan.default, lambda: (r(10),), {}, None),
    (A.asin.default, lambda: (unit(10),), {}, None),
    (A.acos.default, lambda: (unit(10),), {}, None),
    (A.sinh.default, lambda: (r(10),), {}, None),
    (A.cosh.default, lambda: (r(10),), {}, None),
    (A.tanh.default, lambda: (r(10),), {}, None),
    (A.sigmoid.default, lambda: (r(10, dtype=torch.bfloat16),), {}, S),
    (A.erf.default, lambda: (r(10),), {}, None),
    (A.sign.default, lambda: (SPECIAL[:9],), {}, None),
    (A.floor.default, lambda: (SPECIAL,), {}, None),
    (A.ceil.default, lambda: (SPECIAL,), {}, None),
    (A.round.default, lambda: (torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 0.49, 2.51]),), {}, S),
    (A.round.decimals, lambda: (r(10) * 10,), {"decimals": 2}, None),
    (A.round.decimals, lambda: (r(10) * 1000,), {"decimals": -2}, None),
    (A.trunc.default, lambda: (SPECIAL,), {}, S),
    (A.frac.default, lambda: (r(10) * 3,), {}, None),
    # activations
    (A.relu.default, lambda: (r(10),), {}, S),
    (A.relu.default, lambda: (ri(10),), {}, None),
    (A.gelu.default, lambda: (r(10),), {}, S),
    (A.gelu.default, lambda: (r(10),), {"approximate": "tanh"}, S),
    (A.silu.default, lambda: (r(10),), {}, None),
    (A.hardtanh.default, lambda: (r(10) * 2,), {}, None),
    (A.leaky_relu.default, lambda: (r(10),), {"negative_slope": 0.2}, None),
    (A.elu.default, lambda: (r(10),), {"alpha": 1.5}, None),
    (A.softplus.default, lambda: (r(10) * 10,), {"beta": 2, "threshold": 5}, None),
    (A.mish.default, lambda: (r(10),), {}, None),
    (A.hardsigmoid.default, lambda: (r(10) * 4,), {}, None),
    (A.hardswish.default, lambda: (r(10) * 4,), {}, None),
    (A.glu.default, lambda: (r(3, 4),), {"dim": 1}, None),
    (A.threshold.default, lambda: (r(10), 0.1, 20.0), {}, None),
    (A.threshold_backward.default, lambda: (r(10), r(10), 0.0), {}, S),
    (A.sigmoid_backward.default, lambda: (r(10), unit(10)), {}, None),
    (A.tanh_backward.default, lambda: (r(10), unit(10)), {}, None),
    (A.silu_backward.default, lambda: (r(10), r(10)), {}, None),
    (A.gelu_backward.default, lambda: (r(10), r(10)), {}, S),
    (A.gelu_backward.default, lambda: (r(10), r(10)), {"approximate": "tanh"}, None),
    (A.hardtanh_backward.default, lambda: (r(10), r(10) * 2, -1.0, 1.0), {}, None),
    (A.leaky_relu_backward.default, lambda: (r(10), r(10), 0.2, False), {}, None),
    (A.elu_backward.default, lambda: (r(10), 1.5, 1.0, 1.0, False, r(10)), {}, None),
    (A.elu_backward.default, lambda: (r(10), 1.5, 1.0, 1.0, True, A.elu(r(10), 1.5)), {}, None),
    (A.softplus_backward.default, lambda: (r(10), r(10) * 5, 2.0, 5.0), {}, None),
    (A.hardsigmoid_backward.default, lambda: (r(10), r(10) * 4), {}, None),
    (A.hardswish_backward.default, lambda: (r(10), r(10) * 4), {}, None),
    # softmax
    (A._softmax.default, lambda: (r(3, 5), 1, False), {}, S),
    (A._softmax.default, lambda: (r(3, 5, dtype=torch.float16), -1, False), {}, S),
    (A._log_softmax.default, lambda: (r(3, 5), 1, False), {}, S),
    (A._softmax_backward_data.default, lambda: (r(3, 5), r(3, 5).softmax(1), 1, torch.float32), {}, S),
    (A._log_softmax_backward_data.default, lambda: (r(3, 5), r(3, 5).log_softmax(0), 0, torch.float32), {}, None),
    # reductions
    (A.sum.default, lambda: (rb(3, 4),), {}, S),
    (A.sum.default, lambda: (ri(3, 4, dtype=torch.int32),), {}, None),
    (A.sum.default, lambda: (r(3, 4, dtype=torch.float16),), {}, None),
    (A.sum.dim_IntList, lambda: (r(2, 3, 4), [0, 2]), {}, S),
    (A.sum.dim_IntList, lambda: (r(2, 3, 4), [-1], True), {"dtype": torch.float64}, None),
    (A.sum.dim_IntList, lambda: (r(2, 3, 4), []), {}, None),
    (A.mean.default, lambda: (r(3, 4),), {}, None),
    (A.mean.dim, lambda: (r(2, 3, 4), [1, 2], True), {}, S),
    (A.amax.default, lambda: (r(2, 3, 4), [0, 2]), {}, S),
    (A.amin.default, lambda: (ri(2, 3, 4), [1], True), {}, None),
    (A.amax.default, lambda: (rb(2, 3), [1]), {}, None),
    (A.max.default, lambda: (r(3, 4),), {}, None),
    (A.min.default, lambda: (ri(3, 4),), {}, None),
    (A.argmax.default, lambda: (torch.tensor([[1, 3, 3, 0], [2, 2, 1, 2]]), 1), {}, S),
    (A.argmax.default, lambda: (r(3, 4),), {}, None),
    (A.argmin.default, lambda: (torch.tensor([[1, 0, 3, 0], [2, 2, 1, 1]]), None, True), {}, None),
    (A.max.dim, lambda: (torch.tensor([[1.0, 3, 3, 0], [2, 2, 1, 2]]), 1), {}, S),
    (A.min.dim, lambda: (r(3, 4), 0, True), {}, None),
    (A.any.default, lambda: (torch.tensor([0.0, 0.0, 2.0]),), {}, None),
    (A.any.dim, lambda: (rb(3, 4), 1), {}, None),
    (A.all.dims, lambda: (ri(3, 4, lo=0, hi=3), [0]), {}, S),
    (A.var.correction, lambda: (r(3, 4),), {"dim": [1]}, S),
    (A.var.correction, lambda: (r(3, 4),), {"dim": [0, 1], "correction": 0, "keepdim": True}, None),
    (A.var.correction, lambda: (r(3, 4),), {"dim": [1], "correction": 2.5}, None),
    (A.var.dim, lambda: (r(3, 4), [0], False), {}, None),
    (A.std.correction, lambda: (r(3, 4),), {"dim": None}, None),
    (A.var_mean.correction, lambda: (r(3, 4, dtype=torch.float16),), {"dim": [1], "correction": 0}, S),
    (A.std_mean.correction, lambda: (r(3, 4),), {"dim": [0]}, None),
    (A.logsumexp.default, lambda: (torch.tensor([[1.0, 2, 3], [-math.inf, -math.inf, -math.inf]]), [1]), {}, S),
    (A.prod.default, lambda: (r(7),), {}, None),
    (A.prod.dim_int, lambda: (ri(3, 5, lo=-2, hi=3), 1, True), {}, S),
    (A.cumsum.default, lambda: (r(3, 7), 1), {}, S),
    (A.cumsum.default, lambda: (ri(5, dtype=torch.int32), 0), {}, None),
    (A.cumprod.default, lambda: (r(2, 5), -1), {}, None),
    (A.linalg_vector_norm.default, lambda: (r(3, 4),), {}, S),
    (A.linalg_vector_norm.default, lambda: (r(3, 4), 1, [1]), {}, None),
    (A.linalg_vector_norm.default, lambda: (r(3, 4), math.inf, [0], True), {}, None),
    (A.linalg_vector_norm.default, lambda: (r(3, 4), 3), {}, None),
    # 0-d tensors
    (A.sum.default, lambda: (r(),), {}, None),
    (A.mean.default, lambda: (r(),), {}, None),
    (A._softmax.default, lambda: (r(), 0, False), {}, None),
    (A.cumsum.default, lambda: (ri(), 0), {}, None),
    (A.argmax.default, lambda: (r(), 0, True), {}, None),
    (A.amax.default, lambda: (r(), []), {}, None),
    (A.var.correction, lambda: (r(),), {}, None),
    (A.select.int, lambda: (r(4), 0, 1), {}, S),
    (A.mul.Tensor, lambda: (r(), r(3)), {}, S),
    # float16/bfloat16 compute in float32, as torch's CPU kernels do
    (A.mean.dim, lambda: (r(4, 6, dtype=torch.bfloat16), [1]), {}, S),
    (A.cumsum.default, lambda: (r(3, 5, dtype=torch.float16), 1), {}, None),
    (A.gelu.default, lambda: (r(10, dtype=torch.bfloat16),), {"approximate": "tanh"}, None),
    (A.mul.Tensor, lambda: (r(10, dtype=torch.float16), 0.1), {}, None),
    # creation and copies
    (A.full.default, lambda: ([2, 3], 1.5), {}, S),
    (A.full.default, lambda: ([2, 3], 7), {"dtype": torch.int32}, None),
    (A.zeros.default, lambda: ([4],), {}, None),
    (A.ones.default, lambda: ([2, 2],), {"dtype": torch.bool}, None),
    (A.full_like.default, lambda: (r(3, 2), -2), {}, None),
    (A.zeros_like.default, lambda: (r(3, 2),), {"dtype": torch.int64}, None),
    (A.ones_like.default, lambda: (ri(3, 2),), {}, None),
    (A.new_full.default, lambda: (r(3), [2, 2], 4), {}, None),
    (A.fill.Scalar, lambda: (r(3, 2), 2), {}, None),
    (A.fill.Tensor, lambda: (ri(3, 2), torch.tensor(2.7)), {}, None),
    (A.scalar_tensor.default, lambda: (2.5,), {}, None),
    (A.arange.default, lambda: (5,), {}, S),
    (A.arange.start_step, lambda: (0.5, 3.0, 0.25), {}, S),
    (A.arange.start_step, lambda: (10, -3, -3), {}, None),
    (A._to_copy.default, lambda: (r(10) * 4,), {"dtype": torch.int64}, S),
    (A._to_copy.default, lambda: (SPECIAL[:9],), {"dtype": torch.bool}, S),
    (A._to_copy.default, lambda: (r(10),), {"dtype": torch.float16}, S),
    (A._to_copy.default, lambda: (r(10),), {"dtype": torch.bfloat16}, None),
    (A._to_copy.default, lambda: (ri(10),), {"dtype": torch.float32}, None),
    (A.clone.default, lambda: (r(3, 4),), {}, S),
    (A.copy.default, lambda: (r(3, 4), ri(4)), {}, S),
    (A.alias.default, lambda: (r(3),), {}, None),
    (A.lift_fresh_copy.default, lambda: (r(3),), {}, None),
    (A.detach.default, lambda: (r(3),), {}, None),
    # layout
    (A.view.default, lambda: (r(2, 3, 4), [6, -1]), {}, S),
    (A._unsafe_view.default, lambda: (r(2, 3, 4), [24]), {}, None),
    (A.permute.default, lambda: (r(2, 3, 4), [2, 0, 1]), {}, S),
    (A.t.default, lambda: (r(2, 3),), {}, None),
    (A.transpose.int, lambda: (r(2, 3, 4), 0, -1), {}, None),
    (A.expand.default, lambda: (r(3, 1), [2, -1, 4]), {}, S),
    (A.squeeze.default, lambda: (r(1, 3, 1),), {}, None),
    (A.squeeze.dim, lambda: (r(1, 3, 1), -1), {}, None),
    (A.squeeze.dims, lambda: (r(1, 3, 1), [0, 1]), {}, None),
    (A.unsqueeze.default, lambda: (r(3, 4), -1), {}, None),
    (A.slice.Tensor, lambda: (r(5, 8), 1, 1, 7, 2), {}, S),
    (A.slice.Tensor, lambda: (r(5, 8), 0, -3, 100), {}, None),
    (A.slice.Tensor, lambda: (r(5, 8), 0, 4, 2), {}, None),
    (A.select.int, lambda: (r(5, 8), 1, -2), {}, S),
    (A.narrow.default, lambda: (r(5, 8), 1, 2, 3), {}, None),
    (A.as_strided.default, lambda: (r(4, 4), [3, 3], [4, 1], 1), {}, S),
    (A.as_strided.default, lambda: (r(16), [2, 2, 2], [1, 4, 0]), {}, None),
    (A.cat.default, lambda: ([r(2, 3), ri(1, 3)], 0), {}, S),
    (A.cat.default, lambda: ([r(2, 3), r(2, 1)], -1), {}, None),
    (A.stack.default, lambda: ([r(2, 3), r(2, 3)], 1), {}, None),
    (A.split.Tensor, lambda: (r(7, 2), 3), {}, S),
    (A.split_with_sizes.default, lambda: (r(2, 7), [2, 5], 1), {}, None),
    (A.unbind.int, lambda: (r(3, 2), 0), {}, None),
    (A.constant_pad_nd.default, lambda: (r(2, 3, 4), [1, 2, 0, 1]), {"value": 0.5}, S),
    (A.constant_pad_nd.default, lambda: (ri(2, 3, 4), [-1, 2]), {}, None),
    (A.flip.default, lambda: (r(3, 4), [0, 1]), {}, None),
    (A.roll.default, lambda: (r(3, 4), [1, -1], [0, 1]), {}, None),
    (A.roll.default, lambda: (r(3, 4), [5]), {}, None),
    (A.repeat.default, lambda: (r(2, 3), [2, 1, 2]), {}, S),
    (A.tril.default, lambda: (r(4, 5),), {}, None),
    (A.triu.default, lambda: (r(2, 4, 5), 1), {}, None),
    (A.slice_scatter.default, lambda: (r(5, 8), r(5, 3), 1, 2, 5), {}, S),
    (A.slice_scatter.default, lambda: (r(5, 8), r(2, 8), 0, 1, None, 3), {}, None),
    (A.select_scatter.default, lambda: (r(5, 8), r(8), 0, -1), {}, None),
    (A.slice_backward.default, lambda: (r(5, 3), [5, 8], 1, 1, 7, 2), {}, None),
    (A.select_backward.default, lambda: (r(8), [5, 8], 0, 2), {}, None),
    # matrix products
    (A.mm.default, lambda: (r(3, 4), r(4, 5)), {}, S),
    (A.mm.default, lambda: (r(3, 4, dtype=torch.float16), r(4, 5, dtype=torch.float16)), {}, S),
    (A.bmm.default, lambda: (r(2, 3, 4), r(2, 4, 5)), {}, None),
    (A.addmm.default, lambda: (r(5), r(3, 4), r(4, 5)), {}, S),
    (A.addmm.default, lambda: (r(3, 5), r(3, 4), r(4, 5)), {"beta": 0.5, "alpha": 2}, None),
    (A.baddbmm.default, lambda: (r(2, 3, 5), r(2, 3, 4), r(2, 4, 5)), {"beta": 0.0}, None),
    (A.mv.default, lambda: (r(3, 4), r(4)), {}, None),
    (A.dot.default, lambda: (r(4), r(4)), {}, None),
    (A.addmv.default, lambda: (r(3), r(3, 4), r(4)), {"alpha": 3}, None),
    # convolution
    (A.convolution.default, lambda: (r(2, 4, 6, 6), r(6, 2, 3, 3), r(6), [2, 1], [1, 0], [1, 2], False, [0], 2), {}, S),
    (A.convolution.default, lambda: (r(2, 3, 9), r(4, 3, 3), None, [1], [1], [1], False, [0], 1), {}, None),
    (A.convolution.default, lambda: (r(1, 4, 3, 3), r(4, 3, 3, 3), r(6), [2, 2], [1, 1], [1, 1], True, [1, 0], 2), {}, S),
    (A.convolution_backward.default, lambda: (r(2, 6, 3, 3), r(2, 4, 6, 6), r(6, 2, 3, 3), [6], [2, 2], [1, 1],
                                              [1, 1], False, [0, 0], 2, [True, True, True]), {}, S),
    (A.convolution_backward.default, lambda: (r(2, 4, 4, 3), r(2, 4, 6, 6), r(4, 4, 2, 3), None, [1, 2], [0, 1],
                                              [2, 1], False, [0, 0], 1, [True, True, False]), {}, None),
    (A.convolution_backward.default, lambda: (r(1, 6, 6, 6), r(1, 4, 3, 3), r(4, 3, 3, 3), [6], [2, 2], [1, 1],
                                              [1, 1], True, [1, 1], 2, [True, True, True]), {}, None),
    (A.convolution_backward.default, lambda: (r(2, 4, 7), r(2, 3, 9), r(4, 3, 3), None, [1], [0], [1], False,
                                              [0], 1, [False, True, False]), {}, None),
    # norms
    (A.native_layer_norm.default, lambda: (r(3, 4, 5), [5], r(5), r(5), 1e-5), {}, S),
    (A.native_layer_norm.default, lambda: (r(3, 4, 5), [4, 5], None, None, 1e-5), {}, None),
    (A.native_layer_norm.default, lambda: (r(3, 8, dtype=torch.bfloat16), [8], r(8, dtype=torch.bfloat16), None,
                                           1e-5), {}, None),
    (A.native_layer_norm_backward.default, lambda: _ln_backward_args(), {}, S),
    (A.native_layer_norm_backward.default, lambda: _ln_backward_args((2, 3, 4), (3, 4), False), {}, None),
    (A._fused_rms_norm.default, lambda: (r(3, 4, 5), [5], r(5), 1e-6), {}, S),
    (A._fused_rms_norm.default, lambda: (r(3, 4, 5), [4, 5], None, None), {}, None),
    (A.native_batch_norm.default, lambda: (r(4, 3, 2, 2), r(3), r(3), r(3), pos(3), False, 0.1, 1e-5), {}, S),
    (A.native_batch_norm.default, lambda: (r(4, 3, 5), r(3), None, None, None, True, 0.1, 1e-5), {}, None),
    (A._native_batch_norm_legit_no_training.default, lambda: (r(4, 3, 2, 2), r(3), r(3), r(3), pos(3), 0.1, 1e-5),
     {}, None),
    (A._native_batch_norm_legit.no_stats, lambda: (r(4, 3, 2, 2), None, r(3), True, 0.1, 1e-5), {}, None),
    (A._native_batch_norm_legit_functional.default, lambda: (r(4, 3, 2, 2), r(3), r(3), r(3), pos(3), True, 0.1,
                                                             1e-5), {}, S),
    (A.native_batch_norm_backward.default, lambda: _bn_backward_args(True), {}, S),
    (A.native_batch_norm_backward.default, lambda: _bn_backward_args(False), {}, None),
    (A.native_group_norm.default, lambda: (r(2, 6, 3, 2), r(6), r(6), 2, 6, 6, 3, 1e-5), {}, S),
    (A.native_group_norm_backward.default, lambda: _gn_backward_args(), {}, None),
    # dropout
    (A.native_dropout.default, lambda: (r(3, 4), 0.5, False), {}, S),
    (A.native_dropout.default, lambda: (r(3, 4), 0.0, True), {}, None),
    (A.native_dropout.default, lambda: (r(3, 4), 1.0, True), {}, None),
    (A.native_dropout_backward.default, lambda: (r(3, 4), rb(3, 4), 2.0), {}, None),
    # indexing
    (A.index_select.default, lambda: (r(5, 3), 0, torch.tensor([4, 0, 0, 2])), {}, S),
    (A.index_select.default, lambda: (r(5, 3), 1, torch.tensor(2)), {}, None),
    (A.gather.default, lambda: (r(4, 5), 1, ri(4, 3, lo=0, hi=5)), {}, S),
    (A.scatter.src, lambda: (r(4, 5), 1, torch.tensor([[0, 1], [2, 3], [4, 0], [1, 2]]), r(4, 6)), {}, S),
    (A.scatter.value, lambda: (r(4, 5), 0, torch.tensor([[0, 1, 2, 3, 0]]), 9.0), {}, None),
    (A.scatter_add.default, lambda: (r(4, 5), 1, ri(4, 6, lo=0, hi=5), r(4, 6)), {}, S),
    (A.scatter.reduce, lambda: (r(4, 5), 1, ri(4, 6, lo=0, hi=5), r(4, 6)), {"reduce": "add"}, None),
    (A.scatter_reduce.two, lambda: (r(4, 5), 1, ri(4, 6, lo=0, hi=5), r(4, 6), "sum"), {"include_self": False}, None),
    (A.scatter_reduce.two, lambda: (r(4, 5), 1, ri(4, 6, lo=0, hi=5), r(4, 6), "prod"), {}, S),
    (A.scatter_reduce.two, lambda: (r(6, 3), 0, ri(4, 2, lo=0, hi=6), r(5, 3), "amax"), {"include_self": False}, S),
    (A.scatter_reduce.two, lambda: (ri(6, 3), 0, ri(4, 2, lo=0, hi=6), ri(5, 3), "amin"), {}, None),
    (A.scatter_reduce.two, lambda: (r(6, 3), 0, ri(4, 2, lo=0, hi=6), r(5, 3), "mean"), {"include_self": False}, None),
    (A.scatter_reduce.two, lambda: (r(6, 3), 0, ri(4, 2, lo=0, hi=6), r(5, 3), "mean"), {}, None),
    (A.scatter.reduce, lambda: (r(10, 5), 0, ri(5, 5, lo=0, hi=10), r(5, 5)), {"reduce": "multiply"}, S),
    (A.scatter.value_reduce, lambda: (r(10, 5), -1, ri(10, 2, lo=0, hi=5), 2.5), {"reduce": "multiply"}, None),
    (A.scatter.src, lambda: (torch.tensor(1.5), 0, torch.tensor(0), torch.tensor(3.0)), {}, None),
    (A.scatter_add.default, lambda: (torch.tensor(1.5), 0, torch.tensor(0), torch.tensor(3.0)), {}, None),
    (A._index_put_impl.default, lambda: (r(5, 3), [torch.tensor([0, 4, 0])], r(3, 3), True), {}, None),
    (A.index_put.default, lambda: (r(3, 4, 5), [rb(3, 4)], torch.tensor(2.0)), {}, S),
    (A.index_put.default, lambda: (r(3, 4, 5), [None, rb(4, 5)], r(1)), {"accumulate": True}, None),
    (A.index_put.default, lambda: (r(3, 4, 5), [None, rb(4)], r(3, 1, 5)), {}, None),
    (A.index_add.default, lambda: (r(5, 3), 0, torch.tensor([0, 4, 0]), r(3, 3)), {"alpha": 2}, None),
    (A.index.Tensor, lambda: (r(5, 3), [torch.tensor([[4, -1], [0, 0]])]), {}, S),
    (A.index.Tensor, lambda: (r(2, 5, 3), [None, torch.tensor([1, 3])]), {}, None),
    (A.index.Tensor, lambda: (r(4, 5, 3), [torch.tensor([1, 3]), torch.tensor([0, -1])]), {}, None),
    (A.index.Tensor, lambda: (r(4, 5, 3), [torch.tensor([1, 3]), None, torch.tensor([[0], [2]])]), {}, None),
    (A._unsafe_index.Tensor, lambda: (r(4, 5), [None, torch.tensor([0, 0, 4])]), {}, None),
    (A.index_put.default, lambda: (r(5, 3), [torch.tensor([0, 4, 0])], r(3, 3), True), {}, S),
    (A.index_put.default, lambda: (r(4, 5), [None, torch.tensor([1, 3])], torch.tensor(2.0)), {}, None),
    (A.index_put.default, lambda: (ri(4, 5, 3), [torch.tensor([1, 3]), None, torch.tensor([0, 2])], ri(2, 5),
                                   True), {}, None),
    (A.embedding.default, lambda: (r(6, 4), torch.tensor([[0, 5], [2, 2]])), {}, S),
    (A.embedding_dense_backward.default, lambda: (r(2, 3, 4), torch.tensor([[0, 5, 2], [2, 2, 1]]), 6, 2, False),
     {}, S),
    (A.embedding_dense_backward.default, lambda: (r(2, 3, 4), torch.tensor([[0, 5, 2], [2, 2, 1]]), 6, -1, True),
     {}, None),
    # losses
    (A.nll_loss_forward.default, lambda: (r(4, 5).log_softmax(1), torch.tensor([0, 4, 1, 2]), None, 1, -100), {}, S),
    (A.nll_loss_forward.default, lambda: (r(4, 5).log_softmax(1), torch.tensor([0, 4, 1, 1]), pos(5), 1, 1), {}, None),
    (A.nll_loss_forward.default, lambda: (r(4, 5).log_softmax(1), torch.tensor([0, 4, 1, 1]), pos(5), 0, 1), {}, None),
    (A.nll_loss_forward.default, lambda: (r(5).log_softmax(0), torch.tensor(3), None, 2, -100), {}, None),
    (A.nll_loss2d_forward.default, lambda: (r(2, 3, 2, 2).log_softmax(1), ri(2, 2, 2, lo=0, hi=3), None, 1, 1),
     {}, None),
    (A.nll_loss_backward.default, lambda: _nll_backward_args(1), {}, S),
    (A.nll_loss_backward.default, lambda: _nll_backward_args(0), {}, None),
    (A.nll_loss_backward.default, lambda: _nll_backward_args(2, weight=False), {}, None),
    (A.nll_loss2d_backward.default, lambda: _nll_backward_args(1, shape=(2, 3, 2, 2),
                                                               target=ri(2, 2, 2, lo=0, hi=3)), {}, None),
    (A.mse_loss.default, lambda: (r(3, 4), r(3, 4)), {}, S),
    (A.mse_loss.default, lambda: (r(3, 4), r(3, 4), 0), {}, None),
    (A.mse_loss.default, lambda: (r(3, 4), r(3, 4), 2), {}, None),
    (A.mse_loss_backward.default, lambda: (r(), r(3, 4), r(3, 4), 1), {}, None),
    (A.binary_cross_entropy.default, lambda: (unit(3, 4), unit(3, 4)), {}, None),
    (A.binary_cross_entropy_backward.default, lambda: (r(), unit(3, 4), unit(3, 4), pos(3, 4)), {}, None),
    # pooling and resampling
    (A.max_pool2d_with_indices.default, lambda: (r(2, 3, 5, 5), [3, 3], [2, 2], [1, 1]), {}, S),
    (A.max_pool2d_with_indices.default, lambda: (r(3, 6, 6), [2, 2], [2, 2], [0, 0], [2, 2], True), {}, None),
    (A.max_pool2d_with_indices.default, lambda: (torch.tensor([[[[1.0, 1.0], [1.0, 2.0]]]]), [2, 2]), {}, None),
    (A.max_pool2d_with_indices_backward.default, lambda: _maxpool_backward_args(), {}, S),
    (A.avg_pool2d.default, lambda: (r(2, 3, 5, 5), [3, 3], [2, 2], [1, 1]), {}, S),
    (A.avg_pool2d.default, lambda: (r(2, 3, 5, 5), [3, 3], [2, 2], [1, 1], True, False), {}, None),
    (A.avg_pool2d.default, lambda: (r(1, 2, 6, 6), [2, 2], [], [0, 0], False, True, 3), {}, None),
    (A.avg_pool2d_backward.default, lambda: (r(2, 3, 3, 3), r(2, 3, 5, 5), [3, 3], [2, 2], [1, 1], False, True, None),
     {}, S),
    (A.avg_pool2d_backward.default, lambda: (r(2, 3, 3, 3), r(2, 3, 6, 6), [2, 2], [2, 2], [0, 0], True, False,
                                             None), {}, None),
    (A._adaptive_avg_pool2d.default, lambda: (r(2, 3, 4, 6), [2, 3]), {}, S),
    (A._adaptive_avg_pool2d.default, lambda: (r(2, 3, 5, 7), [3, 2]), {}, None),
    (A._adaptive_avg_pool2d_backward.default, lambda: (r(2, 3, 3, 2), r(2, 3, 5, 7)), {}, None),
    (A.upsample_nearest2d.default, lambda: (r(1, 2, 3, 4), [6, 5]), {}, S),
    (A.upsample_nearest2d.vec, lambda: (r(1, 2, 3, 4), None, [2.0, 1.5]), {}, None),
    (A.upsample_nearest2d_backward.default, lambda: (r(1, 2, 6, 5), [6, 5], [1, 2, 3, 4]), {}, None),
    (A.upsample_bilinear2d.default, lambda: (r(1, 2, 3, 4), [5, 7], False), {}, S),
    (A.upsample_bilinear2d.vec, lambda: (r(1, 2, 3, 4), [6, 8], True, None), {}, None),
    (A.upsample_bilinear2d_backward.default, lambda: (r(1, 2, 5, 7), [5, 7], [1, 2, 3, 4], False), {}, None),
    (A.reflection_pad2d.default, lambda: (r(1, 2, 3, 4), [2, 1, 1, 2]), {}, S),
    (A.replication_pad1d.default, lambda: (r(2, 3, 4), [2, 3]), {}, None),
    (A.reflection_pad2d_backward.default, lambda: (r(1, 2, 6, 7), r(1, 2, 3, 4), [2, 1, 1, 2]), {}, None),
    # more math
    (A.asinh.default, lambda: (torch.tensor([1e-7, -0.5, 2.0, -30.0, 0.0]),), {}, S),
    (A.acosh.default, lambda: (torch.tensor([1.0, 1.0 + 1e-6, 2.0, 30.0]),), {}, None),
    (A.atanh.default, lambda: (torch.tensor([1e-7, -0.5, 0.9, -0.99, 0.0]),), {}, None),
    (A.logit.default, lambda: (unit(10),), {}, None),
    (A.logit.default, lambda: (torch.tensor([0.0, 0.5, 1.0]),), {"eps": 1e-3}, None),
    (A.hypot.default, lambda: (r(10), r(10)), {}, None),
    (A.logaddexp.default, lambda: (r(10) * 30, r(10) * 30), {}, None),
    (A.xlogy.Tensor, lambda: (torch.tensor([0.0, 1.0, 2.0, 0.0]), torch.tensor([0.0, 2.0, 0.5, math.nan])), {}, None),
    (A.norm.ScalarOpt_dim, lambda: (r(3, 4), 2, [1]), {}, None),
    (A._safe_softmax.default, lambda: (torch.tensor([[1.0, -math.inf], [-math.inf, -math.inf]]), 1), {}, S),
    (A.diagonal.default, lambda: (r(3, 4, 5), 1, 1, 2), {}, None),
    (A.diagonal.default, lambda: (r(4, 3), -1), {}, None),
    (A.diagonal_backward.default, lambda: (r(3, 4), [3, 4, 5], 1, 1, 2), {}, None),
    (A._unsafe_masked_index.default, lambda: (r(4, 5), rb(3), [None, torch.tensor([0, 4, 9])], 0.0), {}, None),
    (A._unsafe_masked_index_put_accumulate.default, lambda: (r(4, 5), rb(3), [None, torch.tensor([0, 4, 4])],
                                                             r(4, 3)), {}, None),
    (A.avg_pool1d.default, lambda: (r(2, 3, 7), [3], [2], [1]), {}, None),
    (A.adaptive_avg_pool1d.default, lambda: (r(2, 3, 7), [3]), {}, None),
    (A.celu.default, lambda: (r(10),), {"alpha": 2.0}, None),
    (A.selu.default, lambda: (r(10),), {}, None),
    (A._prelu_kernel.default, lambda: (r(2, 3, 4), r(3, 1)), {}, None),
    (A._prelu_kernel_backward.default, lambda: (r(2, 3, 4), r(2, 3, 4), r(3, 1)), {}, None),
    (A.glu_backward.default, lambda: (r(3, 2), r(3, 4), 1), {}, None),
    (A.mish_backward.default, lambda: (r(10), r(10)), {}, None),
    (A.binary_cross_entropy_with_logits.default, lambda: (r(3, 4) * 5, unit(3, 4)), {}, S),
    (A.binary_cross_entropy_with_logits.default, lambda: (r(3, 4) * 5, unit(3, 4), pos(4), pos(4), 2), {}, None),
    (A.huber_loss.default, lambda: (r(3, 4), r(3, 4), 1, 0.5), {}, None),
    (A.huber_loss_backward.default, lambda: (r(), r(3, 4), r(3, 4), 1, 0.5), {}, None),
    (A.smooth_l1_loss.default, lambda: (r(3, 4), r(3, 4), 2, 0.5), {}, None),
    (A.smooth_l1_loss_backward.default, lambda: (r(3, 4), r(3, 4), r(3, 4), 0, 0.5), {}, None),
    (A.l1_loss.default, lambda: (r(3, 4), r(3, 4)), {}, None),
    (A.unsafe_split.Tensor, lambda: (r(5, 2), 2), {}, None),
    # selection
    (A.topk.default, lambda: (r(3, 8), 3), {}, S),
    (A.topk.default, lambda: (torch.tensor([[1.0, math.nan, 3, 2, -math.inf, 0.5]]), 6, 1, False), {}, S),
    (A.topk.default, lambda: (torch.tensor([[1.0, 5.0, 3, -2, -math.inf, math.nan]]), 4), {}, None),
    (A.topk.default, lambda: (torch.randperm(20, generator=_gen).reshape(4, 5), 2, 0), {}, None),
    (A.sort.stable, lambda: (torch.tensor([[2, 1, 2, 0, 1, 2]]),), {"stable": True}, None),
    (A.sort.stable, lambda: (torch.tensor([[2.0, 1, 2, 0, 1, 2]]),), {"stable": True, "descending": True}, None),
    (A.sort.default, lambda: (r(6, 3), 0, True), {}, None),
    (A.sort.stable, lambda: (torch.tensor([3.0, math.nan, -0.0, 0.0, -math.inf, math.nan, 1.0, math.inf, 0.0]),),
     {"stable": True}, S),
    (A.sort.stable, lambda: (torch.tensor([3.0, math.nan, -0.0, 0.0, -math.inf, math.nan, 1.0, math.inf, 0.0]),),
     {"stable": True, "descending": True}, None),
    (A.sort.stable, lambda: (ri(3, 100, 2, lo=0, hi=5),), {"stable": True, "dim": 1}, S),
    (A.sort.stable, lambda: (rb(3, 70),), {"stable": True, "descending": True}, None),
    (A.topk.default, lambda: (r(4, 300), 100), {}, S),
    (A.topk.default, lambda: (r(300, 4), 70, 0, False), {}, None),
    # foreach and in-place (optimizer steps)
    (A._foreach_add.List, lambda: ([r(3), r(2, 2)], [r(3), r(2, 2)]), {"alpha": -0.1}, S),
    (A._foreach_mul.Scalar, lambda: ([r(3), r(2, 2)], 0.9), {}, None),
    (A._foreach_mul.Tensor, lambda: ([r(3), r(2, 2)], r()), {}, None),
    (A._foreach_div.ScalarList, lambda: ([r(3), r(2, 2)], [2.0, 4.0]), {}, None),
    (A._foreach_pow.ScalarAndTensor, lambda: (2.0, [r(3), r(2, 2)]), {}, None),
    (A._foreach_sqrt.default, lambda: ([pos(3), pos(2, 2)],), {}, None),
    (A._foreach_lerp.Scalar, lambda: ([r(3), r(2, 2)], [r(3), r(2, 2)], 0.1), {}, None),
    (A._foreach_addcmul.Scalar, lambda: ([r(3), r(2, 2)], [r(3), r(2, 2)], [r(3), r(2, 2)]), {"value": 0.5}, None),
    (A._foreach_addcdiv.Tensor, lambda: ([r(3), r(2, 2)], [r(3), r(2, 2)], [pos(3), pos(2, 2)], r(2)), {}, None),
    (A._foreach_norm.Scalar, lambda: ([r(3), r(2, 2)],), {}, None),
    (A._foreach_maximum.List, lambda: ([r(3), r(2, 2)], [r(3), r(2, 2)]), {}, None),
    (A._foreach_addcdiv_.Scalar, lambda: ([r(3), r(2, 2)], [r(3), r(2, 2)], [pos(3), pos(2, 2)]), {"value": -0.01},
     S),
    (A.add_.Tensor, lambda: (r(3, 4), r(4)), {"alpha": -0.5}, S),
    (A.mul_.Scalar, lambda: (ri(3, 4), 3), {}, None),
    (A.zero_.default, lambda: (r(3, 4),), {}, None),
    (A.index_put_.default, lambda: (r(5, 3), [torch.tensor([0, 4, 0])], r(3, 3), True), {}, None),
    (A.pow_.Tensor, lambda: (pos(4), r(4)), {}, None),
    # attention
    (A._scaled_dot_product_flash_attention_for_cpu.default, lambda: (r(2, 2, 4, 3), r(2, 2, 5, 3), r(2, 2, 5, 3)),
     {}, S),
    (A._scaled_dot_product_flash_attention_for_cpu.default, lambda: (r(2, 2, 5, 3), r(2, 2, 5, 3), r(2, 2, 5, 3),
                                                                     0.0, True), {"scale": 0.3}, None),
    (A._scaled_dot_product_flash_attention_for_cpu.default, lambda: (r(1, 2, 4, 3), r(1, 2, 5, 3), r(1, 2, 5, 3)),
     {"attn_mask": r(4, 5)}, None),
    (A._scaled_dot_product_flash_attention_for_cpu_backward.default, lambda: _sdpa_backward_args(False), None, S),
    (A._scaled_dot_product_flash_attention_for_cpu_backward.default, lambda: _sdpa_backward_args(True), None, None),
]


def _id(case):
    op, _, kw, _ = case
    return str(op).removeprefix("aten.")


@pytest.fixture(scope="module")
def stacks():
    from fornax.stack import compose, make_config
    return {v: compose(make_config(v)) for v in FAMILIES}


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_lowering_matches_torch(case, stacks):
    op, build, kwargs, on_stack = case
    built = build()
    args, extra = built if isinstance(built, tuple) and len(built) == 2 and isinstance(built[1], dict) \
        and kwargs is None else (built, {})
    check(op, args, {**(kwargs or {}), **extra}, stacks["cuda-like"] if on_stack else None)


OTHER_VENDORS = [
    (A.add.Tensor, lambda: (ri(3, 4, dtype=torch.int32), 2.5), {}),
    (A.div.Tensor_mode, lambda: (ri(20), torch.tensor([3, -3] * 10)), {"rounding_mode": "floor"}),
    (A.addmm.default, lambda: (r(5), r(3, 4), r(4, 5)), {}),
    (A.native_layer_norm.default, lambda: (r(3, 4, 5), [5], r(5), r(5), 1e-5), {}),
    (A.convolution.default, lambda: (r(2, 4, 6, 6), r(6, 2, 3, 3), r(6), [2, 1], [1, 0], [1, 2], False, [0], 2), {}),
    (A.max_pool2d_with_indices.default, lambda: (r(2, 3, 5, 5), [3, 3], [2, 2], [1, 1]), {}),
    (A._softmax.default, lambda: (r(3, 5, dtype=torch.float16), -1, False), {}),
    (A.index_put.default, lambda: (r(5, 3), [torch.tensor([0, 4, 0])], r(3, 3), True), {}),
]


@pytest.mark.parametrize("vendor", ["rocm-like", "xpu-like"])
@pytest.mark.parametrize("case", OTHER_VENDORS, ids=[_id((c[0], None, None, None)) for c in OTHER_VENDORS])
def test_lowering_on_other_vendors(case, vendor, stacks):
    op, build, kwargs = case
    check(op, build(), kwargs, stacks[vendor])


# ---- whole models: forward and backward traced to ATen ------------------------------------------------------------
def lower_fx(gm: torch.fx.GraphModule) -> Graph:
    """Lower a fake-traced ATen FX graph node by node (the graph path's job, in miniature)."""
    import operator

    g = Graph("model")
    env = {}

    def val(a):
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(val(x) for x in a)
        return a

    for node in gm.graph.nodes:
        if node.op == "placeholder":
            m = node.meta["val"]
            env[node] = g.input(node.name, tuple(m.shape), TORCH_TO_DTYPE[m.dtype])
        elif node.op == "call_function" and node.target is operator.getitem:
            env[node] = env[node.args[0]][node.args[1]]
        elif node.op == "call_function":
            if not node.users:
                continue
            metas = _flat(node.meta["val"])
            outs = [None if m is None else OutMeta.of(m) for m in metas]
            res = lower(LowerCtx(g, outs), node.target, val(node.args), val(node.kwargs))
            single = isinstance(node.meta["val"], torch.Tensor)
            env[node] = res[0] if single else res
        elif node.op == "output":
            g.output(*[env[a] for a in node.args[0]])
    return g


class _Net(torch.nn.Module):
    """Conv, batch norm, pooling, MLP, layer norm, cross entropy, embedding and causal attention."""

    def __init__(self, attention=True):
        super().__init__()
        nn = torch.nn
        self.attention = attention
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4, track_running_stats=False)
        self.fc1, self.ln, self.fc2 = nn.Linear(64, 16), nn.LayerNorm(16), nn.Linear(16, 5)
        if attention:
            self.emb, self.qkv = nn.Embedding(10, 8), nn.Linear(8, 24)

    def forward(self, x, tgt, tok):
        F = torch.nn.functional
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        h = self.ln(F.gelu(self.fc1(h.flatten(1))))
        loss = F.cross_entropy(self.fc2(h), tgt)
        if not self.attention:
            return loss
        q, k, v = self.qkv(self.emb(tok)).view(2, 6, 3, 2, 4).permute(2, 0, 3, 1, 4)
        return loss + F.scaled_dot_product_attention(q, k, v, is_causal=True).pow(2).mean()


@pytest.mark.parametrize("decompose", [False, True], ids=["dispatched", "core_aten"])
def test_model_forward_and_backward(decompose, stacks):
    """Every ATen op of a training step (as dispatched, and after the core ATen
    decompositions) has a lowering, and the lowered graph gives the traced graph's
    loss and gradients (reference and the cuda-like stack).  The decomposed step leaves
    attention out: core ATen decomposes the CPU flash-attention forward into ops whose
    "logsumexp" is not the one its (undecomposed) backward expects, so torch's own traced
    gradients are wrong there; the graph path keeps that forward whole."""
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    torch.manual_seed(0)
    net = _Net(attention=not decompose)
    names = [n for n, _ in net.named_parameters()]

    def step(params, x, tgt, tok):
        loss = torch.func.functional_call(net, dict(zip(names, params)), (x, tgt, tok))
        return [loss, *torch.autograd.grad(loss, params)]

    params = [p.detach().clone().requires_grad_() for p in net.parameters()]
    inputs = (params, r(2, 3, 8, 8), torch.tensor([1, 3]), torch.randint(0, 10, (2, 6), generator=_gen))
    gm = make_fx(step, decomposition_table=core_aten_decompositions() if decompose else None,
                 tracing_mode="fake")(*inputs)
    used = {op_name(n.target) for n in gm.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.users}
    assert used <= LOWERED_OPS, sorted(used - LOWERED_OPS)
    g = lower_fx(gm).verify()
    flat_in = [t.detach() for t in params] + list(inputs[1:])
    want = gm(*([p.detach() for p in params], *inputs[1:]))
    feeds = {v.name: to_numpy(t) for v, t in zip(g.inputs, flat_in)}
    for got, w in zip(g.reference(feeds), want):
        compare(got, w, {torch.float32: (1e-4, 1e-5)}, "reference")
    for got, w in zip(stacks["cuda-like"].run(g, feeds).outputs, want):
        compare(got, w, {torch.float32: (1e-3, 1e-4)}, "cuda-like stack")


def op_name(op) -> str:
    return f"{op._schema.name}.{op._overloadname}"


# ---- the interface ------------------------------------------------------------------------------------------------
def test_keys_dtypes_and_lookup():
    assert "aten::relu.default" in LOWERED_OPS and "aten::add.Tensor" in LOWERED_OPS
    assert "aten::sum.dim_IntList" in LOWERED_OPS and "aten::empty.memory_format" not in LOWERED_OPS
    assert lookup(A.relu.default) is lookup("aten::relu.default") is not None
    assert lookup(A.empty.memory_format) is None
    assert all(DTYPE_TO_TORCH[TORCH_TO_DTYPE[t]] is t for t in TORCH_TO_DTYPE)
    assert set(TORCH_TO_DTYPE.values()) == set(DType)
    for name in LOWERED_OPS:           # every key names a real overload
        ns, rest = name.split("::")
        packet, overload = rest.split(".")
        assert hasattr(getattr(getattr(torch.ops, ns), packet), overload), name


def test_every_lowering_takes_its_schemas_arguments():
    """Arguments are passed by schema name: each lowering must accept every one of them."""
    import inspect

    from fornax.frameworks.torch import lowering as L

    for key, fn in L._TABLE.items():
        params = inspect.signature(fn).parameters
        names = [a.name for a in L._resolve(key)._schema.arguments if a.name not in L._IGNORED_KWARGS]
        assert all(n in params for n in names), (key, [n for n in names if n not in params])
        required = [p for p, v in params.items() if p != "ctx" and v.default is inspect.Parameter.empty]
        assert set(required) <= set(names), (key, required)


def test_ctx_helpers_add_no_needless_nodes():
    g = Graph("ctx")
    x = g.input("x", (2,), DType.FLOAT32)
    ctx = LowerCtx(g, [OutMeta((2,), torch.float32)])
    assert ctx.cast(x, torch.float32) is x and ctx.cast(x, DType.FLOAT32) is x and not g.nodes
    assert ctx.cast(x, torch.int64).dtype is DType.INT64 and len(g.nodes) == 1
    s = ctx.scalar(2.5, torch.float16)
    assert s.shape == () and s.dtype is DType.FLOAT16 and float(s.const) == 2.5
    assert ctx.scalar(2.5, DType.FLOAT16) is s          # one constant per value and dtype


def _reason(op, args, kwargs=None, outs=None):
    with pytest.raises(NotLowerable) as info:
        single_op_graph(op, args, kwargs or {}, outs=outs)
    return str(info.value)


def test_not_lowerable_says_why():
    assert _reason(A.add.Tensor, (torch.ones(2, dtype=torch.complex64), torch.ones(2))) == \
        "aten::add.Tensor: complex64 has no fornax dtype (fornax graphs use float64, float32, float16, " \
        "bfloat16, int64, int32, bool)"
    assert "uint8 has no fornax dtype" in _reason(A._to_copy.default, (torch.ones(2),), {"dtype": torch.uint8})
    assert "aten::mm.default: matrix products of int64" in _reason(A.mm.default, (ri(2, 2), ri(2, 2)))
    assert "draws random numbers" in _reason(A.native_dropout.default, (r(4), 0.5, True))
    assert "_native_batch_norm_legit_functional" in _reason(
        A.native_batch_norm.default, (r(2, 3, 4), None, None, r(3), pos(3), True, 0.1, 1e-5))
    assert "data-dependent shape" in _reason(A.index.Tensor, (r(4), [rb(4)]), outs=[OutMeta((2,), torch.float32)])
    assert "no fornax lowering" in _reason(A.empty.memory_format, ([2],))
    assert "mean of integers" in _reason(A.scatter_reduce.two, (ri(4), 0, ri(4, lo=0, hi=4), ri(4), "mean"))
    assert "differ per selected element" in _reason(A.index_put.default, (r(4, 3), [rb(4)], r(2, 3)))


def test_shape_mismatch_is_a_lowering_bug_not_a_wrong_answer():
    with pytest.raises(NotLowerable, match=r"output 0 has shape \(2,\), torch says \(3,\) \(a fornax lowering bug\)"):
        single_op_graph(A.relu.default, (r(2),), outs=[OutMeta((3,), torch.float32)])


def test_empty_outputs_come_back_as_none():
    """Eval batch norm: CPU returns empty save_mean/save_invstd (None here), meta tensors (as
    FakeTensor on any other device) the running mean and 1/sqrt(running_var + eps)."""
    op = A._native_batch_norm_legit_no_training.default
    args = (r(2, 3), None, None, r(3), pos(3), 0.1, 1e-5)
    cpu = [OutMeta.of(t) for t in op(*args)]
    out, mean, rstd = single_op_graph(op, args, outs=cpu)[2]
    assert out is not None and mean is None and rstd is None
    g, feeds, res = single_op_graph(op, args)                  # outs from meta tensors
    assert [v.shape for v in res] == [(2, 3), (3,), (3,)]
    got = g.reference({v.name: to_numpy(t) for v, t in zip(g.inputs, feeds)})
    np.testing.assert_allclose(got[1], args[3].numpy(), rtol=1e-6)
    np.testing.assert_allclose(got[2], 1 / np.sqrt(args[4].numpy().astype(np.float64) + 1e-5), rtol=1e-6)
    assert single_op_graph(A.empty.memory_format, ([0],), {"dtype": torch.uint8})[2] == [None]


def test_lowering_decorator_registers_one_line_lowerings():
    from fornax.frameworks.torch import lowering as L

    name = "aten::hardshrink.default"
    assert name not in L._TABLE
    try:
        lowering(name)(lambda ctx, self, lambd=0.5: ctx.op("where", ctx.op("gt", ctx.op("abs", self),
                                                                          ctx.scalar(lambd, self.dtype)),
                                                           self, ctx.scalar(0, self.dtype)))
        check(A.hardshrink.default, (r(10),), {"lambd": 0.3})
    finally:
        L._TABLE.pop(name, None)


def test_overrideable_convolution_matches_the_cpu_convolution(stacks):
    """PrivateUse1 backends receive convolution_overrideable / convolution_backward_overrideable
    (no CPU kernel): lowered with torch's CPU convolution as the oracle."""
    x, w, b, gy = r(2, 4, 6, 6), r(6, 2, 3, 3), r(6), r(2, 6, 3, 6)
    geo = ([2, 1], [1, 1], [1, 1], False, [0, 0], 2)
    want = A.convolution.default(x, w, b, *geo)
    g, feeds, _ = single_op_graph(A.convolution_overrideable.default, (x, w, b, *geo),
                                  outs=[OutMeta.of(want)])
    np_feeds = {v.name: to_numpy(t) for v, t in zip(g.inputs, feeds)}
    compare(stacks["cuda-like"].run(g, np_feeds).outputs[0], want, STACK_TOL, "convolution_overrideable")
    grads = A.convolution_backward.default(gy, x, w, [6], *geo, [True, True, True])
    g, feeds, _ = single_op_graph(A.convolution_backward_overrideable.default, (gy, x, w, *geo, [True, True, True]),
                                  outs=[OutMeta.of(t) for t in grads])
    np_feeds = {v.name: to_numpy(t) for v, t in zip(g.inputs, feeds)}
    for got, t in zip(g.reference(np_feeds), grads):
        compare(got, t, TOL, "convolution_backward_overrideable")


def test_lower_takes_an_overload_name():
    g = Graph("by_name")
    x = g.input("x", (3,), DType.INT32)
    (y,) = lower(LowerCtx(g, [OutMeta((3,), torch.float32)]), "aten::add.Tensor", (x, 0.5), {})
    g.output(y)
    np.testing.assert_array_equal(g.reference({"x": np.array([1, 2, 3], np.int32)})[0], [1.5, 2.5, 3.5])
    with pytest.raises(NotLowerable, match="not an ATen overload name"):
        lower(LowerCtx(g, [OutMeta((3,), torch.float32)]), "aten::no_such_op.x", (x,), {})


@pytest.mark.parametrize("largest", [True, False])
def test_topk_with_ties_gives_torchs_values_at_valid_distinct_indices(largest, stacks):
    """torch orders equal values in topk as its partial sort leaves them; fornax takes the
    lower index first.  Values (NaN the largest) must match and indices must point at them."""
    x = torch.tensor([[1.0, math.nan, 3, 3, -math.inf, -math.inf, math.nan, 0.0]])
    vals, _ = A.topk.default(x, 7, 1, largest)
    g, feeds, _ = single_op_graph(A.topk.default, (x, 7, 1, largest))
    feeds = {v.name: to_numpy(t) for v, t in zip(g.inputs, feeds)}
    for got_v, got_i in (g.reference(feeds), stacks["cuda-like"].run(g, feeds).outputs):
        compare(got_v, vals, TOL, "topk values")
        assert len(set(got_i[0].tolist())) == 7
        np.testing.assert_array_equal(x.numpy()[0][got_i[0]], np.asarray(got_v[0], np.float32))
