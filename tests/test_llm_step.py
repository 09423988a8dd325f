"""The Llama-like training step: numerics of forward and backward (data mode, tiny model),
and the tensor-parallel step in shape-only mode (all-reduces, FLOPs, timeline)."""

import math

import numpy as np
import pytest
from click.testing import CliRunner

from fornax.cli.main import main as cli
from fornax.layers.errors import ConfigError, FornaxError
from fornax.layers.graph import DType
from fornax.scenarios.llm import (LlamaConfig, TopologyAllReduce, build_step, make_feeds,
                                  simulate_step)
from fornax.stack import compose, make_config
from helpers import FAMILIES

VENDORS = list(FAMILIES)
TINY = dict(layers=2, d_model=64, heads=4, kv_heads=2, ffn=128, vocab=50, seq=8, tp=1)


def numpy_loss(cfg, feeds):
    """The same model written independently in float64 numpy (unsharded): the mean loss."""
    f = {k: np.asarray(v, dtype=np.float64) for k, v in feeds.items()}
    T, S, B = cfg.batch * cfg.seq, cfg.seq, cfg.batch
    H, K, hd = cfg.heads, cfg.kv_heads, cfg.d_model // cfg.heads

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.eps) * w

    x = f["tokens"] @ f["embed"]
    causal = np.tril(np.ones((S, S), bool))
    for i in range(cfg.layers):
        p = f"l{i}."
        n = norm(x, f[p + "attn_norm"])
        q = (n @ f[p + "wq"]).reshape(B, S, H, hd).transpose(0, 2, 1, 3)
        k = np.repeat((n @ f[p + "wk"]).reshape(B, S, K, hd).transpose(0, 2, 1, 3), H // K, axis=1)
        v = np.repeat((n @ f[p + "wv"]).reshape(B, S, K, hd).transpose(0, 2, 1, 3), H // K, axis=1)
        s = np.where(causal, q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd), -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        o = (s / s.sum(-1, keepdims=True) @ v).transpose(0, 2, 1, 3).reshape(T, H * hd)
        x = x + o @ f[p + "wo"]
        n = norm(x, f[p + "mlp_norm"])
        h1 = n @ f[p + "w1"]
        x = x + (h1 / (1 + np.exp(-h1)) * (n @ f[p + "w3"])) @ f[p + "w2"]
    logits = norm(x, f["final_norm"]) @ f["head"]
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -(f["labels"] * logp).sum() / T


def _run(vendor, cfg, seed=0):
    graph = build_step(cfg)
    feeds = make_feeds(cfg, seed)
    res = compose(make_config(vendor)).run(graph, feeds)
    return graph, feeds, dict(zip((v.name for v in graph.outputs), res.outputs))


@pytest.mark.parametrize("vendor", VENDORS)
def test_tiny_step_loss_and_gradients_match_numpy(vendor):
    cfg = LlamaConfig(**TINY, batch=2 if vendor == "xpu-like" else 1, dtype=DType.FLOAT32)
    _, feeds, out = _run(vendor, cfg)
    f64 = {k: v.astype(np.float64) for k, v in feeds.items()}
    ref = numpy_loss(cfg, f64)
    assert out["loss"].shape == (1, 1)
    assert out["loss"][0, 0] == pytest.approx(ref, rel=1e-5)
    # every weight's gradient, at three entries, against central differences of the numpy loss
    rng = np.random.default_rng(7)
    used_tokens = np.flatnonzero(feeds["tokens"].any(axis=0))
    eps = 1e-5
    for name in cfg.weight_shapes():
        grad = out[f"d.{name}"]
        assert grad.shape == feeds[name].shape
        for _ in range(3):
            idx = tuple(int(rng.integers(0, s)) for s in grad.shape)
            if name == "embed":                        # rows of unused tokens have zero gradient
                idx = (int(rng.choice(used_tokens)), idx[1])
            up, down = dict(f64), dict(f64)
            up[name], down[name] = f64[name].copy(), f64[name].copy()
            up[name][idx] += eps
            down[name][idx] -= eps
            fd = (numpy_loss(cfg, up) - numpy_loss(cfg, down)) / (2 * eps)
            assert grad[idx] == pytest.approx(fd, rel=2e-3, abs=2e-6), (name, idx)
    unused = np.setdiff1d(np.arange(cfg.vocab), used_tokens)
    np.testing.assert_array_equal(out["d.embed"][unused], 0.0)


def test_tiny_step_in_bfloat16_stays_close_to_the_float64_model():
    cfg = LlamaConfig(**TINY)                          # bfloat16 weights and activations
    _, feeds, out = _run("cuda-like", cfg)
    ref = numpy_loss(cfg, {k: v.astype(np.float64) for k, v in feeds.items()})
    assert out["loss"][0, 0] == pytest.approx(ref, rel=2e-2)
    assert out["d.l0.wq"].dtype == DType.BFLOAT16.numpy


SMALL_TP = LlamaConfig(layers=2, d_model=256, heads=16, kv_heads=8, ffn=512, vocab=128, seq=64, tp=8)


def _hand_matmul_flops(c: LlamaConfig) -> float:
    """Per rank: forward GEMMs of one layer, times 3 for forward + both backward GEMMs."""
    T, D, V, hd = c.batch * c.seq, c.d_model, c.vocab, c.d_model // c.heads
    H, K, F = c.heads // c.tp, c.kv_heads // c.tp, c.ffn // c.tp
    layer = (2 * T * D * H * hd + 2 * 2 * T * D * K * hd      # q, k, v projections
             + 2 * 2 * c.batch * H * c.seq * c.seq * hd        # scores and probabilities @ V
             + 2 * T * H * hd * D                              # output projection
             + 3 * 2 * T * D * F)                              # W1, W3, W2
    embed = 2 * T * V * D * 2                                  # one-hot @ E, and onehot^T @ dX
    head = 2 * T * D * V * 3
    return c.layers * 3 * layer + embed + head


@pytest.mark.parametrize("vendor", VENDORS)
def test_tensor_parallel_step_in_shape_only_mode(vendor):
    cfg = SMALL_TP
    graph = build_step(cfg)
    graph.verify()
    assert sum(n.op == "all_reduce" and n.attrs["ranks"] == 8 for n in graph.nodes) == 4 * cfg.layers
    rep, stack, _ = simulate_step(vendor, devices=8, cfg=cfg)
    assert rep.all_reduces == 4 * cfg.layers
    nbytes = cfg.batch * cfg.seq * cfg.d_model * 2                        # bf16 activations
    assert rep.all_reduce_bytes == 4 * cfg.layers * nbytes
    assert rep.communication_s == pytest.approx(
        4 * cfg.layers * stack.topology.allreduce_time(nbytes, "ring"), rel=1e-12)
    assert rep.matmul_flops == pytest.approx(8 * _hand_matmul_flops(cfg), rel=1e-12)
    # every all-reduce sits between its producer and its consumer on device 0's timeline
    recs = sorted((r for r in stack.devices[0].timeline.records if r.kind in ("kernel", "collective")),
                  key=lambda r: r.start)
    colls = [i for i, r in enumerate(recs) if r.kind == "collective"]
    assert len(colls) == 4 * cfg.layers
    for i in colls:
        assert recs[i].engine == "peer"
        assert recs[i].start >= recs[i - 1].end and recs[i + 1].start >= recs[i].end
    # nothing overlaps the all-reduces here, so the step is compute plus communication
    assert rep.step_time_s == pytest.approx(rep.compute_s + rep.communication_s, rel=1e-9)
    assert rep.model_flops == 6 * cfg.params() * cfg.seq
    assert 0 < rep.peak_hbm_bytes <= rep.hbm_bytes and rep.fits
    assert stack.devices[0].races == []


def test_params_of_the_70b_configuration():
    # Llama 2 70B: 80 x (attention 8192x8192 x2 + 8192x1024 x2, MLP 3 x 8192x28672, 2 norms)
    # plus embedding and head (32000 x 8192 each) and the final norm
    per_layer = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    assert LlamaConfig().params() == 80 * per_layer + 2 * 32000 * 8192 + 8192 == 68_976_648_192


def test_step_refuses_data_mode_and_bad_shapes():
    with pytest.raises(ConfigError, match="shape-only"):
        simulate_step(stack=compose(make_config("cuda-like", devices=8)))
    with pytest.raises(ConfigError, match="multiple of tp"):
        LlamaConfig(tp=3)
    # a multi-rank all-reduce on a data-mode stack cannot sum data it does not hold
    cfg = LlamaConfig(**{**TINY, "tp": 2}, dtype=DType.FLOAT32)
    stack = compose(make_config("cuda-like", devices=2))
    with pytest.raises(FornaxError, match="shape-only"):
        stack.framework.run(build_step(cfg), make_feeds(cfg), collective=TopologyAllReduce(stack))


def test_cli_refuses_the_step_without_meta():
    res = CliRunner().invoke(cli, ["compose", "--vendor", "cuda-like", "--devices", "8",
                                   "--workload", "llama70b-step"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "shape-only" in lines[0]
