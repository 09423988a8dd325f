"""A zoo of torch.nn models, forward and backward on the ``fornax`` device of every
family, eager and through ``torch.compile(backend="fornax")``, against the same model on
CPU (PyTorch eager is the reference)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fornax.frameworks.torch as ft
from helpers import FAMILIES

VENDORS = FAMILIES


class TinyGPT(nn.Module):
    def __init__(self, vocab=32, d=16, heads=2, seq=8):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.ln1, self.ln2, self.lnf = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))
        self.head = nn.Linear(d, vocab, bias=False)
        self.heads = heads

    def forward(self, idx):
        b, t = idx.shape
        x = self.tok(idx) + self.pos[:t]
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        split = lambda z: z.view(b, t, self.heads, -1).transpose(1, 2)  # noqa: E731
        a = nn.functional.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        x = x + self.mlp(self.ln2(x))
        return self.head(self.lnf(x))


class RNNHead(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(6, 8, batch_first=True)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.out(y[:, -1])


def _models():
    return {
        "mlp": (lambda: nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5)),
                lambda: torch.randn(4, 10)),
        "cnn-batchnorm": (lambda: nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(4 * 4 * 4, 3)), lambda: torch.randn(2, 3, 8, 8)),
        "gru": (lambda: RNNHead(nn.GRU), lambda: torch.randn(2, 5, 6)),
        "lstm": (lambda: RNNHead(nn.LSTM), lambda: torch.randn(2, 5, 6)),
        "transformer-encoder": (lambda: nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0,
                                                                   batch_first=True),
                                lambda: torch.randn(2, 6, 16)),
        "tiny-gpt": (TinyGPT, lambda: torch.randint(0, 32, (2, 8))),
    }


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("name", list(_models()))
def test_zoo_forward_backward_matches_cpu(vendor, name, mode):
    make, data = _models()[name]
    torch.manual_seed(0)
    cpu_model = make()
    x = data()
    ft.use_stack(vendor)
    dev_model = copy.deepcopy(cpu_model).to("fornax")
    cpu_out = cpu_model(x)
    if mode == "compiled":
        torch._dynamo.reset()
        run = torch.compile(dev_model, backend="fornax")
        dev_out = run(x.to("fornax"))
        # Dynamo does not trace nn.GRU / nn.LSTM (a graph break): they run eagerly on the device
        if name not in ("gru", "lstm"):
            assert any(r["op"].startswith("graph run:") and r["route"] == "native"
                       for r in ft.report()["ops"]), "no compiled fornax graph ran"
    else:
        dev_out = dev_model(x.to("fornax"))
    torch.testing.assert_close(dev_out.cpu(), cpu_out, rtol=1e-4, atol=1e-5)
    cpu_out.square().mean().backward()
    dev_out.square().mean().backward()
    for (pname, p), q in zip(cpu_model.named_parameters(), dev_model.parameters()):
        assert q.grad is not None and q.grad.device.type == "fornax", pname
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5, msg=pname)
    # BatchNorm's running statistics are updated in place on the device
    for b_cpu, b_dev in zip(cpu_model.buffers(), dev_model.buffers()):
        torch.testing.assert_close(b_dev.cpu(), b_cpu, rtol=1e-5, atol=1e-6)
    report = ft.report()
    assert report["totals"].get("native", 0) > 0
