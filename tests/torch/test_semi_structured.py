"""2:4 semi-structured weights on the fornax device: F.linear and mm through the library's
sparse GEMM, against float64 products of the pruned weight."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fornax.frameworks.torch as ft
from fornax.frameworks.torch.semi_structured import (SemiStructuredWeight, prune_2to4,
                                                     to_sparse_semi_structured)
from fornax.layers.errors import FornaxError, InvalidArgumentError, NotSupportedError


@pytest.fixture(scope="module")
def tensors():
    ft.use_stack("cuda-like", spec="tiny")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(32, 64, generator=g).to(torch.bfloat16)
    x = torch.randn(2, 5, 64, generator=g).to(torch.bfloat16)
    b = torch.randn(32, generator=g).to(torch.bfloat16)
    yield w, x, b
    ft.use_stack("cuda-like")


def test_linear_and_mm_on_a_compressed_weight_match_the_pruned_dense_product(tensors):
    w, x, b = tensors
    wp = prune_2to4(w.to("fornax"))
    pruned = wp.cpu().double()
    groups = pruned.reshape(32, 16, 4)
    assert int((groups != 0).sum(-1).max()) <= 2                       # 2:4 along in-features
    kept = torch.topk(w.double().abs().reshape(32, 16, 4), 2, dim=-1).indices
    assert torch.equal(torch.sort(kept, -1).values,
                       torch.sort(torch.topk(groups.abs(), 2, dim=-1).indices, -1).values)
    ws = to_sparse_semi_structured(wp)
    assert isinstance(ws, SemiStructuredWeight) and ws.shape == (32, 64)
    y = F.linear(x.to("fornax"), ws, b.to("fornax")).cpu().double()
    ref = x.double() @ pruned.T + b.double()
    assert y.shape == (2, 5, 32)
    # float32 accumulation, one bfloat16 rounding of the output
    assert torch.allclose(y, ref, rtol=2 ** -8, atol=2 ** -6)
    z = torch.mm(ws, x[0].to("fornax").T.contiguous()).cpu().double()
    assert torch.allclose(z, pruned @ x[0].double().T, rtol=2 ** -8, atol=2 ** -6)
    assert torch.equal(ws.to_dense().cpu().double(), pruned)
    with pytest.raises(NotImplementedError, match="aten.add.Tensor"):
        ws + 1
    # nn.Linear on it, as PyTorch's own route is used; inference only
    linear = torch.nn.Linear(64, 32, dtype=torch.bfloat16).to("fornax")
    linear.weight = torch.nn.Parameter(ws, requires_grad=False)
    out = linear(x.to("fornax")).cpu().double()
    assert torch.allclose(out, x.double() @ pruned.T + linear.bias.detach().cpu().double(),
                          rtol=2 ** -8, atol=2 ** -6)
    with pytest.raises(FornaxError, match="no gradient"):
        F.linear(x.to("fornax").requires_grad_(), ws)


def test_a_weight_that_is_not_2to4_is_refused_with_the_family_code(tensors):
    w, _, _ = tensors
    with pytest.raises(InvalidArgumentError) as e:
        to_sparse_semi_structured(w.to("fornax"))
    assert e.value.code.name == "CUSPARSE_STATUS_INVALID_VALUE" and "prune" in e.value.hint


def test_the_xpu_family_refuses_2to4():
    ft.use_stack("xpu-like", spec="tiny")
    try:
        with pytest.raises(NotSupportedError) as e:
            to_sparse_semi_structured(torch.zeros(32, 32, dtype=torch.bfloat16).to("fornax"))
        assert e.value.code.name == "dnnl_unimplemented"
    finally:
        ft.use_stack("cuda-like")
