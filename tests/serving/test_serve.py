"""The serving engine end to end: greedy outputs token-identical to the model's own
``generate()`` on the CPU, on every family, under chunked prefill, prefix sharing and both
kinds of preemption; the report's figures follow from the run; the capacity model."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from click.testing import CliRunner

import fornax.frameworks.torch as ft
from fornax import serving
from fornax.cli.main import main
from fornax.layers.errors import ConfigError
from fornax.schemas import validate
from fornax.sim.spec import load_spec
from helpers import FAMILIES


@functools.lru_cache(maxsize=None)
def _cpu_model(name: str):
    return serving.build(name)


def _reference(name: str, request: serving.Request) -> list[int]:
    """The tokens ``generate()`` produces greedily on the CPU for ``request``."""
    model = _cpu_model(name)
    ids = torch.tensor([request.prompt])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=request.max_new_tokens)
    return out[0, len(request.prompt):].tolist()


def _trace(**kw) -> list[serving.Request]:
    spec = serving.TraceSpec(**{"requests": 6, "rate": 400.0, "prompt_len": (5, 40),
                                "output_len": (3, 7), "seed": 3, **kw})
    return serving.poisson_trace(spec, 256)


def _serve(vendor: str, requests, **cfg) -> serving.ServeResult:
    ft.use_stack(vendor)
    sched = {k: cfg.pop(k) for k in ("max_num_seqs", "max_batched_tokens", "chunked_prefill", "preemption")
             if k in cfg}
    return serving.serve(requests, serving.ServeConfig(scheduler=serving.SchedulerConfig(**sched), **cfg))


def _check_tokens(model: str, requests, result: serving.ServeResult) -> None:
    outputs = result.outputs()
    for r in requests:
        assert outputs[r.id] == _reference(model, r), r.id


@pytest.mark.parametrize("vendor", FAMILIES)
def test_llama_matches_generate_on_every_family(vendor):
    requests = _trace()
    result = _serve(vendor, requests, max_batched_tokens=32)
    _check_tokens("llama", requests, result)
    counts = result.scheduler_counts
    # prompts longer than the 32-token budget were prefilled in chunks
    assert counts["prefill_tokens"] == sum(len(r.prompt) for r in requests)
    assert all(st.prefill_tokens + st.decode_tokens <= 32 for st in result.steps)
    calls = [c.routine for c in ft.stack().library.calls]
    assert "paged_attention" in calls and "paged_cache_write" in calls


def test_gpt2_matches_generate():
    requests = _trace(seed=5)
    result = _serve("rocm-like", requests, model="gpt2")
    _check_tokens("gpt2", requests, result)


@pytest.mark.parametrize("vendor", FAMILIES)
def test_graph_decoder_matches_generate_and_fuses(vendor):
    """fornax's own graph decoder: the same tokens as generate(); whole graphs compiled by the
    stack launch fewer kernels and take less device time than the op-by-op torch modules."""
    requests = _trace(requests=4, rate=float("inf"), seed=13)
    ft.use_stack(vendor)
    launches = ft.stack().driver.kernel_log
    graph = serving.serve(requests, serving.ServeConfig(decoder="graph"))
    n_graph = launches.total
    _check_tokens("llama", requests, graph)
    ft.use_stack(vendor)
    launches = ft.stack().driver.kernel_log
    torch_run = serving.serve(requests, serving.ServeConfig(decoder="torch"))
    n_torch = launches.total
    assert graph.outputs() == torch_run.outputs()
    assert len(graph.steps) == len(torch_run.steps)       # the same schedule: all arrive at 0
    assert n_graph < n_torch
    assert graph.device_time < torch_run.device_time
    with pytest.raises(ConfigError, match="Llama"):
        serving.serve(requests, serving.ServeConfig(model="gpt2", decoder="graph"))


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_keeps_outputs(mode):
    requests = _trace(requests=5, rate=float("inf"), prompt_len=(20, 30), output_len=(6, 10), seed=7)
    # 7 blocks of 16 tokens cannot hold five 30-40 token sequences at once
    result = _serve("xpu-like", requests, num_blocks=7, preemption=mode)
    counts = result.scheduler_counts
    assert counts["preemptions" if mode == "recompute" else "swaps"] > 0
    _check_tokens("llama", requests, result)
    if mode == "swap":
        assert result.block_counts["swap_out_blocks"] > 0 and result.block_counts["swap_in_blocks"] > 0


def test_prefix_sharing_reuses_blocks_and_keeps_outputs():
    requests = _trace(requests=4, rate=50.0, prompt_len=(40, 44), shared_prefix=32, seed=11)
    shared = _serve("cuda-like", requests)
    _check_tokens("llama", requests, shared)
    assert shared.scheduler_counts["prefix_hit_tokens"] >= 32
    alone = _serve("cuda-like", requests, prefix_caching=False)
    assert alone.outputs() == shared.outputs()
    assert alone.scheduler_counts["prefix_hit_tokens"] == 0
    assert sum(s.prefill_tokens for s in shared.steps) < sum(s.prefill_tokens for s in alone.steps)
    assert shared.device_time < alone.device_time


def test_report_follows_from_the_run():
    requests = _trace(requests=5, rate=100.0)
    result = _serve("cuda-like", requests)
    doc = serving.document(result, serving.capacity_rows(result, 4096))
    validate(json.loads(json.dumps(doc)))
    gen = sum(r.max_new_tokens for r in requests)
    assert doc["tokens"]["generated"] == gen
    assert doc["throughput"]["generated_tokens_per_s"] == pytest.approx(gen / doc["makespan_s"])
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        row = doc["latency"][key]
        assert 0 < row["p50"] <= row["p90"] <= row["p99"]
    # the clock: the first token of a request comes after its arrival and after a step ran
    for s in result.sequences:
        assert s.first_token_at > s.request.arrival
        assert s.finished_at == s.token_times[-1]
    # steps are back to back or wait for an arrival; each lasts its device time
    ends = [st.end for st in result.steps]
    assert ends == sorted(ends)
    assert sum(st.end - st.start for st in result.steps) == pytest.approx(result.device_time)
    assert all(0.0 <= st.kv_utilisation <= 1.0 for st in result.steps)


def test_capacity_model_follows_hbm():
    shape = serving.REFERENCE_SHAPES["llama-8b-like"]
    h100, h200 = load_spec("h100-like"), load_spec("h200-like")
    a = serving.capacity(shape, h100, 4096)
    b = serving.capacity(shape, h200, 4096)
    assert b.max_sequences > a.max_sequences
    # by hand: 2 (K, V) x 32 layers x 8 kv heads x 128 x 2 bytes = 128 KiB per token
    assert shape.kv_bytes_per_token == 131072
    assert a.block_bytes == 16 * 131072
    kv = int(h100.hbm_bytes * 0.9) - shape.weight_bytes - a.activation_bytes
    assert a.kv_bytes == kv and a.blocks == kv // a.block_bytes
    assert a.max_sequences == a.blocks // 256
    # tensor parallelism splits the weights and the KV heads
    t2 = serving.capacity(serving.REFERENCE_SHAPES["llama-70b-like"], h100, 4096, tp=2)
    assert t2.weight_bytes * 2 >= serving.REFERENCE_SHAPES["llama-70b-like"].weight_bytes
    with pytest.raises(ConfigError, match="key/value heads"):
        serving.capacity(shape, h100, 4096, tp=3)
    # a 70B model does not fit one 80 GB device at all
    assert serving.capacity(serving.REFERENCE_SHAPES["llama-70b-like"], h100, 4096).max_sequences == 0


def test_cli_json_and_errors(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["serve", "--vendor", "rocm-like", "--requests", "3", "--output-len", "2:3",
                               "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    validate(doc)
    assert doc["vendor"] == "rocm-like" and doc["requests"] == 3
    assert {c["spec"] for c in doc["capacity"]} >= {"h100-like", "h200-like"}
    bad = runner.invoke(main, ["serve", "--vendor", "rocm-like", "--prompt-len", "9:3"])
    assert bad.exit_code != 0 and "--prompt-len" in bad.output
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"prompt": [1, 2, 3], "max_new_tokens": 2}\n{"prompt": [1, 999], "max_new_tokens": 2}\n')
    bad = runner.invoke(main, ["serve", "--vendor", "rocm-like", "--trace", str(trace)])
    assert bad.exit_code != 0 and "line 2" in bad.output


def test_cli_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "load.png"
    res = CliRunner().invoke(main, ["serve", "--vendor", "cuda-like", "--requests", "3", "--output-len", "2",
                                    "--plot", str(out), "--plot-rates", "10,1000", "--json"])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(res.output)
    assert [p["rate"] for p in doc["load_sweep"]] == [10.0, 1000.0]
