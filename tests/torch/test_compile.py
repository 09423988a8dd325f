"""The PyTorch graph path: ``torch.compile(backend="fornax")`` and ``export``, checked against
PyTorch CPU eager (values and every gradient), on CPU tensors and on ``fornax`` tensors."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import fornax.frameworks.torch as ft
from fornax.frameworks.torch import graph as G
from fornax.frameworks.torch.exported import export
from fornax.frameworks.torch import session as S
from fornax.layers.errors import CompileError, InvalidArgumentError
from fornax.layers.graph import Graph

G.register_backend()


@pytest.fixture(autouse=True)
def _fresh():
    """Each test gets Dynamo's caches cleared and leaves the active stack as it found it."""
    saved = S._current
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    if saved is not None:
        S._activate(saved)


def close(a, b, rtol=1e-4, atol=1e-5):
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=rtol, atol=atol)


def rows(kind=None, prefix="graph"):
    return [r for r in ft.report()["ops"] if r["op"].startswith(prefix) and (kind is None or r["route"] == kind)]


def mlp(d_in=16, hidden=32, d_out=4):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.Tanh(), torch.nn.Linear(hidden, d_out))


def train_step(model, x, device, target=None):
    """(loss, {name: grad}) of one forward+backward of ``model`` (a copy) compiled on ``device``
    (None: plain CPU eager, the reference)."""
    model = copy.deepcopy(model)
    run = model
    if device is not None:
        model.to(device)
        run = torch.compile(model, backend="fornax", dynamic=False)
        x = x.to(device)
    out = run(x)
    loss = (out ** 2).mean() if target is None else F.cross_entropy(out, target.to(out.device))
    loss.backward()
    return out, loss, {n: p.grad for n, p in model.named_parameters()}


def check_step(model, x, device, target=None, rtol=1e-4, atol=1e-5):
    out_r, loss_r, grads_r = train_step(model, x, None, target)
    out, loss, grads = train_step(model, x, device, target)
    assert out.device.type == torch.device(device).type
    close(out, out_r, rtol, atol)
    close(loss, loss_r, rtol, atol)
    assert grads.keys() == grads_r.keys()
    for name in grads_r:
        assert grads[name] is not None, name
        assert grads[name].device.type == torch.device(device).type, name
        close(grads[name], grads_r[name], rtol, atol)


# ---- torch.compile ------------------------------------------------------------------------------------------
def test_registration_is_idempotent():
    G.register_backend()
    G.register_backend()
    assert "fornax" in torch._dynamo.list_backends(exclude_tags=())
    assert torch._dynamo.lookup_backend("fornax") is G.fornax_backend


def test_compiled_mlp_on_cpu_tensors_runs_through_the_framework_seam():
    ft.use_stack("cuda-like")
    torch.manual_seed(1)
    x, target = torch.randn(8, 16), torch.randint(0, 4, (8,))
    check_step(mlp(), x, "cpu", target)
    runs = {r["op"].split(":")[1][:7]: r for r in rows("native", "graph run:")}
    assert {"forward", "backwar"} <= set(runs)                    # both graphs ran on the stack
    lowered = {r["op"] for r in rows("native", "graph:")}
    assert {"graph:aten::addmm.default", "graph:aten::mm.default", "graph:aten::gelu.default"} <= lowered
    assert rows("fallback") == []
    assert ft.stack().framework.counts["graphs_run"] >= 2         # framework.run, not torch


@pytest.mark.parametrize("vendor, shape", [("cuda-like", (16, 32, 4)), ("rocm-like", (8, 8, 3)),
                                           ("xpu-like", (8, 8, 3))])
def test_compiled_mlp_on_fornax_tensors(vendor, shape):
    ft.use_stack(vendor)                                           # tensors are made after the switch
    torch.manual_seed(2)
    x = torch.randn(4, shape[0])
    resident = ft.stack().framework.counts.get("resident_plans", 0)
    check_step(mlp(*shape), x, "fornax")
    assert ft.report()["stack"].startswith(vendor)
    runs = rows("native", "graph run:")
    assert {r["op"].split(":")[1][:7] for r in runs} >= {"forward", "backwar"}
    assert rows("fallback") == []
    assert ft.stack().framework.counts["resident_plans"] > resident


@pytest.mark.parametrize("device, mode", [("cpu", "train"), ("fornax", "train"), ("fornax", "eval")])
def test_transformer_encoder_layer_forward_backward(device, mode):
    ft.use_stack("cuda-like")
    torch.manual_seed(3)
    layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0,
                                             batch_first=True)
    getattr(layer, mode)()
    x = torch.randn(2, 5, 16)
    check_step(layer, x, device, atol=1e-4)
    assert rows("fallback") == []


def test_compiled_outputs_keep_strides_and_never_alias_inputs():
    ft.use_stack("cuda-like")
    w = torch.randn(5, 3)

    def f(x):
        y = x @ w
        return x.clone(), y.t(), y.argmax(-1)

    for device in ("cpu", "fornax"):
        torch._dynamo.reset()
        x = torch.randn(4, 5)
        w = w.to(device)
        xd = x.to(device)
        a, b, c = torch.compile(f, backend="fornax", dynamic=False)(xd)
        ra, rb, rc = f(x.to("cpu")) if device == "cpu" else (x, (x @ w.cpu()).t(), (x @ w.cpu()).argmax(-1))
        close(a, ra)
        close(b, rb)
        assert torch.equal(c.cpu(), rc)
        assert b.shape == (3, 4) and b.stride() == (1, 3)          # torch's layout of y.t()
        a.add_(1)                                                  # a copy: the input is untouched
        close(xd, x)


class _SplitHeads(torch.nn.Module):
    """Attention whose q, k and v are strided views of one projection, as most transformer
    code writes it: AOTAutograd saves those views for the backward."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        return self.out((att @ v).transpose(1, 2).reshape(b, s, d))


@pytest.mark.parametrize("vendor", ["cuda-like", "xpu-like"])
def test_saved_activations_keep_the_programs_layout(vendor):
    """The forward returns the activations it saves for the backward contiguous (as Inductor
    does) and says so to AOTAutograd: no strided copy into eager's layout after the forward,
    no gather back before the backward, and every gradient still matches PyTorch CPU."""
    ft.use_stack(vendor)
    session = S.current()
    torch.manual_seed(1)
    model = _SplitHeads()
    x = torch.randn(2, 6, 16)
    before = set(session.plans)
    check_step(model, x, "fornax", atol=1e-4)
    # the loss's backward broadcasts a scalar (a stride-0 gather, eager); nothing else moves
    layout = [k for k in set(session.plans) - before if isinstance(k, tuple) and k[0] in ("copy", "gather")
              and any(k[2])]
    assert layout == []
    assert rows("fallback") == []


def test_a_saved_activation_that_is_also_a_user_output_keeps_eagers_strides():
    """``y`` is returned (a transposed view: eager's strides) and saved for ``sin``'s backward:
    the user's ``y`` keeps its strides, the saved one may be contiguous, gradients match."""
    ft.use_stack("cuda-like")
    torch.manual_seed(4)
    w = torch.randn(5, 3)

    def f(x, w):
        y = (x @ w).t()
        return y, y.sin()

    x = torch.randn(4, 5, requires_grad=True)
    ry, rs = f(x, w)
    (ry.sum() + rs.square().sum()).backward()
    ref_grad = x.grad.clone()
    xd = x.detach().to("fornax").requires_grad_()
    y, s = torch.compile(f, backend="fornax", dynamic=False)(xd, w.to("fornax"))
    assert y.stride() == ry.stride() == (1, 3)
    (y.sum() + s.square().sum()).backward()
    close(y, ry)
    close(s, rs)
    close(xd.grad, ref_grad)


def test_outputs_land_on_the_device_torch_says():
    ft.use_stack("cuda-like")

    def f(x):
        return (x * 2).cpu(), x + 1, torch.ones(3, device="fornax") * x.sum().to("fornax")

    x = torch.randn(4, 5)
    a, b, c = torch.compile(f, backend="fornax", dynamic=False)(x.to("fornax"))
    assert (a.device.type, b.device.type, c.device.type) == ("cpu", "fornax", "fornax")
    close(a, x * 2)
    close(b, x + 1)
    close(c, torch.ones(3) * x.sum())


def test_rnn_graph_break_runs_the_device_kernels_eagerly():
    """Dynamo leaves nn.GRU to eager; the device's Python kernels it then calls must run,
    not be traced by Dynamo (fornax's machinery is on its skip list)."""
    ft.use_stack("cuda-like")
    torch.manual_seed(8)

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.GRU(6, 8, batch_first=True)
            self.out = torch.nn.Linear(8, 3)

        def forward(self, x):
            return self.out(self.rnn(x)[0][:, -1])

    check_step(Head(), torch.randn(2, 5, 6), "fornax")


# ---- unsupported nodes split the graph ---------------------------------------------------------------------
class Quantised(torch.nn.Module):
    """A uint8 round trip in the middle: uint8 has no fornax graph dtype, so those nodes run with torch."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x):
        y = self.lin(x)
        q = (y.clamp(-1, 1) * 127 + 128).to(torch.uint8)
        return torch.tanh(y) + q.float() / 255


@pytest.mark.parametrize("device", ["cpu", "fornax"])
def test_node_without_lowering_runs_with_torch_and_is_reported(device):
    ft.use_stack("cuda-like")
    check_step(Quantised(), torch.randn(4, 6), device)
    fb = rows("fallback", "graph:")
    assert [r["op"] for r in fb] == ["graph:aten::_to_copy.default"]
    assert "uint8 has no fornax dtype" in fb[0]["reason"] and "runs with PyTorch on the CPU" in fb[0]["reason"]
    # the lowered pieces around it still ran on the stack
    assert len(rows("native", "graph run:")) >= 3


def test_export_of_a_split_program_shows_its_pieces():
    ft.use_stack("cuda-like")
    m = Quantised().eval()
    x = torch.randn(3, 6)
    e = export(m, (x,))
    close(e(x), m(x))
    assert e.graph is None                                         # split: see .graphs
    assert len(e.graphs) == 2 and all(isinstance(g, Graph) for g in e.graphs)
    assert [f["op"] for f in e.program.fallbacks] == ["aten::_to_copy.default"] * 2
    assert "runs with PyTorch on the CPU" in str(e)


def test_graph_op_the_family_cannot_run_takes_the_host_route(monkeypatch):
    """A family whose coverage lacks tanh: the device graph falls back (counted, with the
    reason) and framework.run runs tanh on the host."""
    ft.use_stack("cuda-like")
    fw = ft.stack().framework
    monkeypatch.setattr(fw, "native", fw.native - {"tanh"})
    check_step(mlp(8, 8, 2), torch.randn(4, 8), "fornax")
    runs = rows("fallback", "graph run:")
    assert runs and all("tanh" in r["reason"] and "host route" in r["reason"] for r in runs)
    ops = rows("fallback", "graph op:")
    assert [r["op"] for r in ops] == ["graph op:tanh"] and "runs on the CPU" in ops[0]["reason"]


@pytest.mark.parametrize("device", ["cpu", "fornax"])
def test_graph_the_compiler_refuses_runs_with_torch(monkeypatch, device):
    ft.use_stack("cuda-like")
    fw = ft.stack().framework
    compile_ = fw.compiler.compile

    def refuse(graph, *args, **kwargs):             # the compiled graphs only; eager ops still compile
        if graph.name.startswith(("forward", "backward")):
            raise CompileError(f"no kernel for {graph.name} today", seam="compiler", vendor="cuda-like")
        return compile_(graph, *args, **kwargs)

    monkeypatch.setattr(fw.compiler, "compile", refuse)
    check_step(mlp(8, 8, 2), torch.randn(4, 8), device)
    runs = rows("fallback", "graph run:")
    assert runs and all("no kernel for" in r["reason"] and "run with PyTorch" in r["reason"] for r in runs)


def test_symbolic_shapes_run_eagerly_with_a_reason():
    ft.use_stack("cuda-like")
    m = mlp(4, 8, 3)
    cm = torch.compile(m, backend="fornax", dynamic=True)
    x = torch.randn(5, 4)
    close(cm(x), m(x))
    fb = rows("fallback", "graph run:")
    assert fb and "symbolic shapes" in fb[0]["reason"] and "dynamic=False" in fb[0]["reason"]


# ---- the SDPA trap --------------------------------------------------------------------------------------------
def _sdpa_grads(fn, q, k, v, compile_with=None):
    qs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    run = torch.compile(fn, backend=compile_with, dynamic=False) if compile_with is not None else fn
    out = run(*qs)
    (out * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum().backward()
    return out, [t.grad for t in qs]


@pytest.mark.parametrize("device", ["cpu", "fornax"])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_gradients_match_eager(causal, device):
    ft.use_stack("cuda-like")
    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    ref, gref = _sdpa_grads(fn, q, k, v)
    out, grads = _sdpa_grads(fn, *(t.to(device) for t in (q, k, v)), compile_with="fornax")
    close(out, ref)
    for g, r in zip(grads, gref):
        assert g.device.type == device
        close(g, r)
    assert rows("fallback") == []


def test_the_core_aten_sdpa_decomposition_is_wrong_and_ours_is_not():
    """PyTorch's core table decomposes the CPU flash forward but autograd keeps its fused
    backward, which then reads the wrong tensor; fornax's table keeps the pair whole."""
    from functorch.compile import make_boxed_func
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd

    def nop(gm, _):
        return make_boxed_func(gm.forward)

    torch.manual_seed(6)
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    _, gref = _sdpa_grads(fn, q, k, v)
    naive = aot_autograd(fw_compiler=nop, decompositions=core_aten_decompositions())
    _, bad = _sdpa_grads(fn, q, k, v, compile_with=naive)
    assert max((b - r).abs().max().item() for b, r in zip(bad, gref)) > 0.1
    torch._dynamo.reset()
    fixed = aot_autograd(fw_compiler=nop, decompositions=G.decompositions())
    _, good = _sdpa_grads(fn, q, k, v, compile_with=fixed)
    for g, r in zip(good, gref):
        close(g, r)


# ---- torch.export -------------------------------------------------------------------------------------------------
def test_export_mlp():
    ft.use_stack("cuda-like")
    m = mlp(8, 16, 3)
    x = torch.randn(5, 8)
    e = export(m, (x,))
    close(e(x), m(x))
    g = e.graph
    assert isinstance(g, Graph)
    assert sum(n.op == "matmul" for n in g.nodes) == 3
    names = {v.name for v in g.inputs}
    assert {"p_0_weight", "p_4_bias", "input"} <= names          # parameters are lifted inputs
    assert "matmul" in str(e)
    xd = x.to("fornax")                                           # parameters follow to the device
    out = e(xd)
    assert out.device.type == "fornax"
    close(out, m(x))
    with pytest.raises(InvalidArgumentError, match="argument structure"):
        e(x, x)
    with pytest.raises(InvalidArgumentError, match=r"input 'input' must be float32\[5, 8\], got float64\[5, 8\]"):
        e(x.double())
    with pytest.raises(InvalidArgumentError, match="static shapes"):
        e(torch.randn(6, 8))


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.c1 = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.c2 = torch.nn.Conv2d(4, 6, 3, stride=2)
        self.fc = torch.nn.Linear(6, 5)

    def forward(self, x):
        y = F.max_pool2d(torch.relu(self.bn(self.c1(x))), 2)
        return self.fc(torch.relu(self.c2(y)).mean(dim=(2, 3)))


def test_export_cnn():
    ft.use_stack("cuda-like")
    m = CNN()
    with torch.no_grad():                                          # non-trivial running statistics
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    m.eval()
    x = torch.randn(2, 3, 10, 10)
    e = export(m, (x,))
    close(e(x), m(x))
    assert e.program.fallbacks == []
    assert sum(n.op == "convolution" for n in e.graph.nodes) == 2
    close(e(x.to("fornax")), m(x))
