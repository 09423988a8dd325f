"""Real ``transformers`` models on the ``fornax`` device of every family, against the same
model (same seeded random weights, same inputs) on the CPU: :mod:`fornax.scenarios.hf_zoo`.

Eight architectures (GPT-2 with tied embeddings, GQA + RoPE Llama, BERT classifier, T5,
ViT, Mixtral, ResNet, Mamba) x three families. On every family each model runs eager
forward + backward (loss, logits and every named gradient), greedy ``generate()`` for the
generative ones (token-identical) and a 3-step AdamW loop (every loss, final parameters and
buffers). ``torch.compile(backend="fornax")`` forward + backward is the most expensive mode
(Dynamo traces each model anew), so by default each model compiles on one family, on a
deterministic rotation over the zoo's order (model ``i`` on family ``i % 3``: every family
compiles a third of the zoo, and every model compiles somewhere); ``FORNAX_ZOO_FULL=1``
compiles every model on every family. The CPU references are computed once per process and
shared by the three families.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import fornax.frameworks.torch as ft
from fornax.layers.errors import ConfigError
from fornax.scenarios.hf_zoo import ZOO, ModelResult, _compare, run_model
from helpers import FAMILIES

VENDORS = FAMILIES
FULL = os.environ.get("FORNAX_ZOO_FULL") == "1"
COMPILES = [(name, vendor) for i, name in enumerate(ZOO) for vendor in VENDORS
            if FULL or vendor == VENDORS[i % len(VENDORS)]]


def _explain(result: ModelResult) -> str:
    return json.dumps({k: m.to_json() for k, m in result.failures().items()}, indent=1)


def test_the_zoo_covers_the_required_architectures():
    assert len(ZOO) >= 8
    kinds = " ".join(m.architecture for m in ZOO.values()).lower()
    for kind in ("tied embeddings", "gqa", "rope", "encoder classifier", "encoder-decoder",
                 "vision transformer", "mixture of experts", "convolutional", "state-space"):
        assert kind in kinds, kind
    assert {n for n, m in ZOO.items() if m.generative} == {"gpt2", "llama", "t5", "mixtral", "mamba"}
    a, b = ZOO["gpt2"].build(), ZOO["gpt2"].build()       # seeded: two builds are identical
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert a.lm_head.weight is a.transformer.wte.weight


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("name", list(ZOO))
def test_eager_generate_and_training_match_cpu(name, vendor):
    result = run_model(name, vendor, ("eager", "generate", "train"))
    expected = {"eager", "train"} | ({"generate"} if ZOO[name].generative else set())
    assert set(result.modes) == expected
    assert result.ok, _explain(result)
    for mode in result.modes.values():
        assert mode.max_error is not None and mode.max_error < 1e-2
    if "generate" in result.modes:
        assert result.modes["generate"].max_error == 0.0


@pytest.mark.parametrize("name,vendor", COMPILES)
def test_compiled_forward_backward_matches_cpu(name, vendor):
    result = run_model(name, vendor, ("compile",))
    assert result.ok, _explain(result)
    # every FX node was lowered into fornax graphs: nothing ran with PyTorch on the CPU
    assert result.modes["compile"].fallbacks == [], result.modes["compile"].fallbacks


def test_to_fornax_keeps_tied_parameters():
    ft.use_stack("cuda-like")
    cpu = ZOO["gpt2"].build()
    n = len(list(cpu.parameters()))
    model = cpu.to("fornax")
    assert model.lm_head.weight is model.transformer.wte.weight
    assert len(list(model.parameters())) == n
    assert model.lm_head.weight.device.type == "fornax"


def test_a_difference_names_the_tensor_furthest_outside_its_tolerance():
    ref = {"loss": torch.tensor(2.0), "grad:a": torch.ones(3), "grad:b": torch.full((3,), 100.0)}
    got = {"loss": torch.tensor(2.0), "grad:a": torch.tensor([1.0, 1.0, 1.001]),
           "grad:b": torch.tensor([100.0, 100.0, 100.005])}
    res = _compare(got, ref)
    # b's absolute error is larger, but a is further outside its (normwise) allowance
    assert not res.ok and res.worst_tensor == "grad:a" and "grad:a differs" in res.error
    assert res.max_error == pytest.approx(0.005, rel=1e-3)
    assert _compare({**ref}, ref).ok
    res = _compare({k: v for k, v in ref.items() if k != "grad:b"}, ref)
    assert not res.ok and "missing on fornax ['grad:b']" in res.error
    res = _compare({**ref, "tokens": torch.tensor([1, 2])}, {**ref, "tokens": torch.tensor([1, 3])})
    assert not res.ok and res.worst_tensor == "tokens"
    out = ModelResult("m", "cuda-like", {"eager": res}).to_json()
    assert out["model"] == "m" and out["vendor"] == "cuda-like" and not out["ok"]
    assert set(out["modes"]["eager"]) >= {"ok", "max_error", "worst_tensor", "error"}
    assert out["modes"]["eager"]["worst_tensor"] == "tokens"


def test_bad_names_are_refused_with_the_choices():
    with pytest.raises(ConfigError, match="unknown zoo model 'gpt5'.*gpt2, llama"):
        run_model("gpt5", "cuda-like")
    with pytest.raises(ConfigError, match=r"unknown zoo mode\(s\) \['fast'\]; modes are eager"):
        run_model("gpt2", "cuda-like", ("eager", "fast"))


def test_compiled_reduction_over_a_concatenation():
    """A fused reduction kernel whose rows load through a concatenation's masks (a ViT's
    [CLS] token joined to the patches, then normalised) builds and matches the CPU."""
    ft.use_stack("rocm-like")

    def f(a, b, w):
        x = torch.cat([a, b], 1) + w
        return x.softmax(1), torch.nn.functional.layer_norm(x, (x.shape[-1],))

    torch.manual_seed(0)
    args = (torch.randn(2, 1, 6), torch.randn(2, 4, 6), torch.randn(1, 5, 6))
    torch._dynamo.reset()
    got = torch.compile(f, backend="fornax")(*(x.to("fornax") for x in args))
    torch._dynamo.reset()
    for g, w in zip(got, f(*args)):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-6)


# ---- what the zoo needed of the torch.compile path --------------------------------------------
def _compiled(fn, *args):
    """``fn`` compiled for fornax on fornax copies of ``args``: its CPU results and the graph
    fallbacks recorded meanwhile."""
    before = ft.report()["fallbacks"]
    torch._dynamo.reset()
    try:
        out = torch.compile(fn, backend="fornax", dynamic=False)(*(a.to("fornax") for a in args))
    finally:
        torch._dynamo.reset()
    new = [r for r in ft.report()["fallbacks"] if r not in before]
    return tuple(o.cpu() for o in (out if isinstance(out, tuple) else (out,))), new


def test_compiled_integer_histc_counts_on_the_device():
    """Mixtral's router counts experts with ``histc`` of int32 ids off the CPU; the graph
    lowers it (CUDA's integer semantics, as the eager device computes them)."""
    from fornax.frameworks.torch import histogram

    ft.use_stack("xpu-like")
    x = torch.tensor([[0, 1, 1, 3], [2, 7, -1, 3]], dtype=torch.int32)
    for bins, lo, hi, want in ((4, 0, 3, [1, 2, 1, 2]), (3, 0, 0, [4, 3, 1]), (2, 5, 9, [0, 1])):
        (got,), fallbacks = _compiled(lambda t: torch.histc(t, bins=bins, min=lo, max=hi) + 0, x)
        assert got.dtype == torch.int32 and got.tolist() == want, (bins, lo, hi, got)
        assert got.tolist() == histogram.histc(x, bins, lo, hi).tolist()
        assert not [f for f in fallbacks if "histc" in f["op"]], fallbacks
    xf = torch.tensor([0.5, 1.5, 2.5, 2.5])             # floats keep PyTorch's own kernel
    (got,), _ = _compiled(lambda t: torch.histc(t, bins=3, min=0, max=3), xf)
    assert got.tolist() == torch.histc(xf, bins=3, min=0, max=3).tolist()


def test_compiled_empty_cat_pieces_and_uninitialised_buffers_stay_in_the_graph():
    ft.use_stack("cuda-like")

    def f(x, past):
        y = torch.cat([past, x, past], dim=1) * 2          # an empty past, as a KV cache starts
        buf = torch.empty_like(y).fill_(1.0) + torch.empty(3, 4, device=x.device).zero_()
        return y, buf

    x, past = torch.randn(3, 4), torch.randn(3, 0)
    got, fallbacks = _compiled(f, x, past)
    assert fallbacks == []
    for g, w in zip(got, f(x, past)):
        torch.testing.assert_close(g, w)


def test_a_librarys_custom_operator_runs_on_the_device_not_the_cpu():
    """A ``torch.library.custom_op`` with a data-dependent Python body (like transformers'
    grouped matmul fallback) is not lowered; it runs eagerly where its operands are."""
    @torch.library.custom_op("fornax_zoo_test::segment_scale", mutates_args=())
    def segment_scale(x: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        out, start = torch.zeros_like(x), 0
        for i, end in enumerate(ends.tolist()):
            out[start:end] = x[start:end] * (i + 1)
            start = end
        return out

    @segment_scale.register_fake
    def _(x, ends):
        return torch.empty_like(x)

    ft.use_stack("rocm-like")
    x, ends = torch.randn(5, 3), torch.tensor([2, 5])
    (got,), fallbacks = _compiled(lambda a, e: segment_scale(a + 1, e) * 2, x, ends)
    assert fallbacks == []
    torch.testing.assert_close(got, segment_scale(x + 1, ends) * 2)
    rows = [r for r in ft.report()["ops"] if "segment_scale" in r["op"]]
    assert rows and all(r["route"] == "decomposed" for r in rows), rows
