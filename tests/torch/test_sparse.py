"""Sparse COO tensors on fornax: every supported op against PyTorch CPU eager on the same
indices and values (duplicates included, so coalescing is exercised), a sparse embedding
trained with SparseAdam on every family, and clean errors for the rest."""

from __future__ import annotations

import warnings

import pytest
import torch

import fornax.frameworks.torch as ft
from helpers import FAMILIES

VENDORS = FAMILIES
I = torch.tensor([[0, 1, 1, 0, 2], [2, 0, 2, 2, 1]])
V = torch.tensor([3.0, 4.0, 5.0, 1.0, -2.0])


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Sparse invariant checks", UserWarning)
        yield


def _pair(values=V):
    return (torch.sparse_coo_tensor(I, values, (3, 3)),
            torch.sparse_coo_tensor(I.to("fornax"), values.to("fornax"), (3, 3)))


def _same(want, got):
    assert got.device.type == "fornax" and got.layout == want.layout
    if want.is_sparse:
        assert got.is_coalesced() == want.is_coalesced()
        want, got = want.coalesce(), got.coalesce()
        assert torch.equal(got.indices().cpu(), want.indices())
        torch.testing.assert_close(got.values().cpu(), want.values())
    else:
        torch.testing.assert_close(got.cpu(), want)


DENSE = torch.arange(9.0).reshape(3, 3) - 4
CASES = {
    "coalesce": lambda s: s.coalesce(),
    "to_dense": lambda s: s.to_dense(),
    "sparse + sparse": lambda s: s + s * 2,
    "dense + sparse": lambda s: DENSE.to(s.device) + s,
    "dense.add_(sparse, alpha)": lambda s: DENSE.to(s.device).clone().add_(s, alpha=-0.5),
    "sparse.add_(sparse)": lambda s: s.clone().add_(s),
    "neg": lambda s: -s,
    "div": lambda s: s / 4,
    "mul_ by a 0-dim tensor": lambda s: s.clone().mul_(torch.tensor(3.0).to(s.device)),
    "zero_": lambda s: s.clone().zero_(),
    "sparse_mask": lambda s: DENSE.to(s.device).sparse_mask(s.coalesce()),
    "torch.sparse.mm": lambda s: torch.sparse.mm(s, DENSE[:, :2].to(s.device)),
    "addmm": lambda s: torch.addmm(torch.ones(3, 2).to(s.device), s, DENSE[:, :2].to(s.device),
                                   beta=0.5, alpha=2),
    "torch.sparse.sum": lambda s: torch.sparse.sum(s),
    "clone": lambda s: s.clone(),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sparse_ops_match_the_cpu(case):
    cpu, dev = _pair()
    _same(CASES[case](cpu), CASES[case](dev))


def test_sparse_tensors_move_between_devices_and_keep_their_structure():
    cpu, dev = _pair()
    back = dev.cpu()
    assert back.device.type == "cpu" and back.is_sparse and not back.is_coalesced()
    assert torch.equal(back._indices(), I) and torch.equal(back._values(), V)
    _same(cpu, cpu.to("fornax"))
    _same(cpu.to(torch.float64), dev.to(torch.float64))
    _same(cpu.to_dense(), dev.to_dense())


def test_gradient_through_to_dense_is_the_cpus():
    grads = []
    for device in ("cpu", "fornax"):
        x = torch.sparse_coo_tensor(I, V, (3, 3), device=device, requires_grad=True)
        (x.to_dense() * DENSE.to(device)).sum().backward()
        grads.append(x.grad)
    _same(*grads)


@pytest.mark.parametrize("vendor", VENDORS)
def test_sparse_embedding_trains_with_sparse_adam_like_the_cpu(vendor):
    ft.use_stack(vendor)
    torch.manual_seed(0)
    ref = torch.nn.Embedding(10, 4, sparse=True)
    dev = torch.nn.Embedding(10, 4, sparse=True)
    dev.load_state_dict(ref.state_dict())
    dev.to("fornax")
    opts = [torch.optim.SparseAdam(m.parameters(), lr=0.1) for m in (ref, dev)]
    for step in range(3):
        idx = torch.randint(0, 10, (7,), generator=torch.Generator().manual_seed(step))
        for m, opt, device in zip((ref, dev), opts, ("cpu", "fornax")):
            opt.zero_grad()
            m(idx.to(device)).tanh().pow(2).sum().backward()
            assert m.weight.grad.is_sparse
            opt.step()
        torch.testing.assert_close(dev.weight.detach().cpu(), ref.weight.detach())
    rows = {r["op"]: r["route"] for r in ft.report()["ops"]}
    assert rows.get("aten::_coalesce") == "decomposed", sorted(rows)


def test_bad_sparse_input_gets_pytorchs_errors():
    _, dev = _pair()
    with pytest.raises(RuntimeError, match="backend of indices"):
        torch.sparse_coo_tensor(I, V.to("fornax"), (3, 3))
    with pytest.raises(RuntimeError, match="sizes of 'self' and 'other' to match"):
        dev + torch.sparse_coo_tensor(size=(2, 3), device="fornax")
    with pytest.raises(RuntimeError, match=r"add\(sparse, dense\) is not supported"):
        dev + DENSE.to("fornax")                # as on the CPU
    with pytest.raises(RuntimeError, match="uncoalesced"):
        dev.values()
    with pytest.raises(RuntimeError, match="size is inconsistent with indices"):
        torch.sparse_coo_tensor(torch.tensor([[0, 5]]), torch.tensor([1.0, 2.0]), (3,),
                                device="fornax", check_invariants=True)
    with pytest.raises(NotImplementedError, match="Sparsefornax"):
        torch.sparse.softmax(dev, 0)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.sparse.mm(dev, torch.ones(2, 2, device="fornax"))
    # none of it poisoned the device
    assert torch.equal((torch.ones(2, device="fornax") + 1).cpu(), torch.full((2,), 2.0))


@pytest.mark.parametrize("make", [lambda d: d.to_sparse(), lambda d: d.to_sparse(1),
                                  lambda d: d.to_sparse(dense_dim=1), lambda d: d[0].to_sparse()],
                         ids=["all dims", "sparse_dim=1", "dense_dim=1", "1-D"])
def test_dense_tensors_become_sparse_like_on_the_cpu(make):
    dense = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 3.0]])
    want, got = make(dense), make(dense.to("fornax"))
    assert (got.sparse_dim(), got.dense_dim()) == (want.sparse_dim(), want.dense_dim())
    _same(want, got)
    with pytest.raises(RuntimeError, match=r"sparse_dim argument must be in \[0,2\] range"):
        dense.to("fornax").to_sparse(3)
