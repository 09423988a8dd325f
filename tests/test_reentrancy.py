"""The garbage collector may run in the middle of a simulator step, and what it collects may
free device memory.  Here it does, on purpose, inside every packet's work: each front end
(torch eager training, a JAX program and its gradient) on every family must still compute
what the CPU computes, and give back every byte afterwards."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from fornax.sim.timeline import Timeline
from helpers import FAMILIES

VENDORS = FAMILIES


@pytest.fixture
def collect_inside_steps(monkeypatch):
    """Install a hook: inside each packet's work, just before it records what it read and
    wrote, one object of ``pool`` is dropped into a reference cycle and a collection runs, so
    its device memory is freed re-entrantly."""
    pool: list = []
    seen = {"collections": 0}
    annotate = Timeline.annotate

    def collect():
        if pool:
            cycle = [pool.pop()]
            cycle.append(cycle)
            del cycle
            gc.collect(0)           # the young generation holds the new cycle (and is cheap)
            seen["collections"] += 1

    def annotate_after_a_collection(self, *args, **kwargs):
        collect()                   # the work is half done: its notes are open
        return annotate(self, *args, **kwargs)
    monkeypatch.setattr(Timeline, "annotate", annotate_after_a_collection)
    return pool, seen


@pytest.mark.parametrize("vendor", VENDORS)
def test_torch_training_survives_collections_inside_steps(vendor, collect_inside_steps):
    import torch

    import fornax.frameworks.torch as ft
    ft.use_stack(vendor)
    pool, seen = collect_inside_steps
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    x, y = torch.randn(32, 8), torch.randn(32, 1)

    def train(models, steps):
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
        for _ in range(steps):
            for m, opt in zip(models, opts):
                d = next(m.parameters()).device
                opt.zero_grad()
                torch.nn.functional.mse_loss(m(x.to(d)), y.to(d)).backward()
                opt.step()

    def copy_on_device():
        dev = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        dev.load_state_dict(ref.state_dict())
        return dev.to("fornax")
    train([copy_on_device()], 1)          # first compiles: their plans (and workspaces) stay cached
    gc.collect()
    torch.fornax.synchronize()
    base = torch.fornax.memory_allocated()
    dev = copy_on_device()
    pool.extend(torch.zeros(256).to("fornax") for _ in range(40))   # copies: no cached plans
    train([ref, dev], 3)
    assert seen["collections"] >= 20
    for p, q in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach())
    del dev, q, p
    pool.clear()
    gc.collect()
    torch.fornax.synchronize()
    assert torch.fornax.memory_allocated() == base


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_jax_program_survives_collections_inside_steps(vendor, collect_inside_steps):
    import jax
    import jax.numpy as jnp

    import fornax.frameworks.jax as fj
    pool, seen = collect_inside_steps
    client = fj.Client.for_vendor(vendor)
    base = client.live_buffers()

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)
    w = jax.random.normal(jax.random.key(0), (8, 4))
    x = jax.random.normal(jax.random.key(1), (16, 8))
    pool.extend(client.buffer_from_pyval(np.full((64,), i, np.float32)) for i in range(20))
    got = fj.jit(jax.value_and_grad(loss), stack=client)(w, x)
    want = jax.jit(jax.value_and_grad(loss))(w, x)
    assert seen["collections"] >= 1
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=1e-5, atol=1e-6)
    pool.clear()
    gc.collect()
    assert client.live_buffers() == base
