"""Lab 3's profiling experiment: the lab's one launch and copy-back profiled on each family
through its own interface (``runtime.profiler()``).

- cuda-like, CUPTI-like: ``subscribe`` a callback to the runtime and driver API domains, and
  activity buffers for kernels, copies and both API layers;
- rocm-like, rocprofiler-sdk-like: a context with callback tracing of the HIP runtime and
  HSA APIs and buffer tracing of kernel dispatches, memory copies and both API layers;
- xpu-like, a Level Zero tracer-like tracer with a prologue on every Level Zero call, and
  PTI-like views of kernels, copies and both API layers.

What each shows: the calls its callbacks saw for the launch, the activity kinds its buffers
received, the kernel's record in the family's field names (its correlation id names the
launch call), and two of the kernel's metrics in the family's names (the collector's
``Recorder`` beside the family's interface takes the metrics).
"""

from __future__ import annotations

from functools import lru_cache
from collections.abc import Callable
from typing import Any

import numpy as np

from .lab import Section, Table

#: the metrics the lab shows, fornax's keys (each family names them its way)
METRICS = ("duration_ns", "dram_bytes_read")
BUFFER = 1 << 16                               # bytes of each activity buffer the lab hands over


def _window(stack: Any, module: Any, src: int, dst: int, n: int, stream: Any) -> None:
    """The profiled work: scale3 on ``stream``, the ``n`` floats of dst copied back on it, the
    host waits."""
    rt = stack.runtime
    rt.launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst}, stream)
    out = np.zeros(n, np.float32)
    rt.memcpy_d2h(out, dst, stream, blocking=False)
    rt.synchronize()


def _cupti(prof: Any, run: Any) -> tuple[list[tuple[str, int]], list[dict[str, Any]]]:
    calls: list[tuple[str, int]] = []
    records: list[dict[str, Any]] = []
    prof.activity_register_callbacks(lambda: BUFFER, lambda buf, valid: records.extend(buf))
    for kind in ("CONCURRENT_KERNEL", "MEMCPY", "RUNTIME", "DRIVER"):
        prof.activity_enable(f"CUPTI_ACTIVITY_KIND_{kind}")
    sub = prof.subscribe(lambda userdata, domain, cbid, data: calls.append((cbid, data["correlationId"]))
                         if data["callbackSite"] == "CUPTI_API_ENTER" else None)
    for domain in ("CUPTI_CB_DOMAIN_RUNTIME_API", "CUPTI_CB_DOMAIN_DRIVER_API"):
        prof.enable_domain(True, sub, domain)
    run()
    prof.activity_flush_all()
    prof.unsubscribe(sub)
    return calls, records


def _rocprofiler(prof: Any, run: Any) -> tuple[list[tuple[str, int]], list[dict[str, Any]]]:
    calls: list[tuple[str, int]] = []
    records: list[dict[str, Any]] = []
    ctx = prof.create_context()
    buf = prof.create_buffer(ctx, BUFFER, 0, "ROCPROFILER_BUFFER_POLICY_LOSSLESS",
                             lambda context, buffer, recs, drops: records.extend(recs))
    for kind in ("KERNEL_DISPATCH", "MEMORY_COPY", "HIP_RUNTIME_API", "HSA_CORE_API"):
        prof.configure_buffer_tracing_service(ctx, f"ROCPROFILER_BUFFER_TRACING_{kind}", [], buf)
    for kind in ("HIP_RUNTIME_API", "HSA_CORE_API"):
        prof.configure_callback_tracing_service(
            ctx, f"ROCPROFILER_CALLBACK_TRACING_{kind}", [],
            lambda record, user_data, data: calls.append((record["operation"], record["correlation_id"]))
            if record["phase"] == "ROCPROFILER_CALLBACK_PHASE_ENTER" else None)
    prof.start_context(ctx)
    run()
    prof.flush_buffer(buf)
    prof.stop_context(ctx)
    return calls, records


def _ze_tracer(prof: Any, run: Any) -> tuple[list[tuple[str, int]], list[dict[str, Any]]]:
    calls: list[tuple[str, int]] = []
    records: list[dict[str, Any]] = []

    def prologue(params: dict[str, Any], result: str, tracer_data: Any, instance_data: dict) -> None:
        calls.append((params["api"], params["correlation_id"]))

    tracer = prof.tracer_create({"stype": "ZEL_STRUCTURE_TYPE_TRACER_EXP_DESC", "pUserData": None})
    prof.tracer_set_prologues(tracer, dict.fromkeys(prof.vocab.callback_ids("driver"), prologue))
    prof.tracer_set_enabled(tracer, True)
    prof.view_set_callbacks(lambda: BUFFER, lambda recs, valid: records.extend(recs))
    for kind in ("DEVICE_GPU_KERNEL", "DEVICE_GPU_MEM_COPY", "RUNTIME_API", "DRIVER_API"):
        prof.view_enable(f"PTI_VIEW_{kind}")
    run()
    prof.flush_all_views()
    prof.tracer_set_enabled(tracer, False)
    prof.tracer_destroy(tracer)
    return calls, records


#: per family: how the lab drives its interface
INTERFACES = {"cuda-like": _cupti, "rocm-like": _rocprofiler, "xpu-like": _ze_tracer}


@lru_cache(maxsize=1)
def profiled(bench: Callable[[str], tuple[Any, Any, int, int]], n: int,
             families: tuple[str, ...]) -> tuple[dict[str, Any], ...]:
    """Per family of ``families``, on the lab's fresh stack ``bench(family)`` (the stack, a
    module with scale3, src and dst of ``n`` floats): its interface's name, the calls its
    callbacks saw for the launch, the activity kinds received, the kernel record (name,
    duration in ns, correlation id) and its field names, the API records sharing its
    correlation id, and two metrics as (the family's name, value and unit)."""
    from fornax.layers.profiler import Recorder
    rows = []
    for fam in families:
        stack, module, src, dst = bench(fam)
        stream = stack.runtime.create_stream(in_order=True)
        prof = stack.runtime.profiler()
        vocab = prof.vocab
        rec = Recorder(stack.runtime, api=False)

        def run() -> None:
            with rec:
                _window(stack, module, src, dst, n, stream)

        calls, records = INTERFACES[fam](prof, run)
        f = vocab.facts["fields"]["kernel"]
        kernel = next(r for r in records if r[f["kind"]] == vocab.kinds["kernel"])
        corr = kernel[f["correlation"]]
        api = vocab.facts["fields"]["api"]
        linked = [f"{r[api['call']]} ({r[api['kind']]})" for r in records
                  if r[api["kind"]] in (vocab.kinds["runtime"], vocab.kinds["driver"])
                  and r[api["correlation"]] == corr]
        named = vocab.metrics(rec.kernels[0].metrics)
        metrics = []
        for key in METRICS:
            unit = vocab.metric_unit(key)
            metrics.append((unit[0], f"{named[unit[0]]:,.2f} {unit[1]}") if unit is not None
                           else (key, "— (no counter)"))
        rows.append({"family": fam, "api": vocab.api,
                     "calls": [c for c, cid in calls if cid == corr],
                     "kinds": list(dict.fromkeys(r[f["kind"]] for r in records)),
                     "kernel": (kernel[f["name"]], kernel[f["end"]] - kernel[f["start"]], corr),
                     "fields": (f["start"], f["end"], f["correlation"]),
                     "linked": linked, "metrics": metrics})
    return tuple(rows)


def section(bench: Callable[[str], tuple[Any, Any, int, int]], n: int,
            families: tuple[str, ...]) -> Section:
    rows = profiled(bench, n, families)
    return Section(
        "Profiling hooks",
        "The same launch of scale3 and copy-back, profiled on each family through its own interface "
        "(`runtime.profiler()`; every name is the family's `[profiler]` data in its vendor.toml): "
        "CUPTI-like `subscribe` with the runtime and driver API domains enabled and activity "
        "buffers; a rocprofiler-sdk-like context with callback tracing and buffer tracing services; "
        "a Level Zero tracer-like tracer with a prologue on every Level Zero call, and PTI-like "
        "views. All three sit on one collector fed by the runtime and driver seams: a call made "
        "inside another shares its correlation id, and the driver queue stamps the kernel with it, "
        "so the kernel's record names the call that launched it. The Level Zero tracer sees Level "
        "Zero calls only; the SYCL call above it appears in the views. rocm-like's driver seam is "
        "HIP's module API over HSA, traced as the lower layer: its HIP calls keep their HIP "
        "operation ids under the HSA tracing kind. Times are simulated "
        "nanoseconds; the metrics come from what the simulator counted and how the cost model "
        "priced the kernel, under each family's metric names and units.",
        [Table("callbacks and activity records, per family",
               ["family", "interface", "callbacks at the launch", "activity kinds received"],
               [[r["family"], r["api"], " → ".join(r["calls"]), ", ".join(r["kinds"])] for r in rows]),
         Table("the kernel's record and what its correlation id links to",
               ["family", "kernel", "simulated duration", "correlation", "API records with that id",
                *(f"metric {i + 1}" for i in range(len(METRICS)))],
               [[r["family"], r["kernel"][0], f"{r['kernel'][1]} ns ({r['fields'][1]} - {r['fields'][0]})",
                 f"{r['fields'][2]} = {r['kernel'][2]}",
                 ", ".join(r["linked"]), *(f"{name} = {value}" for name, value in r["metrics"])]
                for r in rows])])
