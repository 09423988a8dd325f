"""Tensor semantics the fornax device keeps as PyTorch defines them, fixed at the root:

* parameter identity and ties survive ``Module.to()`` / ``.cpu()`` / ``.half()`` /
  ``.fornax()`` (as on CUDA), with gradients and optimizers built before the move;
* integer powers with negative exponents compute what the CPU computes, a bad argument is
  refused before anything launches with PyTorch's own message, and neither leaves the
  device context unusable;
* the executor converts non-finite floats to integers without undefined numpy casts (a
  T5 model, whose relative-position buckets take ``log(0)``, matches the CPU);
* integer ``histc`` (what a mixture-of-experts layer calls on accelerators) is counted on
  the device instead of being handed to a CPU kernel that lacks the dtype.

The reference is always PyTorch CPU eager on the same model and inputs.
"""

from __future__ import annotations

import copy
import weakref

import numpy as np
import pytest
import torch
from torch import nn

import fornax.frameworks.torch as ft
from fornax.sim import arithmetic
from fornax.sim import isa
from helpers import FAMILIES

VENDORS = FAMILIES


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=32, n_positions=8,
                     bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


def _close_grads(cpu_model, dev_model, atol=1e-5):
    pairs = list(zip(cpu_model.named_parameters(), dev_model.parameters()))
    assert len(pairs) == len(list(cpu_model.parameters())) == len(list(dev_model.parameters()))
    for (name, p), q in pairs:
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=atol, rtol=1e-4, msg=name)


# ---- 1. ties and identity across moves ---------------------------------------------------------
def test_tied_embedding_stays_tied_and_trains_like_cpu():
    ft.use_stack("cuda-like")
    cpu = _gpt2()
    dev = copy.deepcopy(cpu).to("fornax")
    assert cpu.lm_head.weight is cpu.transformer.wte.weight
    assert dev.lm_head.weight is dev.transformer.wte.weight
    assert len(list(dev.parameters())) == len(list(cpu.parameters())) == 16
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(1))
    loss_cpu = cpu(ids, labels=ids).loss
    loss_dev = dev(ids.to("fornax"), labels=ids.to("fornax")).loss
    loss_cpu.backward()
    loss_dev.backward()
    torch.testing.assert_close(loss_dev.cpu(), loss_cpu, atol=1e-5, rtol=1e-5)
    _close_grads(cpu, dev)
    # one SGD step: the tied weight moves once, by the sum of both uses' gradients
    for model in (cpu, dev):
        torch.optim.SGD(model.parameters(), lr=0.5).step()
    torch.testing.assert_close(dev.lm_head.weight.cpu(), cpu.lm_head.weight, atol=1e-5, rtol=1e-5)


def test_parameter_identity_grads_and_optimizer_survive_every_move():
    ft.use_stack("cuda-like")
    model = _gpt2()
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(2))
    model(ids, labels=ids).loss.backward()
    params = list(model.parameters())
    wte = model.transformer.wte.weight
    wte.tag = "embedding"                       # Python attributes stay with the object
    grad_before = wte.grad.clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    moves = [("to fornax", lambda m: m.to("fornax"), "fornax", torch.float32),
             ("cpu", lambda m: m.cpu(), "cpu", torch.float32),
             ("half", lambda m: m.half(), "cpu", torch.float16),
             ("fornax()", lambda m: m.fornax(), "fornax", torch.float16),
             ("to dtype", lambda m: m.to(torch.float32), "fornax", torch.float32),
             ("to cpu", lambda m: m.to("cpu"), "cpu", torch.float32)]
    for what, move, device, dtype in moves:
        assert move(model) is model
        now = list(model.parameters())
        assert len(now) == len(params) and all(a is b for a, b in zip(now, params)), what
        assert model.lm_head.weight is wte, what
        assert wte.device.type == device and wte.dtype == dtype, what
        assert wte.grad.device.type == device and wte.grad.dtype == dtype, what
        assert wte.tag == "embedding", what
        assert all(a is b for a, b in zip(opt.param_groups[0]["params"], model.parameters())), what
    torch.testing.assert_close(wte.grad, grad_before, atol=1e-3, rtol=1e-3)   # through float16


def test_ties_are_restored_where_a_parameter_cannot_be_swapped():
    ft.use_stack("cuda-like")
    model = _gpt2()
    old = model.transformer.wte.weight
    watcher = weakref.ref(old)                  # a weak reference forbids swap_tensors
    model.to("fornax")
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.lm_head.weight.device.type == "fornax"
    assert len(list(model.parameters())) == 16
    assert watcher() is old


def test_module_apply_outside_fornax_is_unchanged():
    """CPU-only moves keep PyTorch's own behaviour (``param.data = ...``, same objects)."""
    lin = nn.Linear(3, 2)
    w = lin.weight
    lin.double()
    assert lin.weight is w and w.dtype == torch.float64


# ---- 2. validation before launch; no poisoned context -------------------------------------------
def _device_still_works():
    x = torch.arange(4.0, device="fornax")
    torch.testing.assert_close((x * 2 + 1).cpu(), torch.arange(4.0) * 2 + 1)


@pytest.mark.parametrize("vendor", VENDORS)
def test_integer_pow_with_negative_exponents_matches_cpu(vendor):
    ft.use_stack(vendor)
    base = torch.tensor([-3, -1, 0, 1, 2, 5, -2, 3], dtype=torch.int64)
    expo = torch.tensor([-1, -3, -2, -4, -1, 3, 63, 41], dtype=torch.int64)
    cases = [
        lambda b, e: 2 ** e,                              # __rpow__ (pow.Scalar)
        lambda b, e: b ** e,                              # pow.Tensor_Tensor (wraps on overflow)
        lambda b, e: torch.pow(b, torch.tensor(-2)),      # 0-d CPU exponent tensor
        lambda b, e: b.to(torch.int32) ** e.to(torch.int32),
    ]
    for case in cases:
        want = case(base, expo)
        got = case(base.to("fornax"), expo.to("fornax"))
        assert got.dtype == want.dtype
        assert torch.equal(got.cpu(), want)
    _device_still_works()


@pytest.mark.parametrize("call", [lambda x: torch.pow(x, -2), lambda x: x.pow_(-1),
                                  lambda x: x ** -3])
def test_bad_pow_argument_is_refused_with_pytorchs_message_and_the_context_survives(call):
    ft.use_stack("cuda-like")
    with pytest.raises(RuntimeError) as cpu_err:
        call(torch.tensor([1, 2]))
    with pytest.raises(RuntimeError) as dev_err:
        call(torch.tensor([1, 2], device="fornax"))
    assert type(dev_err.value) is type(cpu_err.value)
    assert str(dev_err.value) == str(cpu_err.value)
    _device_still_works()


def test_a_kernel_that_does_not_build_is_a_compile_error_not_a_device_fault(monkeypatch):
    """The compiler seam refusing a kernel happens before launch: the op still answers (on
    the route the family falls back to), the refusal is reported with its reason, and the
    context keeps working."""
    from fornax.layers.errors import CompileError
    ft.use_stack("cuda-like")
    framework = ft.current().framework
    real = framework.prepare

    def prepare(graph, stream):
        if graph.name.startswith("aten_atan2"):
            raise CompileError("tile does not fit the register file", seam="compiler", op="atan2")
        return real(graph, stream)
    monkeypatch.setattr(framework, "prepare", prepare)
    a, b = torch.randn(3, 5, 7), torch.randn(3, 5, 7)          # a shape no other test compiles
    got = torch.atan2(a.to("fornax"), b.to("fornax"))
    torch.testing.assert_close(got.cpu(), torch.atan2(a, b))
    text = repr(ft.report())
    assert "tile does not fit the register file" in text
    _device_still_works()


def test_opinfo_rpow_int64_samples_match_cpu():
    from torch.testing._internal.common_methods_invocations import op_db
    ft.use_stack("rocm-like")
    op = next(o for o in op_db if o.name == "__rpow__")
    n = 0
    for sample in op.sample_inputs("cpu", torch.int64):
        want = op(sample.input, *sample.args, **sample.kwargs)
        moved = sample.transform(lambda t: t.to("fornax") if isinstance(t, torch.Tensor) else t)
        got = op(moved.input, *moved.args, **moved.kwargs)
        assert torch.equal(got.cpu(), want), sample
        n += 1
    assert n > 0
    _device_still_works()


# ---- 3. the executor's conversions ---------------------------------------------------------------
def test_convert_of_non_finite_floats_saturates_without_warnings():
    x = np.array([np.nan, np.inf, -np.inf, 3e30, -3e30, 2.9, -2.9, 0.0], np.float32)
    with np.errstate(all="raise"):
        got64 = arithmetic.cast(x, np.dtype(np.int64))
        got32 = arithmetic.cast(x.astype(isa.DTYPES["bfloat16"]), np.dtype(np.int32))
    i64, i32 = np.iinfo(np.int64), np.iinfo(np.int32)
    assert got64.tolist() == [0, i64.max, i64.min, i64.max, i64.min, 2, -2, 0]
    assert got32.dtype == np.int32
    assert got32.tolist() == [0, i32.max, i32.min, i32.max, i32.min, 2, -2, 0]


def test_float_to_int_cast_on_device_matches_cpu_where_cpu_defines_it():
    ft.use_stack("xpu-like")
    x = torch.tensor([-float("inf"), -7.9, -0.5, 0.0, 0.5, 7.9, 1e6])
    got = x.to("fornax").to(torch.int64).cpu()
    assert torch.equal(got, x.to(torch.int64))        # -inf: the smallest int64 on both


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(0)
    cfg = T5Config(d_model=32, d_ff=64, num_layers=2, num_heads=2, vocab_size=64, d_kv=16,
                   dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return T5ForConditionalGeneration(cfg)


@pytest.mark.parametrize("vendor", VENDORS)
def test_t5_forward_backward_matches_cpu(vendor):
    ft.use_stack(vendor)
    cpu = _t5()
    dev = copy.deepcopy(cpu).to("fornax")
    g = torch.Generator().manual_seed(3)
    ids, labels = torch.randint(2, 64, (2, 7), generator=g), torch.randint(2, 64, (2, 5), generator=g)
    want = cpu(input_ids=ids, labels=labels)
    got = dev(input_ids=ids.to("fornax"), labels=labels.to("fornax"))
    want.loss.backward()
    got.loss.backward()
    torch.testing.assert_close(got.logits.cpu(), want.logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got.loss.cpu(), want.loss, atol=1e-5, rtol=1e-5)
    _close_grads(cpu, dev)


# ---- 4. integer histc and a mixture-of-experts layer --------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_histc_counts_like_the_float_histogram(dtype):
    ft.use_stack("cuda-like")
    x = torch.randint(-5, 12, (60,), generator=torch.Generator().manual_seed(4))
    for bins, lo, hi in [(4, 0, 3), (5, 0, 0), (7, -2, 9), (3, 20, 30)]:
        got = torch.histc(x.to(dtype).to("fornax"), bins, lo, hi)
        assert got.dtype == dtype and got.device.type == "fornax"
        want = torch.histc(x.to(torch.float64), bins, lo, hi)
        assert torch.equal(got.cpu().to(torch.float64), want)
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(x.to(dtype).to("fornax"), 3, 5, 1)
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(x.to(dtype).to("fornax"), 0)


def _moe_block():
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(0)
    cfg = MixtralConfig(hidden_size=32, intermediate_size=64, num_local_experts=4,
                        num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=1, vocab_size=64, max_position_embeddings=32)
    return MixtralForCausalLM(cfg).model.layers[0].mlp     # initialised, grouped_mm experts


@pytest.mark.parametrize("vendor", VENDORS)
def test_mixtral_moe_forward_backward_matches_cpu(vendor):
    ft.use_stack(vendor)
    cpu = _moe_block()
    dev = copy.deepcopy(cpu).to("fornax")
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(5))
    want = cpu(x)
    got = dev(x.to("fornax"))
    want, got = (want[0], got[0]) if isinstance(want, tuple) else (want, got)
    (want ** 2).sum().backward()
    (got ** 2).sum().backward()
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-4)
    _close_grads(cpu, dev)


def test_zero_tensor_gradients_arrive_as_real_zeros():
    """``sgn``'s backward hands autograd a ZeroTensor (storage-less zeros); on fornax it is
    materialised as zeros, as the CPU's gradient reads."""
    x = torch.tensor([0.0, 1.5, -2.0, 3.0])
    want, = torch.autograd.grad(torch.sgn(x.requires_grad_()).sum(), x)
    xd = x.detach().to("fornax").requires_grad_()
    got, = torch.autograd.grad(torch.sgn(xd).sum(), xd)
    assert got.device.type == "fornax"
    torch.testing.assert_close(got.cpu(), want)
    assert not got._is_zerotensor()


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support")
@pytest.mark.parametrize("convert", [lambda x: x.to_sparse_csr(), lambda x: x.to_sparse_csc()])
def test_a_sparse_result_is_a_clear_error_not_a_broken_copy(convert):
    """Compressed layouts have no fornax kernels (sparse COO does: tests/torch/test_sparse.py)."""
    x = torch.eye(3, device="fornax")
    with pytest.raises(NotImplementedError, match=r"has strided and sparse COO kernels only"):
        convert(x)
    torch.testing.assert_close((x + 1).cpu(), torch.eye(3) + 1)      # the device keeps working


def test_atanh_is_accurate_near_minus_one_and_keeps_the_sign_of_zero():
    x = torch.cat([torch.linspace(-1, 1, 4001), torch.tensor([-0.9971658, 0.0, -0.0, float("nan"), 2.0])])
    got = torch.atanh(x.to("fornax")).cpu()
    torch.testing.assert_close(got, torch.atanh(x), equal_nan=True, atol=0, rtol=4e-7)
    assert torch.signbit(got[-3]) and not torch.signbit(got[-4])


@pytest.mark.parametrize("make, shape", [(lambda: nn.LazyLinear(3), (2, 4)), (lambda: nn.LazyConv2d(2, 3), (1, 3, 5, 5)),
                                         (lambda: nn.LazyBatchNorm1d(), (4, 3))])
def test_a_lazy_module_moved_before_its_first_forward_materialises_on_fornax(make, shape):
    x = torch.randn(shape)
    torch.manual_seed(0)
    cpu = make()
    torch.manual_seed(0)
    dev = make().to("fornax")
    assert isinstance(dev.weight, nn.parameter.UninitializedParameter)
    torch.manual_seed(1)
    want = cpu(x)
    torch.manual_seed(1)
    got = dev(x.to("fornax"))
    assert type(dev.weight) is nn.Parameter and dev.weight.device.type == "fornax"
    assert dev.weight.shape == cpu.weight.shape
    torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_recurrent_modules_keep_parameter_identity_and_ties_across_moves(cls):
    """RNN modules hold weak references to their parameters (``_flat_weight_refs``), which
    ``swap_tensors`` refuses; the move drops and rebuilds them."""
    holder = nn.Module()
    holder.inner = cls(3, 4)
    holder.register_parameter("tied", holder.inner.weight_ih_l0)
    ids = [id(p) for _, p in holder.named_parameters(remove_duplicate=False)]
    for move in (lambda m: m.to("fornax"), lambda m: m.cpu(), lambda m: m.to(torch.float64), lambda m: m.to("fornax")):
        move(holder)
        assert [id(p) for _, p in holder.named_parameters(remove_duplicate=False)] == ids
        assert holder.tied is holder.inner.weight_ih_l0
    assert all(w is p for w, p in zip(holder.inner._flat_weights, holder.inner.parameters()))
    assert holder.inner.weight_ih_l0.device.type == "fornax" and holder.inner.weight_ih_l0.dtype == torch.float64


def test_cross_entropy_with_every_target_ignored_has_zero_gradient_not_nan():
    x = torch.randn(2, 3)
    t = torch.tensor([1, 1])
    want, = torch.autograd.grad(torch.nn.functional.cross_entropy(x.requires_grad_(), t, ignore_index=1), x)
    xd = x.detach().to("fornax").requires_grad_()
    got, = torch.autograd.grad(torch.nn.functional.cross_entropy(xd, t.to("fornax"), ignore_index=1), xd)
    assert not got.cpu().isnan().any()
    torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("shape", [(), (5,), (3, 5)])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss_is_atens_not_torch_decomps(shape, reduction):
    """PyTorch's decomposition scores target positions after the first -1 and keeps a batch
    dimension for 1-D inputs; fornax composes the kernel's semantics (values, shape, grad)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    t = torch.tensor({0: 0, 1: [3, 1, 2, 0, -1]}.get(len(shape), [[3, 1, 2, 0, -1], [4, -1, 0, 1, 2], [0, 0, 1, 2, 3]]))
    results = []
    for device in ("cpu", "fornax"):
        xx = x.detach().to(device).requires_grad_(True)
        out = torch.nn.functional.multilabel_margin_loss(xx, t.to(device), reduction=reduction)
        out.sum().backward()
        results.append((out.detach().cpu(), xx.grad.cpu()))
    (want, want_grad), (got, got_grad) = results
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)


def test_storage_resize_frees_and_refills_in_place_as_fsdp2_uses_it():
    """``UntypedStorage.resize_`` on a fornax storage: every view of the storage sees the new
    bytes (the storage object stays the same), 0 frees the device memory, growing keeps the
    old bytes; a tensor's own ``resize_`` grows the shared storage in place."""
    t = torch.arange(8, dtype=torch.float32, device="fornax")
    session = ft.current()
    view = t[2:6]
    storage = t.untyped_storage()
    in_use = session.runtime.memory_stats()["allocated_bytes"]
    storage.resize_(0)
    assert storage.nbytes() == 0 and t.untyped_storage() is storage
    assert session.runtime.memory_stats()["allocated_bytes"] < in_use
    storage.resize_(32)
    assert storage.nbytes() == 32 and view.untyped_storage() is storage
    t.copy_(torch.arange(8, dtype=torch.float32) * 10)
    assert torch.equal(view.cpu(), torch.tensor([20.0, 30, 40, 50]))
    storage.resize_(64)                                   # grows: the first 32 bytes are kept
    assert torch.equal(t.cpu(), torch.arange(8, dtype=torch.float32) * 10)
    alias = t.view(8)
    t.resize_(12)                                         # grown in place: the alias sees it
    assert alias.untyped_storage() is t.untyped_storage() and t.untyped_storage().nbytes() == 64
    with pytest.raises(ft.DeviceError, match="cannot be resized to -1"):
        storage.resize_(-1)


def test_stream_priorities_clamp_to_the_family_range():
    least, greatest = torch.fornax.Stream.priority_range()
    assert least >= 0 > greatest
    assert torch.fornax.Stream(priority=-100).priority == greatest
    assert torch.fornax.Stream(priority=0).priority == 0
