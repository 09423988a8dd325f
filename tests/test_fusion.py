"""Fusion on the transformer-block workload: same numbers, fewer launches, less time."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.scenarios.workloads import TOLERANCE, get_workload
from fornax.stack import compose, make_config
from helpers import FAMILIES

VENDORS = FAMILIES


def _run(vendor: str, fuse: bool):
    stack = compose(make_config(vendor, fuse=fuse))
    graph, feeds = get_workload("transformer-block").build(0)
    result = stack.run(graph, feeds)
    time_s = max(d.timeline.busy_time for d in stack.devices)
    return graph, feeds, result, stack.driver.counts["launches"], time_s


def _independent_reference(feeds, graph):
    """The block in plain float64 numpy, from the graph's own constants (not Graph.reference)."""
    c = {v.name: v.const.astype(np.float64) for v in graph.constants}
    x = feeds["x"].astype(np.float64)

    def rms(v, gain):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + c["eps"]) * gain

    def heads(v):
        return v.reshape(64, 4, 64).transpose(1, 0, 2)

    h = rms(x, c["norm1"])
    q, k, v = (heads(h @ c[w]) for w in ("wq", "wk", "wv"))
    s = q @ k.transpose(0, 2, 1) / 8.0
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    h1 = x + (p @ v).transpose(1, 0, 2).reshape(64, 256) @ c["wo"]
    n2 = rms(h1, c["norm2"])
    a = n2 @ c["w1"]
    return h1 + (a / (1 + np.exp(-a)) * (n2 @ c["w3"])) @ c["w2"]


@pytest.mark.parametrize("vendor", VENDORS)
def test_fusion_keeps_numerics_and_cuts_launches_and_time(vendor):
    graph, feeds, fused, launches_on, time_on = _run(vendor, True)
    _, _, unfused, launches_off, time_off = _run(vendor, False)
    ref = _independent_reference(feeds, graph)
    tol = TOLERANCE[graph.outputs[0].dtype]
    for out in (fused.outputs[0], unfused.outputs[0]):
        assert out.shape == ref.shape
        assert np.abs(out.astype(np.float64) - ref).max() / np.abs(ref).max() <= tol
    assert not fused.fallbacks and not unfused.fallbacks
    assert launches_on < launches_off
    assert time_on < time_off
    on, off = fused.plans[0].stats, unfused.plans[0].stats
    assert on["fuse"] and not off["fuse"] and on["fused_kernels"] > 0 and off["fused_kernels"] == 0
    # unfused: one kernel or library call per lowered op
    assert off["kernels"] + off["library_calls"] == off["ops_lowered"]


def test_cli_no_fuse_and_dump_ir(tmp_path):
    def compose_json(*extra):
        r = CliRunner().invoke(main, ["compose", "--vendor", "cuda-like", "--workload", "transformer-block",
                                      "--json", *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)
    on = compose_json()
    off = compose_json("--no-fuse", "--dump-ir", str(tmp_path))
    assert off["seams"]["compiler"]["kernels"] > on["seams"]["compiler"]["kernels"]
    assert off["costs"]["launches"] > on["costs"]["launches"]
    assert off["costs"]["device_time_s"] > on["costs"]["device_time_s"]
    assert all(n["ok"] for n in on["numerics"] + off["numerics"])
    # the planned peak holds at least the pinned buffers: weights, the input and the output
    graph = get_workload("transformer-block").build(0)[0]
    pinned = sum(v.const.nbytes for v in graph.constants) + 2 * 64 * 256 * 4
    assert pinned <= on["costs"]["planned_peak_bytes"] <= on["costs"]["peak_device_bytes"]
    dumped = sorted(p.name for p in tmp_path.iterdir())
    assert "transformer-block.07.fuse.txt" in dumped and "transformer-block.00.input.txt" in dumped
