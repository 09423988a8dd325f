"""Lab 9: training, inference and media engines -- where the common platform branches.

Experiments: a burst of requests served with continuous batching on each family (latency
and throughput on the simulated clock), the capacity model across chips that differ in
HBM, and the video pipeline whose decode runs on fixed-function engines beside the
compute engine.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from .lab import Exercise, Lab, Section, Table, figure, number_fact, text_fact

FAMILIES = ("cuda-like", "rocm-like", "xpu-like")
CHIPS = ("h100-like", "h200-like", "mi300x-like", "max1550-like")
SEQ_LEN = 4096


@lru_cache(maxsize=1)
def _serve_rows() -> tuple[tuple[str, float, float, float, int], ...]:
    import fornax.frameworks.torch as ft
    from fornax import serving
    trace = serving.poisson_trace(serving.TraceSpec(requests=4, rate=float("inf"), prompt_len=(16, 32),
                                                    output_len=(4, 6), seed=9), vocab=256)
    rows = []
    for vendor in FAMILIES:
        ft.use_stack(vendor)
        res = serving.serve(trace, serving.ServeConfig(num_blocks=64))
        lat = serving.latencies(res)
        gen = sum(len(s.generated) for s in res.sequences)
        rows.append((vendor, lat["ttft_s"]["p50"], lat["tpot_s"]["p50"], gen / res.makespan, len(res.steps)))
    return tuple(rows)


def _capacity() -> dict[str, int]:
    from fornax import serving
    from fornax.sim.spec import load_spec
    shape = serving.REFERENCE_SHAPES["llama-8b-like"]
    return {chip: serving.capacity(shape, load_spec(chip), SEQ_LEN).max_sequences for chip in CHIPS}


@lru_cache(maxsize=1)
def _media() -> tuple[tuple[str, float, str], ...]:
    from fornax.scenarios.media import run_media
    rows = []
    for vendor in FAMILIES:
        rep, _ = run_media(vendor, "tiny", frames=6)
        rows.append((vendor, float(rep["frames_per_s"]), str(rep["bottleneck"])))
    return tuple(rows)


def experiments(out: Path) -> list[Section]:
    serve = _serve_rows()
    cap = _capacity()
    media = _media()
    sections = [
        Section("Serving: one burst, three families",
                "Four requests arrive at once; the engine prefills them, then decodes them together "
                "(`fornax serve`, the llama decoder, 64 KV blocks of 16 tokens). Latencies are "
                "simulated time on the engine's clock: a step lasts the device time of its kernels.",
                [Table("served on each family", ["family", "TTFT p50", "TPOT p50", "tokens / s", "steps"],
                       [[v, f"{t * 1e6:.0f} µs", f"{p * 1e6:.0f} µs", f"{r:.0f}", str(n)]
                        for v, t, p, r, n in serve])]),
        Section("Capacity: the same model on chips with different HBM",
                f"How many {SEQ_LEN}-token sequences of an 8B-class grouped-query decoder (bfloat16) "
                "fit next to its weights, per chip spec (`fornax.serving.capacity`): compute is not in "
                "the formula, HBM is.",
                [Table("sequences resident at once", ["chip", "sequences"],
                       [[c, str(n)] for c, n in cap.items()])], ["capacity.png"]),
        Section("Media engines: decode beside compute",
                "Motion-JPEG frames decode on the chip's media engines while a CNN runs on the compute "
                "engine (`fornax media`, the tiny spec, 6 frames of 64x48); the slower of the two sets "
                "the frame rate.",
                [Table("video pipeline", ["family", "frames / s", "bottleneck"],
                       [[v, f"{f:.0f}", b] for v, f, b in media])]),
    ]
    _picture(cap, out / "capacity.png")
    return sections


def _picture(cap: dict[str, int], path: Path) -> None:
    fig = figure(6, 3.2)
    ax = fig.subplots()
    ax.bar(list(cap), list(cap.values()), color=[f"C{i}" for i in range(len(cap))])
    ax.set_ylabel(f"{SEQ_LEN}-token sequences")
    ax.set_title("llama-8b-like: KV capacity per chip")
    fig.savefig(path, format="png", dpi=90)


def facts() -> dict[str, Any]:
    cap = _capacity()
    media = {v: b for v, _, b in _media()}
    return {"h200_sequences": cap["h200-like"], "most_capacity": max(cap, key=lambda c: cap[c]),
            "swap": "swap", "media_bottleneck": media["cuda-like"]}


LAB = Lab(
    number=9, slug="09-serving-and-media", title="Training, inference and media engines", part="Part 9",
    goal="See where the platform branches: serve a decoder with continuous batching and a paged KV "
         "cache, size the cache from a chip's HBM, and run decode on fixed-function engines beside "
         "the compute engine.",
    minutes=30, experiments=experiments, facts=facts,
    exercises=[
        Exercise("9.1", f"How many {SEQ_LEN}-token sequences of llama-8b-like fit at once on an h200-like "
                 "chip (the capacity model's answer)?", number_fact("9.1", "h200_sequences"),
                 "fornax/serving/capacity.py: HBM x 0.9 - weights - activation reserve, cut into blocks"),
        Exercise("9.2", "Which shipped chip spec holds the most such sequences?",
                 text_fact("9.2", "most_capacity"), "the specs' hbm_bytes (fornax specs)"),
        Exercise("9.3", "Which preemption mode keeps a preempted sequence's K/V by copying its blocks to "
                 "host memory?", text_fact("9.3", "swap"), "fornax/serving/scheduler.py (preemption)"),
        Exercise("9.4", "On the tiny spec, what limits the cuda-like video pipeline's frame rate "
                 "(fornax media's bottleneck)?", text_fact("9.4", "media_bottleneck"),
                 "the [media] table of fornax/sim/specs/tiny.toml against the CNN's device time"),
    ])
