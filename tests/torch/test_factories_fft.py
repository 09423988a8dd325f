"""Factories honour the device they are asked for; lazily conjugated / negated tensors
(PyTorch's conj and neg bits, which every inverse FFT of a real input returns) show their
logical values on the ``fornax`` device.

References are PyTorch CPU eager with the same seed; FFTs use PyTorch's float32
tolerances (``torch.testing.assert_close`` defaults).
"""

from __future__ import annotations

import pytest
import torch

import fornax.frameworks.torch as ft

DEV = "fornax"


@pytest.fixture(autouse=True)
def cuda_like():
    ft.use_stack("cuda-like")
    yield


def _seeded(fn, seed=7):
    torch.manual_seed(seed)
    return fn()


# -- factories ---------------------------------------------------------------------------------
FACTORIES = {
    "randint": lambda d: torch.randint(2, 10, (5,), device=d),
    "randint_high": lambda d: torch.randint(10, (5,), dtype=torch.float64, device=d),
    "randn": lambda d: torch.randn(3, 4, device=d),
    "rand": lambda d: torch.rand(3, 4, device=d),
    "randperm": lambda d: torch.randperm(9, device=d),
    "arange": lambda d: torch.arange(1, 3, 0.25, device=d),
    "linspace": lambda d: torch.linspace(-1, 2, 7, device=d),
    "logspace": lambda d: torch.logspace(1, 3, 5, base=2.0, device=d),
    "full": lambda d: torch.full((2, 3), 1.5, device=d),
    "eye": lambda d: torch.eye(3, 4, device=d),
}

LIKE = {
    "randint_like": lambda x, **kw: torch.randint_like(x, 2, 10, **kw),
    "randn_like": lambda x, **kw: torch.randn_like(x, **kw),
    "rand_like": lambda x, **kw: torch.rand_like(x, **kw),
    "zeros_like": lambda x, **kw: torch.zeros_like(x, **kw),
    "full_like": lambda x, **kw: torch.full_like(x, 3.0, **kw),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_factory_asked_for_fornax_is_on_fornax_with_cpu_values(name):
    make = FACTORIES[name]
    got = _seeded(lambda: make(DEV))
    want = _seeded(lambda: make("cpu"))
    assert got.device.type == DEV
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(LIKE))
def test_like_factory_of_a_fornax_tensor_stays_on_fornax(name):
    make = LIKE[name]
    x = torch.ones(2, 3)
    got = _seeded(lambda: make(x.to(DEV)))
    want = _seeded(lambda: make(x))
    assert got.device.type == DEV
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    # a dtype change keeps the device
    got64 = _seeded(lambda: make(x.to(DEV), dtype=torch.float64))
    assert got64.device.type == DEV and got64.dtype == torch.float64
    torch.testing.assert_close(got64.cpu(), _seeded(lambda: make(x, dtype=torch.float64)), rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(LIKE))
def test_like_factory_asked_for_the_cpu_returns_a_cpu_tensor(name):
    """PyTorch's OpInfo samples ask ``*_like(fornax_tensor, device="cpu")`` on purpose: the
    result belongs on the CPU, as it would for a CUDA input."""
    make = LIKE[name]
    x = torch.ones(4)
    got = _seeded(lambda: make(x.to(DEV), device="cpu"))
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, _seeded(lambda: make(x)), rtol=0, atol=0)


def test_out_factories_write_the_fornax_destination():
    out = torch.empty(5, dtype=torch.int64, device=DEV)
    torch.manual_seed(3)
    torch.randint(0, 100, (5,), out=out)
    torch.manual_seed(3)
    assert torch.equal(out.cpu(), torch.randint(0, 100, (5,)))
    lin = torch.empty(4, device=DEV)
    torch.logspace(0, 3, 4, out=lin)
    torch.testing.assert_close(lin.cpu(), torch.logspace(0, 3, 4))


# -- conjugate and negative bits -----------------------------------------------------------------
def _complex(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.complex64, generator=g)


def test_conj_view_reads_back_conjugated():
    z = _complex(3, 4)
    zc = z.to(DEV).conj()
    assert zc.is_conj()
    assert torch.equal(zc.cpu(), z.conj())
    assert torch.equal(zc.resolve_conj().cpu(), z.conj().resolve_conj())
    assert torch.equal(zc.clone().cpu(), z.conj())
    host = torch.empty(3, 4, dtype=torch.complex64).copy_(zc)
    assert torch.equal(host, z.conj())


def test_ops_on_conj_and_neg_views_use_logical_values():
    z, w = _complex(3, 3, seed=1), _complex(3, 3, seed=2)
    zd, wd = z.to(DEV), w.to(DEV)
    torch.testing.assert_close((zd.conj() + wd).cpu(), z.conj() + w)
    torch.testing.assert_close((zd.conj() @ wd).cpu(), z.conj() @ w)      # mm reads the bit itself
    torch.testing.assert_close(zd.conj().t().contiguous().cpu(), z.conj().t().contiguous())
    imag = zd.conj().imag                                                  # a negative view
    assert imag.is_neg()
    torch.testing.assert_close(imag.cpu(), z.conj().imag)
    torch.testing.assert_close((imag * 2).cpu(), z.conj().imag * 2)


def test_in_place_conj_and_out_of_a_conj_view():
    z = _complex(2, 5, seed=3)
    t = z.to(DEV)
    t.conj_physical_()                         # ATen's kernel calls a CPU/CUDA stub directly
    assert torch.equal(t.cpu(), z.conj())
    flagged = z.to(DEV).conj()
    flagged.conj_physical_()                   # conj of the logical values, flag kept
    assert flagged.is_conj() and torch.equal(flagged.cpu(), z)
    out = torch.empty(2, 5, dtype=torch.complex64, device=DEV)
    torch.conj_physical(z.to(DEV).conj(), out=out)
    assert torch.equal(out.cpu(), z)


# -- FFTs whose result is a lazily conjugated tensor ---------------------------------------------
FFTS = {
    "ifft": lambda x: torch.fft.ifft(x),
    "ifft_n_ortho": lambda x: torch.fft.ifft(x, n=9, dim=1, norm="ortho"),
    "ihfft": lambda x: torch.fft.ihfft(x),
    "ihfft2": lambda x: torch.fft.ihfft2(x, s=(3, 10), dim=(1, 2), norm="ortho"),
    "ihfft2_dim0": lambda x: torch.fft.ihfft2(x, dim=(0, -1)),
    "ihfftn": lambda x: torch.fft.ihfftn(x),
    "ihfftn_one_dim": lambda x: torch.fft.ihfftn(x, dim=-2),
    "hfft": lambda x: torch.fft.hfft(x.to(torch.complex64)),
    "hfft2": lambda x: torch.fft.hfft2(x.to(torch.complex64) * (1 + 0.5j)),
    "hfftn": lambda x: torch.fft.hfftn(x.to(torch.complex64) * (1 - 2j), s=(4, 6), dim=(0, 2)),
}


@pytest.mark.parametrize("name", sorted(FFTS))
def test_fft_matches_cpu_forward_and_noncontiguous(name):
    fn = FFTS[name]
    x = torch.randn(5, 6, 7, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(fn(x.to(DEV)).cpu(), fn(x))
    nc = x.to(DEV).transpose(0, 2).contiguous().transpose(0, 2)         # same values, strided
    assert not nc.is_contiguous()
    torch.testing.assert_close(fn(nc).cpu(), fn(x))


@pytest.mark.parametrize("name", ["ihfft2", "hfft2", "hfftn", "ifft"])
def test_fft_backward_matches_cpu(name):
    fn = FFTS[name]
    x = torch.randn(5, 6, 7, generator=torch.Generator().manual_seed(6))
    xc = x.clone().requires_grad_()
    xd = x.to(DEV).requires_grad_()
    want = fn(xc)
    grad = torch.randn(want.shape, dtype=want.dtype, generator=torch.Generator().manual_seed(8))
    (gc,) = torch.autograd.grad(want, xc, grad)
    (gd,) = torch.autograd.grad(fn(xd), xd, grad.to(DEV))
    assert gd.device.type == DEV
    torch.testing.assert_close(gd.cpu(), gc)


def test_fft_out_matches_cpu_for_several_dims():
    x = torch.randn(5, 6, 7, generator=torch.Generator().manual_seed(9))
    want = torch.fft.ihfft2(x, norm="ortho")
    out = torch.empty(want.shape, dtype=want.dtype, device=DEV)
    torch.fft.ihfft2(x.to(DEV), norm="ortho", out=out)
    assert not out.is_conj()
    torch.testing.assert_close(out.cpu(), want)
    want = torch.fft.ifft(x)
    out = torch.empty(want.shape, dtype=want.dtype, device=DEV)
    torch.fft.ifft(x.to(DEV), out=out)
    torch.testing.assert_close(out.cpu(), want)
