"""``fornax serve``: continuous-batching inference of a decoder on a composed stack.

Requests come from a seeded Poisson arrival trace (``--requests``, ``--rate``,
``--prompt-len``, ``--output-len``, ``--shared-prefix``, ``--seed``) or a JSONL file
(``--trace``); the engine (:mod:`fornax.serving`) serves them on the simulated device and
prints latency percentiles, throughput, KV-block utilisation and the capacity model, or
the ``fornax.serve/1`` document with ``--json``.  ``--plot FILE`` serves the same trace at
several arrival rates and draws latency against load.
"""

from __future__ import annotations

import json
import math

import click
from rich.console import Console

from ..layers.errors import ConfigError
from ..stack import parse_seam_overrides, runnable_vendors
from .errors import debug_option, handle_errors


def _range(text: str, what: str) -> tuple[int, int]:
    """``A:B`` (inclusive) or ``N`` (A = B = N), positive whole numbers."""
    parts = str(text).split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (0, -1)
    except ValueError:
        lo, hi = 0, -1
    if lo <= 0 or hi < lo:
        raise ConfigError(f"{what} must be N or A:B with 0 < A <= B, got {text!r}")
    return lo, hi


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        rates = []
    if not rates or any(not (r > 0) or math.isinf(r) for r in rates):
        raise ConfigError(f"--plot-rates must be positive finite numbers separated by commas, got {text!r}")
    return rates


@click.command(name="serve")
@click.option("--vendor", metavar="V", help=f"Set all five seams to vendor V ({', '.join(runnable_vendors())}).")
@click.option("--seam", "seams", multiple=True, metavar="SEAM=V", help="Override one seam (repeatable).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Stack config TOML.")
@click.option("--spec", default=None, metavar="NAME", help="Chip spec (see `fornax specs`).")
@click.option("--model", default="llama", show_default=True, metavar="NAME",
              help="The decoder served: llama or gpt2 (transformers models from small configs).")
@click.option("--decoder", default="torch", show_default=True, metavar="KIND",
              help="How the model runs: torch (its transformers modules op by op on "
                   "torch.device('fornax')) or graph (fornax's own graph decoder: whole graphs "
                   "compiled by the stack; llama only).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Requests from a JSONL file ({\"prompt\": [...], \"max_new_tokens\": N, "
                   "\"arrival\": seconds, \"id\": ...} per line) instead of a generated trace.")
@click.option("--requests", "n_requests", type=int, default=16, show_default=True, help="Requests in the generated trace.")
@click.option("--rate", type=float, default=50.0, show_default=True,
              help="Mean arrivals per simulated second (Poisson); inf: all at once.")
@click.option("--prompt-len", default="8:48", show_default=True, metavar="A:B", help="Prompt lengths (uniform).")
@click.option("--output-len", default="4:16", show_default=True, metavar="A:B", help="New tokens per request (uniform).")
@click.option("--shared-prefix", type=int, default=0, show_default=True,
              help="Tokens every generated prompt starts with (exercises prefix sharing).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the generated trace.")
@click.option("--num-blocks", type=int, default=128, show_default=True, help="Device KV-cache blocks.")
@click.option("--block-size", type=int, default=16, show_default=True, help="Tokens per KV block.")
@click.option("--host-blocks", type=int, default=64, show_default=True, help="Host swap space, in blocks.")
@click.option("--max-num-seqs", type=int, default=16, show_default=True, help="Sequences per step.")
@click.option("--max-batched-tokens", type=int, default=256, show_default=True, help="Tokens per step.")
@click.option("--no-chunked-prefill", is_flag=True, default=False, help="Prefill each prompt whole in one step.")
@click.option("--preemption", default="recompute", show_default=True, metavar="MODE",
              help="When blocks run out: recompute or swap.")
@click.option("--no-prefix-caching", is_flag=True, default=False, help="Do not share cached prompt blocks.")
@click.option("--capacity-len", type=int, default=4096, show_default=True,
              help="Sequence length the capacity model answers for.")
@click.option("--json", "as_json", is_flag=True, help="Print only the fornax.serve/1 document.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Serve the trace at several rates (--plot-rates) and plot latency vs load to FILE (PNG).")
@click.option("--plot-rates", default=None, metavar="R,R,...",
              help="Arrival rates for --plot (default: the rate x 1/4, 1/2, 1, 2, 4).")
@debug_option
@handle_errors
def serve_cmd(vendor, seams, config_path, spec, model, decoder, trace_path, n_requests, rate, prompt_len,
              output_len, shared_prefix, seed, num_blocks, block_size, host_blocks, max_num_seqs,
              max_batched_tokens, no_chunked_prefill, preemption, no_prefix_caching, capacity_len,
              as_json, plot_path, plot_rates, debug):
    """Serve a decoder with continuous batching over a paged KV cache, and report latency,
    throughput, KV-block utilisation and capacity."""
    from pathlib import Path

    from .. import serving
    if config_path is None and vendor is None and not seams:
        raise ConfigError("no stack given: use --vendor V, --seam SEAM=V for every seam, or --config FILE")
    # what can be checked before anything runs
    if capacity_len <= 0:
        raise ConfigError(f"--capacity-len must be a positive number of tokens, got {capacity_len}")
    if plot_path:
        if trace_path:
            raise ConfigError("--plot serves a generated trace at several rates; it cannot re-time --trace")
        if not Path(plot_path).parent.is_dir():
            raise ConfigError(f"--plot {plot_path}: folder {Path(plot_path).parent} does not exist")
        rates = _rates(plot_rates) if plot_rates else [rate * f for f in (0.25, 0.5, 1.0, 2.0, 4.0)]
    import fornax.frameworks.torch as ft
    ft.use_stack(vendor, config=config_path, spec=spec, seams=parse_seam_overrides(seams) or None)
    sched = serving.SchedulerConfig(max_num_seqs=max_num_seqs, max_batched_tokens=max_batched_tokens,
                                    chunked_prefill=not no_chunked_prefill, preemption=preemption)
    cfg = serving.ServeConfig(model=model, decoder=decoder, num_blocks=num_blocks, block_size=block_size,
                              host_blocks=host_blocks, prefix_caching=not no_prefix_caching,
                              scheduler=sched)
    engine = serving.Engine(cfg)        # the first run's engine: its model names the vocabulary
    vocab = engine.model.shape.vocab

    def requests(at_rate: float):
        if trace_path:
            return serving.load_jsonl(trace_path, vocab)
        spec_ = serving.TraceSpec(requests=n_requests, rate=at_rate,
                                  prompt_len=_range(prompt_len, "--prompt-len"),
                                  output_len=_range(output_len, "--output-len"),
                                  shared_prefix=shared_prefix, seed=seed)
        return serving.poisson_trace(spec_, vocab)

    result = engine.run(requests(rate))
    doc = serving.document(result, serving.capacity_rows(result, capacity_len))
    if plot_path:
        points = [(r, serving.latencies(serving.serve(requests(r), cfg))) for r in rates]
        serving.plot_load(points, plot_path, f"{model} on {result.vendor} / {result.spec}")
        doc["load_sweep"] = [{"rate": r, **lat} for r, lat in points]
    if as_json:
        click.echo(json.dumps(doc))
        return
    console = Console()
    serving.render(doc, console)
    if plot_path:
        console.print(f"latency vs load: {plot_path}")
