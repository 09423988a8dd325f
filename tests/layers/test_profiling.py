"""Profiling hooks: the one shared collector, the three families' interfaces over it
(CUPTI-like, rocprofiler-sdk-like, Level Zero tracer-like + PTI-like views), per-kernel
metrics from the cost model, bounded buffers, the trace's API track and `fornax profile`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.compare import execute, prepare
from fornax.layers.errors import FornaxError
from fornax.layers.profiler import Recorder, kernel_metrics
from fornax.schemas import validate
from fornax.sim.cost import gemm_cost
from fornax.sim.spec import load_spec
from fornax.sim.trace import QUEUE_TID_BASE, chrome_trace
from fornax.stack import make_config

#: how each family turns on kernel, copy and runtime-API records, and its field names
ACTIVITY = {
    "cuda-like": ("CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                  "CUPTI_ACTIVITY_KIND_RUNTIME", "correlationId", "start", "end"),
    "rocm-like": ("ROCPROFILER_BUFFER_TRACING_KERNEL_DISPATCH", "ROCPROFILER_BUFFER_TRACING_MEMORY_COPY",
                  "ROCPROFILER_BUFFER_TRACING_HIP_RUNTIME_API", "correlation_id", "start_timestamp",
                  "end_timestamp"),
    "xpu-like": ("PTI_VIEW_DEVICE_GPU_KERNEL", "PTI_VIEW_DEVICE_GPU_MEM_COPY", "PTI_VIEW_RUNTIME_API",
                 "_correlation_id", "_start_timestamp", "_end_timestamp"),
}


def _prep(vendor: str, workload: str = "mlp"):
    return prepare(make_config(vendor, spec="tiny"), "graph", workload)


def _enable(prof, vendor: str, got: list, size: int = 1 << 20):
    """Turn on kernel, copy and runtime-API records into ``got``; returns a flush function."""
    kernel, memcpy, runtime = ACTIVITY[vendor][:3]
    if vendor == "cuda-like":
        prof.activity_register_callbacks(lambda: size, lambda recs, used: got.extend(recs))
        for kind in (kernel, memcpy, runtime):
            prof.activity_enable(kind)
        return prof.activity_flush_all
    if vendor == "rocm-like":
        ctx = prof.create_context()
        buf = prof.create_buffer(ctx, size, 0, "ROCPROFILER_BUFFER_POLICY_LOSSLESS",
                                 lambda c, b, recs, dropped: got.extend(recs))
        for kind in (kernel, memcpy, runtime):
            prof.configure_buffer_tracing_service(ctx, kind, [], buf)
        prof.start_context(ctx)
        return lambda: prof.flush_buffer(buf)
    prof.view_set_callbacks(lambda: size, lambda recs, used: got.extend(recs))
    for kind in (kernel, memcpy, runtime):
        prof.view_enable(kind)
    return prof.flush_all_views


@pytest.mark.parametrize("vendor", list(ACTIVITY))
def test_activity_records_match_the_kernel_log_and_correlate_with_api_calls(vendor):
    prep = _prep(vendor)
    rt, driver = prep.stack.runtime, prep.stack.driver
    prof = rt.profiler()
    got: list[dict] = []
    flush = _enable(prof, vendor, got)
    with Recorder(rt) as rec:
        first = driver.counts["launches"]
        execute(prep)
        rt.synchronize()
    flush()
    kind_k, kind_c, kind_api, corr, start, end = ACTIVITY[vendor]
    kinds = {r.get("kind", r.get("_view_kind")) for r in got}
    assert {kind_k, kind_c, kind_api} <= kinds, kinds
    # every kernel record's duration is the kernel log's simulated duration of that launch
    log = {k.launch: k for k in driver.kernel_log if k.launch > first}
    assert rec.kernels and {k.launch for k in rec.kernels} == set(log)
    for k in rec.kernels:
        assert k.duration_s == pytest.approx(log[k.launch].duration_s, rel=1e-12)
        assert k.name == log[k.launch].name and k.flops == pytest.approx(log[k.launch].flops)
        assert k.metrics["duration_ns"] == pytest.approx(k.duration_s * 1e9)
    family_kernels = [r for r in got if r.get("kind", r.get("_view_kind")) == kind_k]
    assert sorted(r[end] - r[start] for r in family_kernels) == \
        sorted(round(k.end_s * 1e9) - round(k.start_s * 1e9) for k in rec.kernels)
    # correlation ids: each kernel names the runtime launch that submitted it
    launches = {a.correlation: a for a in rec.api if a.domain == "runtime"}
    for k in rec.kernels:
        assert launches[k.correlation].call == "launch", launches[k.correlation]
        assert launches[k.correlation].name == rt.calls["launch"]
    api_ids = {r[corr] for r in got if r.get("kind", r.get("_view_kind")) == kind_api}
    assert {r[corr] for r in family_kernels} <= api_ids
    for c in rec.copies:
        assert launches[c.correlation].call.startswith("memcpy")
    assert driver.collector is None or driver.collector.sinks   # gone once nobody listens


def test_nothing_is_wrapped_or_collected_while_nobody_subscribes():
    prep = _prep("cuda-like")
    rt, driver = prep.stack.runtime, prep.stack.driver
    assert driver.collector is None and "launch" not in vars(rt)
    rec = Recorder(rt).start()
    assert driver.collector is not None and "launch" in vars(rt) and "allocate" in vars(driver)
    execute(prep)
    rec.stop()
    assert driver.collector is None and "launch" not in vars(rt) and "allocate" not in vars(driver)
    assert all("launch" not in vars(q) for c in driver.contexts for q in c.queues)
    n = len(rec.kernels)
    execute(_prep("cuda-like"))
    assert len(rec.kernels) == n                     # a stopped recorder takes nothing


def test_kernel_metrics_are_the_cost_models_values():
    spec = load_spec("tiny")
    est = gemm_cost(spec, 192, 96, 64, dtype="bfloat16")
    cost, dur = est.cost, est.cost.duration_s
    from fornax.sim.cost import gemm_counters
    c = gemm_counters(192, 96, 64, dtype="bfloat16", tile=tuple(est.detail["tile"]))
    m = kernel_metrics(spec, c, cost, dur)
    assert m["occupancy_pct"] == pytest.approx(100 * (cost.wave_efficiency if c.instances >= spec.compute_units
                                                      else c.instances / spec.compute_units))
    assert m["dram_bytes_read"] + m["dram_bytes_written"] == pytest.approx(cost.hbm_bytes)
    assert m["dram_bytes_read"] / m["dram_bytes_written"] == pytest.approx(c.bytes_read / c.bytes_written)
    assert m["l2_bytes"] == cost.l2_bytes == c.bytes_read + c.bytes_written
    flops = c.matrix_flops["bfloat16"] * cost.alignment
    assert m["matrix_util_pct"] == pytest.approx(100 * flops / spec.peak("bfloat16", True) / dur)
    assert m["memory_stall_pct"] == pytest.approx(
        100 * (max(0.0, cost.memory_s - cost.compute_s) + cost.ramp_s) / dur)
    assert m["instances"] == c.instances


def _error(fn, *args) -> FornaxError:
    with pytest.raises(FornaxError) as info:
        fn(*args)
    return info.value


def test_cupti_like_refuses_a_second_subscriber_an_unknown_domain_and_a_small_buffer():
    prof = _prep("cuda-like").stack.runtime.profiler()
    seen: list[tuple] = []
    sub = prof.subscribe(lambda user, dom, cbid, data: seen.append((cbid, data["callbackSite"])))
    err = _error(prof.subscribe, lambda *a: None)
    assert err.code.name == "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED" and err.code.value == 39
    assert "cuptiUnsubscribe" in err.hint
    err = _error(prof.enable_domain, True, sub, "CUPTI_CB_DOMAIN_NVTX")
    assert err.code.name == "CUPTI_ERROR_INVALID_PARAMETER" and "CUPTI_CB_DOMAIN_RUNTIME_API" in err.hint
    err = _error(prof.enable_callback, True, sub, "CUPTI_CB_DOMAIN_RUNTIME_API", "CUPTI_RUNTIME_TRACE_CBID_nope")
    assert err.code.name == "CUPTI_ERROR_INVALID_PARAMETER"
    err = _error(prof.activity_enable, "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL")
    assert err.code.name == "CUPTI_ERROR_INVALID_OPERATION"          # no buffer callbacks yet
    prof.activity_register_callbacks(lambda: 64, lambda recs, used: None)
    err = _error(prof.activity_enable, "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL")
    assert err.code.name == "CUPTI_ERROR_PARAMETER_SIZE_NOT_SUFFICIENT" and "224 bytes" in err.message
    err = _error(prof.activity_enable, "CUPTI_ACTIVITY_KIND_NOPE")
    assert err.code.name == "CUPTI_ERROR_INVALID_KIND"
    # one callback id: enter and exit of every cudaMalloc, nothing else
    prof.enable_callback(True, sub, "CUPTI_CB_DOMAIN_RUNTIME_API", "CUPTI_RUNTIME_TRACE_CBID_cudaMalloc")
    prof.runtime.malloc(4096)
    prof.runtime.synchronize()
    assert seen == [("CUPTI_RUNTIME_TRACE_CBID_cudaMalloc", "CUPTI_API_ENTER"),
                    ("CUPTI_RUNTIME_TRACE_CBID_cudaMalloc", "CUPTI_API_EXIT")]
    prof.unsubscribe(sub)
    assert prof.subscribe(lambda *a: None).live                     # free again once unsubscribed


def test_cupti_like_counts_records_dropped_for_want_of_buffers():
    prep = _prep("cuda-like")
    prof = prep.stack.runtime.profiler()
    sizes = iter([224 * 3])                                # one buffer of three kernel records
    done: list[list] = []
    prof.activity_register_callbacks(lambda: next(sizes, 0), lambda recs, used: done.append(recs))
    prof.activity_enable("CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL")
    with Recorder(prep.stack.runtime) as rec:
        execute(prep)
    prof.activity_flush_all()
    assert len(rec.kernels) == 4 and [len(b) for b in done] == [3]
    assert prof.activity_get_num_dropped_records() == 1
    assert prof.activity_get_num_dropped_records() == 0     # counted since the last query
    small = Recorder(prep.stack.runtime, limit=1).start()
    execute(_prep("cuda-like"))                      # another stack's driver: not this collector's
    small.stop()
    assert not small.kernels and small.dropped["kernel"] == 0
    small.start()
    execute(prep)
    small.stop()
    assert len(small.kernels) == 1 and small.dropped["kernel"] == 3     # bounded: the rest counted


def test_rocprofiler_like_contexts_services_and_callback_phases():
    prof = _prep("rocm-like").stack.runtime.profiler()
    ctx = prof.create_context()
    seen: list[tuple] = []

    def cb(record, user, data):
        user.setdefault("phases", []).append(record["phase"])
        seen.append((record["operation"], record["phase"], data, list(user["phases"])))

    prof.configure_callback_tracing_service(ctx, "ROCPROFILER_CALLBACK_TRACING_HIP_RUNTIME_API",
                                            ["ROCPROFILER_HIP_RUNTIME_API_ID_hipMalloc"], cb, "tool")
    err = _error(prof.configure_callback_tracing_service, ctx,
                 "ROCPROFILER_CALLBACK_TRACING_HIP_RUNTIME_API", [], cb)
    assert err.code.name == "ROCPROFILER_STATUS_ERROR_SERVICE_ALREADY_CONFIGURED" and err.code.value == 15
    err = _error(prof.configure_buffer_tracing_service, ctx, "ROCPROFILER_BUFFER_TRACING_NOPE", [], None)
    assert err.code.name == "ROCPROFILER_STATUS_ERROR_KIND_NOT_FOUND"
    err = _error(prof.create_buffer, ctx, 16, 0, "ROCPROFILER_BUFFER_POLICY_LOSSLESS", lambda *a: None)
    assert err.code.name == "ROCPROFILER_STATUS_ERROR_INVALID_ARGUMENT"
    prof.start_context(ctx)
    err = _error(prof.configure_callback_tracing_service, ctx,
                 "ROCPROFILER_CALLBACK_TRACING_HSA_CORE_API", [], cb)
    assert err.code.name == "ROCPROFILER_STATUS_ERROR_CONFIGURATION_LOCKED" and err.code.value == 16
    prof.runtime.malloc(4096)
    prof.stop_context(ctx)
    prof.runtime.malloc(4096)                                # a stopped context sees nothing
    op = "ROCPROFILER_HIP_RUNTIME_API_ID_hipMalloc"
    assert seen == [(op, "ROCPROFILER_CALLBACK_PHASE_ENTER", "tool", ["ROCPROFILER_CALLBACK_PHASE_ENTER"]),
                    (op, "ROCPROFILER_CALLBACK_PHASE_EXIT", "tool",
                     ["ROCPROFILER_CALLBACK_PHASE_ENTER", "ROCPROFILER_CALLBACK_PHASE_EXIT"])]


def test_zel_tracer_like_prologues_epilogues_and_pti_like_errors():
    prep = _prep("xpu-like")
    prof = prep.stack.runtime.profiler()
    err = _error(prof.tracer_create, {"stype": "ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES"})
    assert err.code.name == "ZE_RESULT_ERROR_INVALID_ARGUMENT" and err.code.value == 0x78000004
    tracer = prof.tracer_create({"stype": "ZEL_STRUCTURE_TYPE_TRACER_EXP_DESC", "pUserData": "me"})
    calls: list[tuple] = []

    def pro(params, result, user, inst):
        inst["t"] = params["correlation_id"]
        calls.append(("pro", params["api"], result, user))

    def epi(params, result, user, inst):
        calls.append(("epi", params["api"], result, inst["t"] == params["correlation_id"]))

    err = _error(prof.tracer_set_prologues, tracer, {"sycl::queue::parallel_for": pro})
    assert err.code.name == "ZE_RESULT_ERROR_INVALID_ARGUMENT"      # not a Level Zero call
    prof.tracer_set_prologues(tracer, {"zeCommandListAppendLaunchKernel": pro})
    prof.tracer_set_epilogues(tracer, {"zeCommandListAppendLaunchKernel": epi})
    execute(prep)
    assert not calls                                          # created disabled
    prof.tracer_set_enabled(tracer, True)
    execute(prep)
    assert calls and calls[0] == ("pro", "zeCommandListAppendLaunchKernel", "ZE_RESULT_SUCCESS", "me")
    assert ("epi", "zeCommandListAppendLaunchKernel", "ZE_RESULT_SUCCESS", True) in calls
    err = _error(prof.tracer_destroy, tracer)
    assert err.code.name == "ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE"
    prof.tracer_set_enabled(tracer, False)
    prof.tracer_destroy(tracer)
    assert prep.stack.driver.collector is None
    err = _error(prof.view_enable, "PTI_VIEW_DEVICE_GPU_KERNEL")
    assert err.code.name == "PTI_ERROR_NO_CALLBACKS_SET"
    err = _error(prof.view_set_callbacks, lambda: 100, lambda recs, used: None)
    assert err.code.name == "PTI_ERROR_BAD_ARGUMENT"


def test_trace_api_track_links_calls_to_the_kernels_they_launched():
    prep = _prep("rocm-like")
    with Recorder(prep.stack.runtime) as rec:
        execute(prep)
    doc = chrome_trace(prep.stack.devices, api=rec.track())
    ev = doc["traceEvents"]
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"host thread 1 · HIP runtime API", "host thread 1 · HIP / HSA runtime API"} <= names
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert starts and set(starts) == set(ends) == set(range(1, len(starts) + 1))
    calls = {e["args"]["correlation"]: e for e in ev if e["ph"] == "X" and e["cat"] == "api"
             and e["tid"] % 10 == 0}
    kernels = {(e["tid"], e["ts"]): e for e in ev if e["ph"] == "X" and e["cat"] == "kernel"
               and e["tid"] >= QUEUE_TID_BASE}
    linked = 0
    for i, s in starts.items():
        f = ends[i]
        assert s["args"]["correlation"] == f["args"]["correlation"]
        assert calls[s["args"]["correlation"]]["ts"] == s["ts"] and s["ts"] <= f["ts"]
        if (f["tid"], f["ts"]) in kernels:
            linked += 1
            assert calls[s["args"]["correlation"]]["name"] == "hipLaunchKernel"
    assert linked == len(rec.kernels)


@pytest.mark.parametrize("vendor,kernels,metric", [
    ("cuda-like", "cuda_gpu_kern_sum", "sm__warps_active.avg.pct_of_peak_sustained_active"),
    ("rocm-like", "kernel_stats", "OccupancyPercent"),
    ("xpu-like", "Device Timing Results", "XVE_THREADS_OCCUPANCY_ALL")])
def test_fornax_profile_prints_the_familys_summary(vendor, kernels, metric, tmp_path):
    res = CliRunner().invoke(main, ["profile", "--vendor", vendor, "--spec", "tiny", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    validate(doc)
    assert doc["sections"]["kernels"]["title"] == kernels and doc["family"] == vendor
    assert doc["kernels"] and sum(k["pct"] for k in doc["kernels"]) == pytest.approx(100.0)
    assert all(metric in m["named"] for m in doc["metrics"])
    assert doc["correlated"]["kernels"] == sum(k["count"] for k in doc["kernels"])
    assert {c["direction"] for c in doc["copies"]} == {"h2d", "d2h"}
    text = CliRunner().invoke(main, ["profile", "--vendor", vendor, "--spec", "tiny", "--top", "1"])
    assert text.exit_code == 0 and kernels in text.stdout and metric in text.stdout
    assert doc["kernels"][0]["name"] in text.stdout


def test_fornax_profile_bad_input_is_one_line():
    res = CliRunner().invoke(main, ["profile", "--spec", "tiny"])
    assert res.exit_code == 2 and "no stack given" in res.stderr
    res = CliRunner().invoke(main, ["profile", "--vendor", "cuda-like", "--spec", "tiny", "--workload", "nope"])
    assert res.exit_code == 2 and "nope" in res.stderr
    res = CliRunner().invoke(main, ["profile", "--vendor", "null", "--spec", "tiny"])
    assert res.exit_code != 0 and "Traceback" not in res.output


def test_host_arrays_stay_plain_numpy():
    # the traced runtime returns what the runtime returns (wrappers are transparent)
    prep = _prep("cuda-like")
    rt = prep.stack.runtime
    with Recorder(rt):
        p = rt.malloc(64)
        rt.memcpy_h2d(p, np.arange(16, dtype=np.float32))
        out = np.zeros(16, np.float32)
        rt.memcpy_d2h(out, p)
    assert out.tolist() == list(range(16))


def test_rocprofiler_like_buffer_tracing_keeps_the_configured_operations_only():
    prep = _prep("rocm-like")
    prof = prep.stack.runtime.profiler()
    ctx = prof.create_context()
    got: list[dict] = []
    buf = prof.create_buffer(ctx, 1 << 16, 0, "ROCPROFILER_BUFFER_POLICY_LOSSLESS",
                             lambda c, b, recs, dropped: got.extend(recs))
    prof.configure_buffer_tracing_service(ctx, "ROCPROFILER_BUFFER_TRACING_HIP_RUNTIME_API",
                                          ["ROCPROFILER_HIP_RUNTIME_API_ID_hipLaunchKernel"], buf)
    prof.start_context(ctx)
    execute(prep)
    prof.flush_buffer(buf)
    assert len(got) == prep.stack.driver.counts["launches"] == 4
    assert {r["operation"] for r in got} == {"ROCPROFILER_HIP_RUNTIME_API_ID_hipLaunchKernel"}


def test_merged_rank_traces_keep_each_ranks_api_flows_apart():
    from fornax.sim.trace_merge import merge
    docs = []
    for rank in (0, 1):
        prep = _prep("cuda-like")
        with Recorder(prep.stack.runtime) as rec:
            execute(prep)
        doc = chrome_trace(prep.stack.devices, api=rec.track())
        doc["otherData"].update(rank=rank, world_size=2, family="cuda-like", node=0)
        docs.append(doc)
    merged = merge(docs)["traceEvents"]
    for ph in ("s", "f"):
        ids = [e["id"] for e in merged if e["ph"] == ph and e["cat"] == "api"]
        assert len(ids) == len(set(ids)) == sum(1 for d in docs for e in d["traceEvents"] if e["ph"] == ph)
    ends = {e["id"]: e for e in merged if e["ph"] == "f" and e["cat"] == "api"}
    assert all(ends[e["id"]]["pid"] == e["pid"] for e in merged if e["ph"] == "s" and e["cat"] == "api")
