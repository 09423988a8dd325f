"""The serving report: latency percentiles, throughput, KV-block utilisation over time and
the capacity model, as a ``fornax.serve/1`` document (``fornax/schemas/serve.schema.json``)
and as rich tables.

Latencies are simulated seconds on the engine's clock (:mod:`.engine`):

* time to first token (TTFT): first generated token minus arrival;
* time per output token (TPOT): (last token minus first token) / (tokens - 1), per request
  with at least two tokens;
* end-to-end latency: last token minus arrival.

Percentiles are numpy's linear interpolation over the requests.  Throughput is generated
tokens (and prompt tokens) per simulated second of the run's makespan.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from ..report import fmt_bytes, fmt_time
from .capacity import Capacity
from .engine import ServeResult

SCHEMA = "fornax.serve/1"
PERCENTILES = (50, 90, 99)


def _pcts(values: list[float]) -> dict[str, float]:
    if not values:
        return {f"p{p}": 0.0 for p in PERCENTILES} | {"mean": 0.0}
    arr = np.asarray(values, dtype=np.float64)
    return {f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES} | {"mean": float(arr.mean())}


def latencies(result: ServeResult) -> dict[str, dict[str, float]]:
    """TTFT, TPOT and end-to-end percentiles (simulated seconds)."""
    ttft, tpot, e2e = [], [], []
    for s in result.sequences:
        arrival = s.request.arrival
        if s.first_token_at is not None:
            ttft.append(s.first_token_at - arrival)
        if len(s.token_times) > 1:
            tpot.append((s.token_times[-1] - s.token_times[0]) / (len(s.token_times) - 1))
        if s.finished_at is not None:
            e2e.append(s.finished_at - arrival)
    return {"ttft_s": _pcts(ttft), "tpot_s": _pcts(tpot), "e2e_s": _pcts(e2e)}


def document(result: ServeResult, capacities: list[Capacity] | None = None) -> dict[str, Any]:
    """The ``fornax.serve/1`` document of a run."""
    gen = sum(len(s.generated) for s in result.sequences)
    prompt = sum(s.prompt_len for s in result.sequences)
    span = result.makespan
    util = [st.kv_utilisation for st in result.steps]
    return {
        "schema": SCHEMA,
        "vendor": result.vendor,
        "spec": result.spec,
        "model": result.config.model,
        "decoder": result.config.decoder,
        "model_shape": result.model_shape,
        "config": {"num_blocks": result.config.num_blocks, "block_size": result.config.block_size,
                   "host_blocks": result.config.host_blocks,
                   "prefix_caching": result.config.prefix_caching,
                   "max_num_seqs": result.config.scheduler.max_num_seqs,
                   "max_batched_tokens": result.config.scheduler.max_batched_tokens,
                   "chunked_prefill": result.config.scheduler.chunked_prefill,
                   "preemption": result.config.scheduler.preemption},
        "requests": len(result.sequences),
        "tokens": {"prompt": prompt, "generated": gen},
        "makespan_s": span,
        "device_time_s": result.device_time,
        "host_wall_s": result.host_wall_s,
        "throughput": {"generated_tokens_per_s": gen / span if span > 0 else 0.0,
                       "total_tokens_per_s": (gen + prompt) / span if span > 0 else 0.0,
                       "requests_per_s": len(result.sequences) / span if span > 0 else 0.0},
        "latency": latencies(result),
        "kv_cache": {"bytes": result.cache_bytes,
                     "utilisation": {"mean": float(np.mean(util)) if util else 0.0,
                                     "max": float(np.max(util)) if util else 0.0},
                     "timeline": [[st.end, st.kv_utilisation] for st in result.steps],
                     **result.block_counts},
        "scheduler": result.scheduler_counts,
        "steps": [{"start_s": st.start, "end_s": st.end, "prefill_tokens": st.prefill_tokens,
                   "decode_tokens": st.decode_tokens, "sequences": st.sequences,
                   "kv_utilisation": st.kv_utilisation, "preempted": st.preempted}
                  for st in result.steps],
        "outputs": result.outputs(),
        "capacity": [c.to_dict() for c in capacities or []],
    }


def render(doc: dict[str, Any], console: Console) -> None:
    """The document as tables."""
    head = Table(title=f"fornax serve: {doc['model']} ({doc['decoder']} decoder) on {doc['vendor']} / {doc['spec']} "
                       f"({doc['requests']} requests)")
    head.add_column("figure")
    head.add_column("value", justify="right")
    tp = doc["throughput"]
    head.add_row("makespan (simulated)", fmt_time(doc["makespan_s"]))
    head.add_row("generated tokens / s", f"{tp['generated_tokens_per_s']:.1f}")
    head.add_row("requests / s", f"{tp['requests_per_s']:.2f}")
    head.add_row("prompt / generated tokens", f"{doc['tokens']['prompt']} / {doc['tokens']['generated']}")
    kv = doc["kv_cache"]
    head.add_row("KV cache", f"{doc['config']['num_blocks']} blocks of {doc['config']['block_size']} "
                             f"tokens, {fmt_bytes(kv['bytes'])}")
    head.add_row("KV-block utilisation (mean / max)",
                 f"{kv['utilisation']['mean']:.0%} / {kv['utilisation']['max']:.0%}")
    sch = doc["scheduler"]
    head.add_row("steps", str(sch.get("steps", len(doc["steps"]))))
    head.add_row("preemptions (recompute / swap)",
                 f"{sch.get('preemptions', 0)} / {sch.get('swaps', 0)}")
    head.add_row("prefix-cache hit tokens", str(sch.get("prefix_hit_tokens", 0)))
    head.add_row("host wall time", fmt_time(doc["host_wall_s"]))
    console.print(head)
    lat = Table(title="latency (simulated)")
    lat.add_column("metric")
    for p in (*(f"p{p}" for p in PERCENTILES), "mean"):
        lat.add_column(p, justify="right")
    for key, label in (("ttft_s", "time to first token"), ("tpot_s", "time per output token"),
                       ("e2e_s", "end to end")):
        row = doc["latency"][key]
        lat.add_row(label, *(fmt_time(row[p]) for p in (*(f"p{p}" for p in PERCENTILES), "mean")))
    console.print(lat)
    if doc["capacity"]:
        console.print(capacity_table(doc["capacity"]))


def capacity_table(rows: list[dict[str, Any]], title: str = "capacity model") -> Table:
    t = Table(title=title)
    for col in ("model", "spec", "tp", "HBM", "weights", "KV cache", "seq len", "sequences"):
        t.add_column(col, justify="left" if col in ("model", "spec") else "right")
    for c in rows:
        t.add_row(str(c.get("model", "")), c["spec"], str(c["tp"]), fmt_bytes(c["hbm_bytes"]),
                  fmt_bytes(c["weight_bytes"]), fmt_bytes(c["kv_bytes"]), str(c["seq_len"]),
                  str(c["max_sequences"]))
    return t


def capacity_rows(result: ServeResult, seq_len: int) -> list[Capacity]:
    """The capacity model for the served model on the run's chip, and for the reference
    decoder shapes on every shipped data-centre spec (the same model on chips that differ in
    HBM gives different answers)."""
    from ..sim.spec import available_specs, load_spec
    from .capacity import REFERENCE_SHAPES, capacity
    from .models import DecoderShape

    served = DecoderShape(**result.model_shape)
    rows = [capacity(served, result.chip, seq_len,
                     block_size=result.config.block_size,
                     max_batched_tokens=result.config.scheduler.max_batched_tokens,
                     model=result.config.model)]
    for name, shape in REFERENCE_SHAPES.items():
        for spec in available_specs():
            if spec == "tiny":
                continue
            rows.append(capacity(shape, load_spec(spec), seq_len, model=name))
    return rows
