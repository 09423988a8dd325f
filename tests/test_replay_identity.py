"""Replay on and off give the same run: kernels launched again replay their recorded tape
(fornax.sim.replay) or a fast path (fornax.sim.fastpath), and that must change host time
only.  The same workloads run on stacks composed with ``replay`` on and off; outputs,
reports (minus the host clocks and the execution counts, which say how the host ran the
launches) and Perfetto traces must be identical, on every family."""

from __future__ import annotations

import copy
import json
import re

import numpy as np
import pytest
import torch

import fornax.frameworks.torch as ft
from fornax import report
from fornax.frameworks.torch.session import current
from fornax.scenarios.torch_workloads import Block
from fornax.scenarios.workloads import transformer_block
from fornax.sim.trace import chrome_trace
from fornax.stack import compose, load_config, make_config
from helpers import FAMILIES

RUNS = 3          # a kernel's first launch runs plainly, the second records, the third replays
#                   (and a resident plan's: the first warms up, the second is captured)
HOST_CLOCKS = ("host_wall_s", "compile_wall_s")


def _comparable(rep: dict) -> dict:
    rep = copy.deepcopy(rep)
    ex = rep["costs"].pop("execution")
    for key in HOST_CLOCKS:
        rep["costs"].pop(key)
    rep["seams"]["compiler"].pop("compile_wall_s", None)
    return rep, ex


def _graph_run(family: str, replay: bool):
    stack = compose(make_config(family, replay=replay))
    graph, feeds = transformer_block(0)
    outs = [stack.run(graph, feeds).outputs for _ in range(RUNS)]
    rep = report.build(stack, "transformer-block")
    return outs, rep, chrome_trace(stack.devices)


@pytest.mark.parametrize("family", FAMILIES)
def test_graph_runs_are_identical_with_replay_on_and_off(family):
    on_outs, on_rep, on_trace = _graph_run(family, True)
    off_outs, off_rep, off_trace = _graph_run(family, False)
    for a, b in zip(on_outs, off_outs):
        for x, y in zip(a, b):
            assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
    on_cmp, on_ex = _comparable(on_rep)
    off_cmp, off_ex = _comparable(off_rep)
    assert on_cmp == off_cmp
    assert json.dumps(on_trace, sort_keys=True) == json.dumps(off_trace, sort_keys=True)
    assert off_ex == {"replay": False, "interpreted": off_ex["interpreted"], "recorded": 0,
                      "replayed": 0, "fast_path": 0, "plans_captured": 0, "plan_runs_replayed": 0}
    assert on_ex["replay"] and on_ex["replayed"] > 0 and 0 <= on_ex["fast_path"] <= on_ex["replayed"]
    total = on_ex["interpreted"] + on_ex["recorded"] + on_ex["replayed"]
    assert total == off_ex["interpreted"] == on_rep["costs"]["kernels"]


def _compiled_steps(family: str, replay: bool):
    ft.use_stack(family, replay=replay)
    torch.manual_seed(0)
    model = Block(64, 4, 128)
    x = torch.randn(1, 16, 64)
    dev = copy.deepcopy(model).to("fornax")
    torch._dynamo.reset()
    compiled = torch.compile(dev, backend="fornax")
    xd = x.to("fornax")
    losses = []
    for _ in range(RUNS):
        compiled.zero_grad(set_to_none=True)
        loss = compiled(xd).square().mean()
        loss.backward()
        losses.append(loss.detach().cpu())
    torch.fornax.synchronize()
    grads = [p.grad.cpu() for p in dev.parameters()]
    stack = current().stack
    return losses, grads, stack, chrome_trace(stack.devices)


def _unnumbered(text: str) -> str:
    """Kernel names without the process-wide number AOTAutograd gives each graph it compiles
    (the second compile in a process is forward2, not forward0)."""
    return re.sub(r"\b(forward|backward)\d+_", r"\1_", text)


@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_training_steps_are_identical_with_replay_on_and_off(family):
    on = _compiled_steps(family, True)
    off = _compiled_steps(family, False)
    for a, b in zip(on[0] + on[1], off[0] + off[1]):
        assert a.numpy().tobytes() == b.numpy().tobytes()
    assert on[2].devices[0].timeline.busy_time == off[2].devices[0].timeline.busy_time
    assert [(_unnumbered(k.name), k.grid, k.duration_s) for k in on[2].driver.kernel_log] == \
        [(_unnumbered(k.name), k.grid, k.duration_s) for k in off[2].driver.kernel_log]
    assert _unnumbered(json.dumps(on[3], sort_keys=True)) == _unnumbered(json.dumps(off[3], sort_keys=True))
    assert on[2].devices[0].replays.stats()["replayed"] > 0
    assert off[2].devices[0].replays.stats()["replayed"] == 0
    # the compiled graphs' plans: the second run of each captured, the third replayed the capture
    counts = on[2].framework.counts
    assert counts["plans_captured"] >= 2 and counts["plan_runs_replayed"] >= 2
    assert "plans_captured" not in off[2].framework.counts


def test_the_config_key_and_a_bad_value(tmp_path):
    path = tmp_path / "stack.toml"
    path.write_text('[stack]\nvendor = "rocm-like"\nreplay = false\n')
    cfg = load_config(path)
    stack = compose(cfg)
    assert cfg.replay is False and stack.devices[0].replays.stats()["replay"] is False
    assert stack.framework.capture_plans is False          # nor are plan runs captured
    assert compose(make_config("rocm-like")).framework.capture_plans is True
    assert make_config("rocm-like", base=cfg, replay=True).replay is True
    path.write_text('[stack]\nvendor = "rocm-like"\nreplay = "no"\n')
    with pytest.raises(Exception, match="replay must be true or false"):
        load_config(path)
